// The delta net's causal convolution with its carried state, then SiLU: one thread per
// channel, the batch's tokens in order. state holds each channel's last d_conv - 1 inputs.

@group(0) @binding(0) var<storage, read> mixed: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: P;

const MAX_TAPS: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if c >= p.conv_dim {
        return;
    }
    let k = p.d_conv - 1u;
    var win: array<f32, MAX_TAPS>;
    for (var j = 0u; j < k; j++) {
        win[j] = state[c * k + j];
    }
    for (var t = 0u; t < p.tokens; t++) {
        let x = mixed[t * p.conv_dim + c];
        var sum = 0.0;
        for (var j = 0u; j < k; j++) {
            sum = fma(win[j], w[c * p.d_conv + j], sum);
        }
        let y = fma(x, w[c * p.d_conv + k], sum);
        out[t * p.conv_dim + c] = y / (1.0 + exp(-y));
        for (var j = 0u; j + 1u < k; j++) {
            win[j] = win[j + 1u];
        }
        if k > 0u {
            win[k - 1u] = x;
        }
    }
    for (var j = 0u; j < k; j++) {
        state[c * k + j] = win[j];
    }
}
