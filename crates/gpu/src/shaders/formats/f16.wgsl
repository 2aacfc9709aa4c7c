const BLOCK_BYTES: u32 = 64u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    var v: array<f32, 32>;
    for (var i = 0u; i < 16u; i++) {
        let pair = unpack2x16float(u32_at(b + 4u * i));
        v[2u * i] = pair.x;
        v[2u * i + 1u] = pair.y;
    }
    return v;
}
