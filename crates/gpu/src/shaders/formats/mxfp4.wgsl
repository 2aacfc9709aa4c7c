// MXFP4: | e | qs[16] |, x = 2^(e - 128) * LEVELS[q]: an E8M0 exponent halved and FP4's levels
// doubled, as ggml stores them; low nibbles are values 0..16, high 16..32.
const BLOCK_BYTES: u32 = 17u;

const MXFP4_LEVELS: array<f32, 16> = array<f32, 16>(
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
    0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0,
);

// ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128), its two smallest subnormal.
fn e8m0_half(e: u32) -> f32 {
    if e < 2u {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let d = e8m0_half(u8_at(b));
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(b + 1u + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let byte = (word >> (8u * k)) & 0xffu;
            v[4u * i + k] = d * MXFP4_LEVELS[byte & 0xfu];
            v[16u + 4u * i + k] = d * MXFP4_LEVELS[byte >> 4u];
        }
    }
    return v;
}
