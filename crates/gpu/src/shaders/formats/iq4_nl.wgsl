// IQ4_NL: | d | qs[16] |, x = d * KVALUES[q].
const BLOCK_BYTES: u32 = 18u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    return iq4_levels(b + 2u, f16_at(b));
}
