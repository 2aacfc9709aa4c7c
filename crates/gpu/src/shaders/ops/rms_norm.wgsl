// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one workgroup per row of `width` values.
// In place, x is overwritten (the per-head norms of queries and keys). Rows come in groups of
// `per` a `stride` apart (the heads of each token's row; `per` 1 and `stride` width: plain rows).

struct P {
    width: u32,
    rows: u32,
    eps: f32,
    per: u32,
    stride: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.x + wg.y * 65535u;
    if row >= p.rows {
        return;
    }
    let base = (row / p.per) * p.stride + (row % p.per) * p.width;
    var acc = 0.0;
    for (var i = li; i < p.width; i += 64u) {
        acc = fma(x[base + i], x[base + i], acc);
    }
    red[li] = acc;
    let sum = tree_sum(li);
    let scale = 1.0 / sqrt(sum / f32(p.width) + p.eps);
    for (var i = li; i < p.width; i += 64u) {
        OUT[base + i] = (x[base + i] * scale) * w[i];
    }
}
