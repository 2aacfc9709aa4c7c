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

// The scale and min of the two sub-blocks lane `lane` of a Q4_K/Q5_K block at `b` owns (2j and
// 2j + 1, j = lane / 2), times d and dmin: (d * sc_lo, dmin * m_lo, d * sc_hi, dmin * m_hi).
fn k_lane_scales(b: u32, lane: u32) -> vec4<f32> {
    let d = f16_at(b);
    let dmin = f16_at(b + 2u);
    let j = lane / 2u;
    let lo = k_scale_min(b + 4u, 2u * j);
    let hi = k_scale_min(b + 4u, 2u * j + 1u);
    return vec4(d * lo.x, dmin * lo.y, d * hi.x, dmin * hi.y);
}
