const BLOCK_BYTES: u32 = 128u;

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    var v: array<f32, 32>;
    for (var i = 0u; i < 32u; i++) {
        v[i] = bitcast<f32>(u32_at(b + 4u * i));
    }
    return v;
}
