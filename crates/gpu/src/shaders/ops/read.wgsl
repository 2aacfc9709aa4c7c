// The device's read bandwidth: each thread sums a strided walk over `src` (16-byte loads,
// consecutive threads on consecutive vectors) and writes one value, so that the loads are
// not optimized away.

struct P {
    // vec4s in `src`.
    n: u32,
    // Threads in the grid.
    threads: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    var acc = vec4(0.0);
    for (var i = t; i < p.n; i += p.threads) {
        acc += src[i];
    }
    sink[t] = acc.x + acc.y + acc.z + acc.w;
}
