// Q6_K: | ql[128] | qh[64] | scales[16] (i8) | d |, 210 bytes, so blocks start at any even
// byte. Value 128h + 32k + l is nibble k / 2 of ql[64h + 32(k % 2) + l] with bits 2k.. of
// qh[32h + l] on top, minus 32. Lane (h, r) = (l / 4, l % 4) owns l in 8r..8r + 8, for all
// four k: runs 128h + 32k + 8r, one scale each.
const BLOCK_BYTES: u32 = 210u;

fn run_base(lane: u32, q: u32) -> u32 {
    return 128u * (lane / 4u) + 32u * q + 8u * (lane % 4u);
}

fn decode(row_off: u32, s: u32, lane: u32) -> array<f32, 32> {
    let b = block_at(row_off, s, lane);
    let h = lane / 4u;
    let r = lane % 4u;
    let d = f16_at(b + 208u);
    var dk: array<f32, 4>;
    for (var k = 0u; k < 4u; k++) {
        let sc = u8_at(b + 192u + 8u * h + 2u * k + r / 2u);
        dk[k] = d * f32(i32(sc << 24u) >> 24u);
    }
    let la = b + 64u * h + 8u * r;
    let hb = b + 128u + 32u * h + 8u * r;
    var v: array<f32, 32>;
    for (var i = 0u; i < 2u; i++) {
        let wa = u32_at(la + 4u * i);
        let wb = u32_at(la + 32u + 4u * i);
        let wh = u32_at(hb + 4u * i);
        for (var e = 0u; e < 4u; e++) {
            let a = (wa >> (8u * e)) & 0xffu;
            let c = (wb >> (8u * e)) & 0xffu;
            let hi = (wh >> (8u * e)) & 0xffu;
            let n = 4u * i + e;
            v[n] = dk[0] * (f32((a & 0xfu) | ((hi & 3u) << 4u)) - 32.0);
            v[8u + n] = dk[1] * (f32((c & 0xfu) | (((hi >> 2u) & 3u) << 4u)) - 32.0);
            v[16u + n] = dk[2] * (f32((a >> 4u) | (((hi >> 4u) & 3u) << 4u)) - 32.0);
            v[24u + n] = dk[3] * (f32((c >> 4u) | (((hi >> 6u) & 3u) << 4u)) - 32.0);
        }
    }
    return v;
}
