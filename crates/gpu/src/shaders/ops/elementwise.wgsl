// The element-wise steps of a layer, one thread per element; `n` elements, rows of `width`.

struct P {
    n: u32,
    width: u32,
    scale: f32,
    // The first row's position (scale_rows).
    pos0: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

fn index(wg: vec3<u32>, li: u32) -> u32 {
    return (wg.x + wg.y * 65535u) * 256u + li;
}

// The residual: x += y * scale.
@compute @workgroup_size(256)
fn add_scaled(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        x[i] = x[i] + y[i] * p.scale;
    }
}

// A bias of `width` values on every row.
@compute @workgroup_size(256)
fn add_bias(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        x[i] = x[i] + y[i % p.width];
    }
}

// SwiGLU: x = silu(x) * y.
@compute @workgroup_size(256)
fn swiglu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        let g = x[i];
        x[i] = g / (1.0 + exp(-g)) * y[i];
    }
}

fn f16_round(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2(v, 0.0))).x;
}

// GEGLU as ggml-cpu computes it (the CPU path's bits, but for tanh's last place): x = gelu(x) *
// y with the tanh GELU of x rounded to F16, rounded to F16; 0 at and below -10, x above 10.
@compute @workgroup_size(256)
fn geglu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        let g = x[i];
        var act = 0.0;
        if g >= 10.0 {
            act = g;
        } else if g > -10.0 {
            let h = f16_round(g);
            let inner = fma(0.044715 * h, h, 1.0);
            act = f16_round((0.5 * h) * (1.0 + tanh((0.7978846 * h) * inner)));
        }
        x[i] = act * y[i];
    }
}

// x *= scale (y is not read).
@compute @workgroup_size(256)
fn scale(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        x[i] = x[i] * p.scale;
    }
}

// Each row times its position's factor: x[i] *= y[pos0 + row] (Mistral 3's attention
// temperature, from a table of every position's).
@compute @workgroup_size(256)
fn scale_rows(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        x[i] = x[i] * y[p.pos0 + i / p.width];
    }
}

// A gated attention's queries (Qwen 3.5): each head's first half of `y`'s (query, gate) pair;
// width is the head's values.
@compute @workgroup_size(256)
fn take_query(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        x[i] = y[(i / p.width) * 2u * p.width + i % p.width];
    }
}

// A gated attention's output times the sigmoid of each head's gate, the pair's second half.
@compute @workgroup_size(256)
fn sigmoid_gate(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        let gate = y[(i / p.width) * 2u * p.width + p.width + i % p.width];
        x[i] = x[i] * (1.0 / (1.0 + exp(-gate)));
    }
}
