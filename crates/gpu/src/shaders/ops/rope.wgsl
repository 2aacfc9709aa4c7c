// RoPE of `tokens` rows of `heads` heads at positions pos0.., with the angles' cosines and
// sines computed on the host (the engine's `Rope::angles`, so that they are the CPU's
// bits): `table[pos * half + i]`. One thread per (token, head, pair).

struct P {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    half: u32,
    pos0: u32,
    // 0: adjacent pairs (2i, 2i + 1); 1: NeoX's (i, i + half).
    neox: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let head = gid.y;
    let t = gid.z;
    if i >= p.half || head >= p.heads || t >= p.tokens {
        return;
    }
    let cs = table[(p.pos0 + t) * p.half + i];
    let base = (t * p.heads + head) * p.head_dim;
    var a = base + 2u * i;
    var b = a + 1u;
    if p.neox == 1u {
        a = base + i;
        b = base + i + p.half;
    }
    let x0 = x[a];
    let x1 = x[b];
    x[a] = fma(x0, cs.x, -(x1 * cs.y));
    x[b] = fma(x0, cs.y, x1 * cs.x);
}
