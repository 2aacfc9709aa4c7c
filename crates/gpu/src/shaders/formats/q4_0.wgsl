// Q4_0: | d | qs[16] |, x = d * (q - 8); low nibbles are values 0..16, high 16..32.
const BLOCK_BYTES: u32 = 18u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let d = f16_at(b);
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(b + 2u + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let byte = (word >> (8u * k)) & 0xffu;
            v[4u * i + k] = d * f32(i32(byte & 0xfu) - 8);
            v[16u + 4u * i + k] = d * f32(i32(byte >> 4u) - 8);
        }
    }
    return v;
}
