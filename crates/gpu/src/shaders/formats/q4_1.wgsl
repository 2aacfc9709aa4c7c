// Q4_1: | d | m | qs[16] |, x = d * q + m.
const BLOCK_BYTES: u32 = 20u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(b + 4u + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let byte = (word >> (8u * k)) & 0xffu;
            v[4u * i + k] = fma(d, f32(byte & 0xfu), m);
            v[16u + 4u * i + k] = fma(d, f32(byte >> 4u), m);
        }
    }
    return v;
}
