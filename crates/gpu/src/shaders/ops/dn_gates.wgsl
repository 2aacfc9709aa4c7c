// The gated delta net's gates (Qwen 3.5), per (token, value head), as the engine's
// `qwen35.rs` computes them: beta = sigmoid(beta); g = softplus(alpha + dt_bias) * a.

@group(0) @binding(0) var<storage, read_write> gate_beta: array<f32>;
@group(0) @binding(1) var<storage, read_write> gate_g: array<f32>;
@group(0) @binding(2) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(3) var<storage, read> decay_a: array<f32>;
@group(0) @binding(4) var<uniform> pg: P;

@compute @workgroup_size(64)
fn gates(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if i >= pg.tokens * pg.h_v {
        return;
    }
    let h = i % pg.h_v;
    gate_beta[i] = 1.0 / (1.0 + exp(-gate_beta[i]));
    let x = gate_g[i] + dt_bias[h];
    var sp = x;
    if x <= 20.0 {
        sp = log(1.0 + exp(x));
    }
    gate_g[i] = sp * decay_a[h];
}
