// The element-wise steps of a layer, one thread per element; `n` elements, rows of `width`.

struct P {
    n: u32,
    width: u32,
    scale: f32,
    _pad: u32,
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

// GEGLU with the tanh GELU: x = gelu(x) * y.
@compute @workgroup_size(256)
fn geglu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = index(wg, li);
    if i < p.n {
        let g = x[i];
        let inner = 0.7978845608 * (g + 0.044715 * g * g * g);
        x[i] = 0.5 * g * (1.0 + tanh(inner)) * y[i];
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
