// Q3_K: | hmask[32] | qs[64] | scales[12] | d |, 110 bytes. Q2_K's 2-bit fields and lanes;
// bit 4h + k of hmask[l] clear means subtract 4; 6-bit scales minus 32, one per 16 values.
const BLOCK_BYTES: u32 = 110u;

fn run_base(lane: u32, q: u32) -> u32 {
    return 128u * (lane / 4u) + 32u * q + 8u * (lane % 4u);
}

fn q3k_scale(off: u32, g: u32) -> f32 {
    var low: u32;
    if g < 8u {
        low = u8_at(off + g) & 0xfu;
    } else {
        low = u8_at(off + g - 8u) >> 4u;
    }
    let high = (u8_at(off + 8u + g % 4u) >> (2u * (g / 4u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let h = lane / 4u;
    let r = lane % 4u;
    let d = f16_at(b + 108u);
    let qo = b + 32u + 32u * h + 8u * r;
    let w0 = u32_at(qo);
    let w1 = u32_at(qo + 4u);
    let m0 = u32_at(b + 8u * r);
    let m1 = u32_at(b + 8u * r + 4u);
    var v: array<f32, 32>;
    for (var k = 0u; k < 4u; k++) {
        let dl = d * q3k_scale(b + 96u, 8u * h + 2u * k + r / 2u);
        for (var e = 0u; e < 8u; e++) {
            let word = select(w0, w1, e >= 4u);
            let mask = select(m0, m1, e >= 4u);
            let q = (word >> (8u * (e % 4u) + 2u * k)) & 3u;
            let high = (mask >> (8u * (e % 4u) + 4u * h + k)) & 1u;
            v[8u * k + e] = dl * f32(i32(q) - select(4, 0, high == 1u));
        }
    }
    return v;
}
