pub mod bench_kernels;
pub mod chat;
pub mod common;
pub mod dequantize;
pub mod eval;
pub mod info;
pub mod run;
pub mod tokenize;
