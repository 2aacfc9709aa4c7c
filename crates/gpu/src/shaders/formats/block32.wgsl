// The 32-value formats (and the float types, cut into runs of 32): lane `lane` of step `s`
// owns block 8 * s + lane whole, its values in order.

fn lane_valid(s: u32, lane: u32) -> bool {
    return 8u * s + lane < p.lanes;
}

fn run_base(lane: u32, q: u32) -> u32 {
    return 32u * lane + 8u * q;
}

fn block_at(row_off: u32, s: u32, lane: u32) -> u32 {
    return row_off + (8u * s + lane) * BLOCK_BYTES;
}
