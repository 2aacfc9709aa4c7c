// Reading a ggml tensor's bytes in place. The weights are bound as the file holds them, as
// 32-bit words: blocks of 34, 210 or 18 bytes start at any byte, so every read says its byte
// offset and takes the one or two words under it.

@group(0) @binding(0) var<storage, read> w: array<u32>;

// The four bytes at byte offset `off`, little-endian, whatever its alignment.
fn u32_at(off: u32) -> u32 {
    let i = off >> 2u;
    let s = (off & 3u) * 8u;
    if s == 0u {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

fn u8_at(off: u32) -> u32 {
    return (w[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

// An IEEE half at an even byte offset, widened exactly.
fn f16_at(off: u32) -> f32 {
    let bits = (w[off >> 2u] >> ((off & 2u) * 8u)) & 0xffffu;
    return unpack2x16float(bits).x;
}

// Byte `k` (0..4) of a word, as a float.
fn byte_f(word: u32, k: u32) -> f32 {
    return f32((word >> (8u * k)) & 0xffu);
}

// Byte `k` of a word read as a signed 8-bit integer.
fn sbyte_f(word: u32, k: u32) -> f32 {
    return f32(i32(word << (24u - 8u * k)) >> 24u);
}
