// y[t][r] = dot(W[r], x[t]) for a tile of TOKENS tokens and 2 * ROWS rows per workgroup.
//
// The format's file (prepended) gives, for the 256 values of step `s` of a row, what lane
// `lane` (0..8) of a cohort owns: `decode` its 32 weights as floats, `run_base` where its four
// runs of 8 values start, `lane_valid` whether it owns any. Each row is 32 threads, four cohorts
// of 8 lanes, cohort c taking steps c, c + 4, ...; a thread sums its values in a fixed order,
// every product an explicit `fma`, and the 32 partial sums meet in one fixed tree in workgroup
// memory. So every output's arithmetic depends only on its row and its token: not on TOKENS,
// ROWS, the subgroup width or the workgroup's other rows, which is G1 and run-to-run identity.

const TOKENS: u32 = {{TOKENS}}u;
const ROWS: u32 = {{ROWS}}u;
const TILE: u32 = ROWS * TOKENS;

struct Params {
    rows: u32,
    cols: u32,
    tokens: u32,
    row_bytes: u32,
    // Steps of 256 values per row, and lanes of 32 values (the 32-value formats' blocks).
    steps: u32,
    lanes: u32,
    // Workgroups along x: a grid of more rows than one dimension holds folds into z.
    groups_x: u32,
    // A matrix larger than one binding is bound in parts of rows: this part's first row in
    // the whole, and the whole's rows (the stride of y).
    row_base: u32,
    out_rows: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> part: array<f32, 64u * TILE>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let team = li / 32u;
    let tl = li % 32u;
    let cohort = tl / 8u;
    let lane = tl % 8u;
    let row0 = ((wg.x + wg.z * p.groups_x) * 2u + team) * ROWS;
    let t0 = wg.y * TOKENS;

    var acc: array<f32, TILE>;
    for (var s = cohort; s < p.steps; s += 4u) {
        if !lane_valid(s, lane) {
            continue;
        }
        for (var r = 0u; r < ROWS; r++) {
            let row = row0 + r;
            if row >= p.rows {
                break;
            }
            let wv = decode(row * p.row_bytes, s, lane);
            for (var t = 0u; t < TOKENS; t++) {
                if t0 + t >= p.tokens {
                    break;
                }
                let xo = (t0 + t) * p.cols + s * 256u;
                var a = acc[r * TOKENS + t];
                for (var q = 0u; q < 4u; q++) {
                    let xi = (xo + run_base(lane, q)) >> 2u;
                    let x0 = x[xi];
                    let x1 = x[xi + 1u];
                    let k = 8u * q;
                    a = fma(x0.x, wv[k], a);
                    a = fma(x0.y, wv[k + 1u], a);
                    a = fma(x0.z, wv[k + 2u], a);
                    a = fma(x0.w, wv[k + 3u], a);
                    a = fma(x1.x, wv[k + 4u], a);
                    a = fma(x1.y, wv[k + 5u], a);
                    a = fma(x1.z, wv[k + 6u], a);
                    a = fma(x1.w, wv[k + 7u], a);
                }
                acc[r * TOKENS + t] = a;
            }
        }
    }

    let base = team * TILE * 32u;
    for (var k = 0u; k < TILE; k++) {
        part[base + k * 32u + tl] = acc[k];
    }
    workgroupBarrier();
    for (var stride = 16u; stride > 0u; stride >>= 1u) {
        if tl < stride {
            for (var k = 0u; k < TILE; k++) {
                let i = base + k * 32u + tl;
                part[i] = part[i] + part[i + stride];
            }
        }
        workgroupBarrier();
    }
    for (var k = tl; k < TILE; k += 32u) {
        let row = row0 + k / TOKENS;
        let t = t0 + k % TOKENS;
        if row < p.rows && t < p.tokens {
            y[t * p.out_rows + p.row_base + row] = part[base + k * 32u];
        }
    }
}
