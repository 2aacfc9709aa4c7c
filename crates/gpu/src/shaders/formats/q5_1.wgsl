// Q5_1: | d | m | qh: u32 | qs[16] |, x = d * q + m.
const BLOCK_BYTES: u32 = 24u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    let qh = u32_at(b + 4u);
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(b + 8u + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let j = 4u * i + k;
            let byte = (word >> (8u * k)) & 0xffu;
            let lo = (byte & 0xfu) | (((qh >> j) & 1u) << 4u);
            let hi = (byte >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            v[j] = fma(d, f32(lo), m);
            v[16u + j] = fma(d, f32(hi), m);
        }
    }
    return v;
}
