// The gated delta rule, one thread per (value head h, value row j), the batch's tokens in
// order: S_j *= exp(g); d = (v_j - S_j . k) * beta; S_j += k * d; o_j = (S_j . q) / sqrt(hd),
// with q, k those of key head h % h_k (L2-normed already) and S_j row j of the head's
// hd x hd state. Every row is its own: nothing is summed across threads.

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> beta: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> core: array<f32>;
@group(0) @binding(5) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let h = gid.y;
    if j >= p.hd || h >= p.h_v {
        return;
    }
    let hd = p.hd;
    let key_dim = p.h_k * hd;
    let kh = h % p.h_k;
    let row = (h * hd + j) * hd;
    let scale = 1.0 / sqrt(f32(hd));
    for (var t = 0u; t < p.tokens; t++) {
        let base = t * p.conv_dim;
        let q0 = base + kh * hd;
        let k0 = base + key_dim + kh * hd;
        let v = qkv[base + 2u * key_dim + h * hd + j];
        let decay = exp(g[t * p.h_v + h]);
        var sk = 0.0;
        for (var i = 0u; i < hd; i++) {
            let s = state[row + i] * decay;
            state[row + i] = s;
            sk = fma(s, qkv[k0 + i], sk);
        }
        let d = (v - sk) * beta[t * p.h_v + h];
        var o = 0.0;
        for (var i = 0u; i < hd; i++) {
            let s = fma(qkv[k0 + i], d, state[row + i]);
            state[row + i] = s;
            o = fma(s, qkv[q0 + i], o);
        }
        core[t * p.h_v * hd + h * hd + j] = o * scale;
    }
}
