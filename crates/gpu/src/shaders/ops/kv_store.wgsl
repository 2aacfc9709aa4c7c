// The keys and values of `tokens` rows stored in one layer's cache at positions pos0.., as
// pairs of halves (the CPU's F16 cache; `pack2x16float` needs no f16 feature).

struct P {
    tokens: u32,
    // kv_dim / 2: words per position.
    words: u32,
    pos0: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> cache_k: array<u32>;
@group(0) @binding(3) var<storage, read_write> cache_v: array<u32>;
@group(0) @binding(4) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let t = gid.y;
    if j >= p.words || t >= p.tokens {
        return;
    }
    let src = t * 2u * p.words + 2u * j;
    let dst = (p.pos0 + t) * p.words + j;
    cache_k[dst] = pack2x16float(vec2(k[src], k[src + 1u]));
    cache_v[dst] = pack2x16float(vec2(v[src], v[src + 1u]));
}
