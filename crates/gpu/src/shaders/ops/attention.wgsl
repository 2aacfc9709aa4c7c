// Causal attention of `tokens` queries at positions pos0.. over one layer's F16 cache: one
// workgroup per (head, token). Positions go in chunks of 64, one per thread, with a running
// maximum and sum (the online softmax); each chunk's maximum and sum are fixed trees, and
// each output dimension sums its chunk's positions in order. The chunks are fixed by the
// positions alone, so a query's bits do not depend on the batch it came in (G1).

struct P {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    pos0: u32,
    // kv_dim / 2: words per cached position.
    words: u32,
    // Attend to positions past pos - window only (0: all).
    window: u32,
    scale: f32,
    // Gemma 2's soft cap of the scores (0: none): s = cap * tanh(s / cap), scale divided already.
    softcap: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> cache_k: array<u32>;
@group(0) @binding(2) var<storage, read> cache_v: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: P;

const MAX_HEAD: u32 = 512u;
const PER_THREAD: u32 = MAX_HEAD / 64u;

var<workgroup> qs: array<f32, MAX_HEAD>;
var<workgroup> e: array<f32, 64>;

fn half_at(buf_word: u32, d: u32) -> f32 {
    let pair = unpack2x16float(buf_word);
    return select(pair.x, pair.y, (d & 1u) == 1u);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let hd = p.head_dim;
    let pos = p.pos0 + t;
    var first = 0u;
    if p.window > 0u && pos + 1u > p.window {
        first = pos + 1u - p.window;
    }
    let kvh = h / (p.n_head / p.n_head_kv);
    let qo = (t * p.n_head + h) * hd;
    let kv_off = kvh * hd / 2u;
    for (var d = li; d < hd; d += 64u) {
        qs[d] = q[qo + d];
    }
    workgroupBarrier();

    var m = -3.0e38;
    var l = 0.0;
    var o: array<f32, PER_THREAD>;
    for (var c0 = first; c0 <= pos; c0 += 64u) {
        let pp = c0 + li;
        var s = -3.0e38;
        if pp <= pos {
            let ko = pp * p.words + kv_off;
            var acc = 0.0;
            for (var d2 = 0u; d2 < hd / 2u; d2++) {
                let kk = unpack2x16float(cache_k[ko + d2]);
                acc = fma(qs[2u * d2], kk.x, acc);
                acc = fma(qs[2u * d2 + 1u], kk.y, acc);
            }
            s = acc * p.scale;
            if p.softcap > 0.0 {
                s = p.softcap * tanh(s);
            }
        }
        red[li] = s;
        let mn = max(m, tree_max(li));
        let alpha = exp(m - mn);
        var ex = 0.0;
        if pp <= pos {
            ex = exp(s - mn);
        }
        e[li] = ex;
        red[li] = ex;
        let se = tree_sum(li);
        l = l * alpha + se;
        let count = min(64u, pos + 1u - c0);
        for (var k = 0u; k < PER_THREAD; k++) {
            let d = li + 64u * k;
            if d < hd {
                var acc = o[k] * alpha;
                for (var j = 0u; j < count; j++) {
                    let vw = cache_v[(c0 + j) * p.words + kv_off + d / 2u];
                    acc = fma(e[j], half_at(vw, d), acc);
                }
                o[k] = acc;
            }
        }
        m = mn;
        workgroupBarrier();
    }
    for (var k = 0u; k < PER_THREAD; k++) {
        let d = li + 64u * k;
        if d < hd {
            out[qo + d] = o[k] / l;
        }
    }
}
