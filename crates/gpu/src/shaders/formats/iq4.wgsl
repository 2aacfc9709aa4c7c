// The 16 non-uniform levels of IQ4_NL and IQ4_XS.
const KVALUES: array<f32, 16> = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
);

// 16 bytes of 4-bit level indices at `off`: low nibbles are values 0..16, high 16..32.
fn iq4_levels(off: u32, dl: f32) -> array<f32, 32> {
    var v: array<f32, 32>;
    for (var i = 0u; i < 4u; i++) {
        let word = u32_at(off + 4u * i);
        for (var k = 0u; k < 4u; k++) {
            let byte = (word >> (8u * k)) & 0xffu;
            v[4u * i + k] = dl * KVALUES[byte & 0xfu];
            v[16u + 4u * i + k] = dl * KVALUES[byte >> 4u];
        }
    }
    return v;
}
