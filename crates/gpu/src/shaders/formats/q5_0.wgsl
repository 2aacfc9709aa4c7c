// Q5_0: | d | qh: u32 | qs[16] |, x = d * (q - 16); bit j of qh tops value j.
const BLOCK_BYTES: u32 = 22u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let d = f16_at(b);
    let qh = u32_at(b + 2u);
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(b + 6u + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let j = 4u * i + k;
            let byte = (word >> (8u * k)) & 0xffu;
            let lo = (byte & 0xfu) | (((qh >> j) & 1u) << 4u);
            let hi = (byte >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            v[j] = d * f32(i32(lo) - 16);
            v[16u + j] = d * f32(i32(hi) - 16);
        }
    }
    return v;
}
