// Q8_0: | d | qs[32] (i8) |, 34 bytes, so half the blocks start at 2 mod 4.
const BLOCK_BYTES: u32 = 34u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let d = f16_at(b);
    var v: array<f32, 32>;
    for (var i = 0u; i < 8u; i++) {
        let word = u32_at(b + 2u + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            v[4u * i + k] = sbyte_f(word, k) * d;
        }
    }
    return v;
}
