// The parameters every delta-net kernel takes (one set per layer and pass): the batch's
// tokens, the value and key heads, the values a head, the convolution's channels
// (2 * key_dim + value_dim) and taps.

struct P {
    tokens: u32,
    h_v: u32,
    h_k: u32,
    hd: u32,
    conv_dim: u32,
    d_conv: u32,
    _pad0: u32,
    _pad1: u32,
}
