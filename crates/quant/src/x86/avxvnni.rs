//! The multi-row kernels of the 32-value formats (Q4_0 in both orders, Q4_1, Q8_0) for CPUs
//! with AVX-VNNI but no AVX-512 (Intel's Alder Lake and later client cores, AMD's Zen 5 in some
//! configurations): the same source as [`crate::x86::avx512`]'s, with the VEX-encoded 256-bit
//! `vpdpbusd` in place of `vpmaddubsw` + `vpmaddwd` (+ add). Integer sums are exact in any
//! order, and the float side is the AVX2 kernels': same bits.

use std::arch::x86_64::*;

use crate::blocks::*;
use crate::x86::avx2::{head_f16x2, hsum, hsum_i32, load32, nibbles};
use crate::x86::prefetch_ahead;

crate::x86::avx512::vnni_row_kernels!("avxvnni,avx2,fma,f16c", _mm256_dpbusd_avx_epi32);
