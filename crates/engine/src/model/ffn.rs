//! The dense feed-forward block (gated, SwiGLU or GeGLU) and its gated activation over rows,
//! which the mixture-of-experts block runs for every expert too.

use synapse_gguf::GgufFile;

use super::common::{fused, matrix, mm, mm_many};
use super::Scratch;
use crate::matmul::{parallel_chunks_mut, Matrix, Threads};
use crate::ops::{geglu, swiglu, swiglu_oai};
use crate::{ModelError, Tap};

/// The gate's activation in a gated FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// SwiGLU (llama, Qwen).
    Silu,
    /// GEGLU with ggml's F16 GELU table (Gemma).
    Gelu,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`, [`swiglu_oai`]).
    SwigluOai,
}

/// A gated feed-forward block: `Wdown · (act(Wgate · h) * (Wup · h))`.
pub(crate) struct Ffn<'a> {
    pub gate: Matrix<'a>,
    pub up: Matrix<'a>,
    pub down: Matrix<'a>,
}

impl<'a> Ffn<'a> {
    /// `blk.{i}.ffn_{gate,up,down}.weight`.
    pub fn load(
        file: &'a GgufFile,
        i: usize,
        n_embd: usize,
        n_ff: usize,
    ) -> Result<Ffn<'a>, ModelError> {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        // Without `ffn_gate`, a fused `ffn_up` of both halves, the gate's first (Phi-3).
        let [gate, up] = match file.tensor(&p("ffn_gate")) {
            Ok(_) => [
                matrix(file, &p("ffn_gate"), n_embd, Some(n_ff))?,
                matrix(file, &p("ffn_up"), n_embd, Some(n_ff))?,
            ],
            Err(_) => {
                let parts = fused(file, &p("ffn_up"), n_embd, &[n_ff, n_ff])?;
                <[Matrix; 2]>::try_from(parts).unwrap_or_else(|_| unreachable!("two parts"))
            }
        };
        Ok(Ffn {
            gate,
            up,
            down: matrix(file, &p("ffn_down"), n_ff, Some(n_embd))?,
        })
    }

    /// Its matrices, in the order a pass multiplies them.
    pub fn matrices(&self) -> [&Matrix<'a>; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// `s.o` of the `n` normed rows in `s.h`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn forward(
        &self,
        act: Activation,
        s: &mut Scratch,
        n: usize,
        threads: &Threads,
        tap: &Tap,
        l: usize,
        pos0: usize,
    ) {
        let n_ff = self.gate.rows;
        mm_many(
            "ffn_gate_up",
            &[&self.gate, &self.up],
            &s.h,
            n,
            &mut s.acts,
            &mut [&mut s.gate, &mut s.up],
            threads,
        );
        tap.rows("ffn_gate", l, pos0, &s.gate[..n * n_ff], n);
        tap.rows("ffn_up", l, pos0, &s.up[..n * n_ff], n);
        glu_rows(
            act,
            &mut s.gate[..n * n_ff],
            &s.up[..n * n_ff],
            n_ff,
            threads,
        );
        let name = match act {
            Activation::Silu => "ffn_swiglu",
            Activation::Gelu => "ffn_geglu",
            Activation::SwigluOai => "ffn_swiglu_oai",
        };
        crate::profile::mark(name);
        tap.rows(name, l, pos0, &s.gate[..n * n_ff], n);
        mm(
            "ffn_down",
            &self.down,
            &s.gate,
            n,
            &mut s.acts,
            &mut s.o,
            threads,
        );
        tap.rows("ffn_out", l, pos0, &s.o[..n * self.down.rows], n);
    }
}

/// `gate = act(gate) * up` for each row of `width` values. Row by row, as ggml applies it
/// (SwiGLU's vector `exp` takes whole groups of 16 and libm's `expf` the row's tail, so a row is
/// the unit that keeps the bits): a batch's rows over the threads (one token's row is too short
/// to be worth a hand-off).
pub(crate) fn glu_rows(
    act: Activation,
    gate: &mut [f32],
    up: &[f32],
    width: usize,
    threads: &Threads,
) {
    if gate.len() > width {
        parallel_chunks_mut(threads, gate, width, |t0, run| {
            for (i, row) in run.chunks_exact_mut(width).enumerate() {
                glu_dispatch(act, row, &up[(t0 + i) * width..][..width]);
            }
        });
    } else {
        glu(act, gate, up);
    }
}

/// `gate = act(gate) * up`, element by element.
#[inline(always)]
fn glu(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => swiglu(gate, up),
        Activation::Gelu => geglu(gate, up),
        Activation::SwigluOai => swiglu_oai(gate, up),
    }
}

/// [`glu`] compiled for the CPU's features, for a pool thread: the forward pass's own copy
/// for AVX2 and FMA (`forward_v3`) does not reach into the closures it hands to the threads,
/// and without FMA each `mul_add` is a call to a software `fmaf` (same bits, several times
/// slower).
fn glu_dispatch(act: Activation, gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx512f() {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
        unsafe fn v4(act: Activation, gate: &mut [f32], up: &[f32]) {
            glu(act, gate, up)
        }
        // SAFETY: the CPU has AVX-512 F, AVX2, FMA and F16C (just checked).
        return unsafe { v4(act, gate, up) };
    }
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx2() {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn v3(act: Activation, gate: &mut [f32], up: &[f32]) {
            glu(act, gate, up)
        }
        // SAFETY: the CPU has AVX2, FMA and F16C (just checked).
        return unsafe { v3(act, gate, up) };
    }
    glu(act, gate, up)
}
