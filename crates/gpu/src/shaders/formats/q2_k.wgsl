// Q2_K: | scales[16] | qs[64] | d | dmin |. Value 128h + 32k + l is bits 2k.. of
// qs[32h + l]; group i / 16 has scale (low nibble) and min (high nibble). Lane (h, r) owns
// l in 8r..8r + 8 for all four k, as in Q6_K.
const BLOCK_BYTES: u32 = 84u;

fn run_base(lane: u32, q: u32) -> u32 {
    return 128u * (lane / 4u) + 32u * q + 8u * (lane % 4u);
}

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let h = lane / 4u;
    let r = lane % 4u;
    let d = f16_at(b + 80u);
    let dmin = f16_at(b + 82u);
    let qo = b + 16u + 32u * h + 8u * r;
    let w0 = u32_at(qo);
    let w1 = u32_at(qo + 4u);
    var v: array<f32, 32>;
    for (var k = 0u; k < 4u; k++) {
        let sc = u8_at(b + 8u * h + 2u * k + r / 2u);
        let dl = d * f32(sc & 0xfu);
        let ml = dmin * f32(sc >> 4u);
        for (var e = 0u; e < 8u; e++) {
            let word = select(w0, w1, e >= 4u);
            let q = (word >> (8u * (e % 4u) + 2u * k)) & 3u;
            v[8u * k + e] = fma(dl, f32(q), -ml);
        }
    }
    return v;
}
