pub mod dequantize;
pub mod info;
