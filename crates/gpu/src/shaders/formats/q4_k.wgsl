// Q4_K: | d | dmin | scales[12] | qs[128] |. Lane l owns the 16 bytes at qs[32j + 16h]
// (j = l / 2, h = l % 2): their low nibbles are values 64j + 16h.., sub-block 2j, and their
// high nibbles values 64j + 32 + 16h.., sub-block 2j + 1.
const BLOCK_BYTES: u32 = 144u;

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
    let qo = b + 16u + 32u * j + 16u * (lane % 2u);
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(qo + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let byte = (word >> (8u * k)) & 0xffu;
            v[4u * i + k] = fma(dl, f32(byte & 0xfu), -ml);
            v[16u + 4u * i + k] = fma(dh, f32(byte >> 4u), -mh);
        }
    }
    return v;
}
