//! The exponential of the attention heads' softmax: the table and polynomial of the vector
//! `expf` both x86 tiers use (each writes its own loop in its own registers), and the check
//! that a vector `expf` gives libm's bits on this machine.

/// `2^(i/32)` as the nearest double, less `i << 47`: with `k = 32 q + i`, the double whose bits
/// are `TAB[i] + (k << 47)` is `2^(k/32)` (the exponent field takes `q`).
pub(crate) const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// `32 / ln 2` (0x1.71547652b82fep+5).
pub(crate) const INV_LN2_32: f64 = f64::from_bits(0x4047_1547_652b_82fe);
/// Adding it rounds a double below 2^51 in magnitude to an integer (ties to even) held in the
/// low bits.
pub(crate) const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000); // 0x1.8p+52
/// The polynomial for `2^(r/32)`, `|r| <= 1/2`: `(C0 r + C1) r^2 + (C2 r + 1)`; the
/// coefficients of `2^r`'s cubic (0x1.c6af84b912394p-5, 0x1.ebfce50fac4f3p-3,
/// 0x1.62e42ff0c52d6p-1) over `32^3`, `32^2` and `32`.
pub(crate) const C0: f64 = f64::from_bits(0x3ebc_6af8_4b91_2394);
pub(crate) const C1: f64 = f64::from_bits(0x3f2e_bfce_50fa_c4f3);
pub(crate) const C2: f64 = f64::from_bits(0x3f96_2e42_ff0c_52d6);

/// Whether a vector `expf` (`exp`: sixteen lanes in place) gives `f32::exp`'s bits (libm's
/// `expf`) on the f32s `first, first + step, ..` up to `last`, and on the boundaries of the
/// special cases (compared as bits, NaNs as NaN).
pub(crate) fn exp_agrees(exp: impl Fn(&mut [f32; 16]), first: u32, last: u32, step: u32) -> bool {
    let mut xs: Vec<f32> = [
        0x42b1_7217u32,
        0xc2cf_f1b4,
        0xc2b0_0000,
        0x42b0_0000,
        0xc2ae_ac50,
    ]
    .iter()
    .flat_map(|&b| (b - 4..=b + 4).map(f32::from_bits))
    .flat_map(|x| [x, -x])
    .chain([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ])
    .collect();
    let agree = |xs: &[f32]| {
        xs.chunks(16).all(|c| {
            let mut y = [0.0f32; 16];
            y[..c.len()].copy_from_slice(c);
            exp(&mut y);
            c.iter().zip(y).all(|(x, y)| {
                let e = x.exp();
                e.to_bits() == y.to_bits() || (e.is_nan() && y.is_nan())
            })
        })
    };
    if !agree(&xs) {
        return false;
    }
    let mut b = first as u64;
    while b <= last as u64 {
        xs.clear();
        xs.extend(
            (0..4096u64)
                .map(|i| b + i * step as u64)
                .take_while(|&b| b <= last as u64)
                .map(|b| f32::from_bits(b as u32)),
        );
        if !agree(&xs) {
            return false;
        }
        b += 4096 * step as u64;
    }
    true
}
