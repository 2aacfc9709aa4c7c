//! The reference tier: plain scalar codecs for every format, always compiled. They define what
//! the formats mean; every faster kernel is tested against them and falls back to them.

pub mod dequant;
pub mod dot;
pub mod quantize;
