// The 256-value formats: step `s` is block `s`, and every lane owns 32 of its values.

fn lane_valid(s: u32, lane: u32) -> bool {
    return true;
}

fn block_at(row_off: u32, s: u32, lane: u32) -> u32 {
    return row_off + s * BLOCK_BYTES;
}

// Scale and min of sub-block j (0..8) of Q4_K/Q5_K, from the 12 bytes at `off`.
fn k_scale_min(off: u32, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2(f32(u8_at(off + j) & 63u), f32(u8_at(off + j + 4u) & 63u));
    }
    let sc = (u8_at(off + j + 4u) & 0xfu) | ((u8_at(off + j - 4u) >> 6u) << 4u);
    let m = (u8_at(off + j + 4u) >> 4u) | ((u8_at(off + j) >> 6u) << 4u);
    return vec2(f32(sc), f32(m));
}
