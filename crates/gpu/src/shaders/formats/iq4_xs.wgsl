// IQ4_XS: | d | scales_h: u16 | scales_l[4] | qs[128] |: eight IQ4_NL sub-blocks sharing d,
// each with a 6-bit scale minus 32. Lane l owns sub-block l.
const BLOCK_BYTES: u32 = 136u;

fn run_base(lane: u32, q: u32) -> u32 {
    return 32u * lane + 8u * q;
}

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let d = f16_at(b);
    let scales_h = u32_at(b) >> 16u;
    let low = (u8_at(b + 4u + lane / 2u) >> (4u * (lane % 2u))) & 0xfu;
    let ls = low | (((scales_h >> (2u * lane)) & 3u) << 4u);
    return iq4_levels(b + 8u + 16u * lane, d * f32(i32(ls) - 32));
}
