// Q5_K: | d | dmin | scales[12] | qh[32] | qs[128] |: Q4_K's nibbles (and lanes), plus bit
// 2j (low nibble) or 2j + 1 (high nibble) of qh[l] for value 64j + 32h' + l.
const BLOCK_BYTES: u32 = 176u;

fn run_base(lane: u32, q: u32) -> u32 {
    return 64u * (lane / 2u) + 16u * (lane % 2u) + 32u * (q / 2u) + 8u * (q % 2u);
}

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let j = lane / 2u;
    let sm = k_lane_scales(b, lane);
    let dl = sm.x;
    let ml = sm.y;
    let dh = sm.z;
    let mh = sm.w;
    let qo = b + 48u + 32u * j + 16u * (lane % 2u);
    let ho = b + 16u + 16u * (lane % 2u);
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(qo + 4u * i);
        let hw = u32_at(ho + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let byte = (word >> (8u * k)) & 0xffu;
            let hb = (hw >> (8u * k)) & 0xffu;
            let ql = (byte & 0xfu) | (((hb >> (2u * j)) & 1u) << 4u);
            let qh = (byte >> 4u) | (((hb >> (2u * j + 1u)) & 1u) << 4u);
            v[4u * i + k] = fma(dl, f32(ql), -ml);
            v[16u + 4u * i + k] = fma(dh, f32(qh), -mh);
        }
    }
    return v;
}
