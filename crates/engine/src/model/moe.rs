//! The routed feed-forward block of a mixture of experts (`qwen3moe`, `qwen35moe`, Mixtral-style
//! `llama`, `gpt-oss`), as llama.cpp's `build_moe_ffn` computes it:
//!
//! ```text
//! l          = Wrouter · h [+ brouter]               (one logit per expert)
//! softmax:   p = softmax(l); e_1 .. e_k = the k most probable experts, most probable first;
//!            w_i = p[e_i] / max(p[e_1] + .. + p[e_k], 2^-14)     (where the model normalises)
//! gpt-oss:   e_1 .. e_k = the k largest logits, largest first; w = softmax(l[e_1] .. l[e_k])
//! out        = w_1 · down_e1(act(gate_e1 · h) * (up_e1 · h)) + .. + w_k · down_ek(..)
//!              [ + sigmoid(Wshared_gate · h) * shared_ffn(h) ]     (Qwen 3.5's shared expert)
//! ```
//! gpt-oss adds each expert's own bias to its gate, up and down products.
//!
//! The experts' matrices are read in place from the stacked `ffn_{gate,up,down}_exps` tensors. A
//! pass gathers the rows routed to each expert and multiplies each expert's matrices once for all
//! of them, so a batch reads an expert's weights once. A token's output is still its own: each
//! product is the one dot product per row and token whatever else the expert was given, and the
//! routing and the weighted sum are per token, in its own rank order. So it keeps G1 and D1.

use synapse_gguf::GgufFile;

use super::common::{add_bias_rows, matrix, mm, packed};
use super::ffn::{glu_rows, Activation, Ffn};
use super::hparams::{Gating, MoeParams};
use super::{MoeBuffers, Scratch};
use crate::matmul::{matmul_grouped, Job, Matrix, Threads};
use crate::ops::{expf_ggml, reduce_add_16, sigmoid};
use crate::{ModelError, Tap};

/// One expert: a gated feed-forward block.
struct Expert<'a> {
    gate: Matrix<'a>,
    up: Matrix<'a>,
    down: Matrix<'a>,
}

/// A shared expert (Qwen 3.5's MoE): an FFN every token goes through, its output scaled by
/// the sigmoid of a gate of its own before it joins the routed experts'.
struct Shared<'a> {
    /// `ffn_gate_inp_shexp`: one row.
    gate: Matrix<'a>,
    ffn: Ffn<'a>,
}

/// gpt-oss's biases: the router's (`n_expert`) and each expert's on its gate and up products
/// (`n_expert x n_ff_exp`) and on its down product (`n_expert x n_embd`), expert by expert.
struct Biases {
    router: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// A layer's router and experts.
pub(crate) struct Moe<'a> {
    /// `ffn_gate_inp`: one row of logits per expert (F32 in the files llama.cpp writes).
    router: Matrix<'a>,
    experts: Vec<Expert<'a>>,
    n_used: usize,
    gating: Gating,
    biases: Option<Biases>,
    shared: Option<Shared<'a>>,
}

impl<'a> Moe<'a> {
    /// Layer `i`'s `ffn_gate_inp` and `ffn_{gate,up,down}_exps`, each expert packed as a matrix
    /// of its own.
    pub fn load(
        file: &'a GgufFile,
        i: usize,
        n_embd: usize,
        p: &MoeParams,
    ) -> Result<Moe<'a>, ModelError> {
        let name = |s: &str| format!("blk.{i}.{s}.weight");
        let stack = |s: &str, cols: usize, rows: usize| -> Result<Vec<Matrix<'a>>, ModelError> {
            let name = name(s);
            let t = file.tensor(&name).map_err(|_| ModelError::MissingTensor {
                tensor: name.clone(),
            })?;
            Matrix::stacked(t, cols, rows, p.n_expert)?
                .into_iter()
                .map(|m| packed(file, m, &name))
                .collect()
        };
        let (d, f) = (n_embd, p.n_ff_exp);
        if file.tensor(&name("ffn_gate_up_exps")).is_ok() {
            return Err(ModelError::Hparams(format!(
                "tensor `{}`: experts with fused gate and up matrices are not supported \
                 (convert without --fuse-gate-up-exps)",
                name("ffn_gate_up_exps")
            )));
        }
        let gates = stack("ffn_gate_exps", d, f)?;
        let ups = stack("ffn_up_exps", d, f)?;
        let downs = stack("ffn_down_exps", f, d)?;
        let experts = gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((gate, up), down)| Expert { gate, up, down })
            .collect();
        let shared = match p.n_ff_shared {
            Some(n_ff) => {
                let gate = name("ffn_gate_inp_shexp");
                let t = file.tensor(&gate).map_err(|_| ModelError::MissingTensor {
                    tensor: gate.clone(),
                })?;
                let p = |s: &str| name(s);
                Some(Shared {
                    gate: Matrix::one_row(t, d)?,
                    ffn: Ffn {
                        gate: matrix(file, &p("ffn_gate_shexp"), d, Some(n_ff))?,
                        up: matrix(file, &p("ffn_up_shexp"), d, Some(n_ff))?,
                        down: matrix(file, &p("ffn_down_shexp"), n_ff, Some(d))?,
                    },
                })
            }
            None => None,
        };
        let biases = match p.biases {
            true => {
                // Each expert's row of `n` values: `[n, n_expert]`, as llama.cpp requires.
                let bias = |s: &str, n: usize| {
                    let name = format!("blk.{i}.{s}.bias");
                    if let Ok(t) = file.tensor(&name) {
                        let shape = &t.info.shape;
                        let want: &[u64] = &[n as u64, p.n_expert as u64];
                        if n > 1 && shape.as_slice() != want {
                            return Err(ModelError::Shape {
                                tensor: name,
                                shape: shape.clone(),
                                expected: format!("{want:?} of F32"),
                            });
                        }
                    }
                    super::vector(file, &name, n * p.n_expert)
                };
                Some(Biases {
                    router: bias("ffn_gate_inp", 1)?,
                    gate: bias("ffn_gate_exps", f)?,
                    up: bias("ffn_up_exps", f)?,
                    down: bias("ffn_down_exps", d)?,
                })
            }
            false => None,
        };
        Ok(Moe {
            router: matrix(file, &name("ffn_gate_inp"), d, Some(p.n_expert))?,
            experts,
            n_used: p.n_used,
            gating: p.gating,
            biases,
            shared,
        })
    }

    /// Its matrices: the router, each expert's gate, up and down, then the shared expert's.
    pub fn matrices(&self) -> impl Iterator<Item = &Matrix<'a>> {
        let experts = self.experts.iter();
        let shared = self.shared.iter();
        std::iter::once(&self.router)
            .chain(experts.flat_map(|e| [&e.gate, &e.up, &e.down]))
            .chain(shared.flat_map(|s| [&s.gate, &s.ffn.gate, &s.ffn.up, &s.ffn.down]))
    }

    /// `s.o` of the `n` normed rows in `s.h`.
    #[allow(clippy::too_many_arguments)]
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
        let (n_expert, k) = (self.experts.len(), self.n_used);
        let d = self.router.cols;
        let f = self.experts[0].gate.rows;
        if let Some(sh) = &self.shared {
            // First, while `s.o` is free: the shared expert's output, and its gate's logit.
            sh.ffn.forward(act, s, n, threads, tap, l, pos0);
            let b = &mut s.moe;
            b.shared[..n * d].copy_from_slice(&s.o[..n * d]);
            mm(
                "ffn_shexp_gate",
                &sh.gate,
                &s.h,
                n,
                &mut s.acts,
                &mut b.shared_gate,
                threads,
            );
        }
        let b = &mut s.moe;
        mm(
            "ffn_moe_logits",
            &self.router,
            &s.h,
            n,
            &mut s.acts,
            &mut b.logits,
            threads,
        );
        tap.rows("ffn_moe_logits", l, pos0, &b.logits[..n * n_expert], n);
        if let Some(bias) = &self.biases {
            add_bias_rows(&mut b.logits, &bias.router, n);
        }
        for t in 0..n {
            let logits = &b.logits[t * n_expert..(t + 1) * n_expert];
            route(
                logits,
                &mut b.probs,
                &mut b.chosen[t * k..(t + 1) * k],
                self.gating,
            );
        }
        let rows = b.group(n, k, n_expert);
        crate::profile::mark("ffn_moe_route");

        // Gate and up: `h` quantized once, its rows gathered expert by expert.
        let choice = |t: usize, i: usize| b.chosen[t * k + i].0 as usize;
        let h = &s.h;
        for e in [&self.experts[0].gate, &self.experts[0].up] {
            let row = |t: usize, _| &h[t * d..(t + 1) * d];
            crate::quantize::sums::routed(e.name, n_expert, d, (n, k), choice, row);
        }
        let (gate_ty, up_ty) = (
            self.experts[0].gate.act_type(),
            self.experts[0].up.act_type(),
        );
        s.acts.quantize(gate_ty, &s.h[..n * d], d, threads);
        b.acts.gather(&s.acts, &b.src[..rows]);
        if up_ty == gate_ty {
            let mut all = self.jobs(&b.starts, |e| &e.gate, 0);
            all.extend(self.jobs(&b.starts, |e| &e.up, 1));
            matmul_grouped(&all, &b.acts, &mut [&mut b.gate, &mut b.up], threads);
        } else {
            matmul_grouped(
                &self.jobs(&b.starts, |e| &e.gate, 0),
                &b.acts,
                &mut [&mut b.gate],
                threads,
            );
            s.acts.quantize(up_ty, &s.h[..n * d], d, threads);
            b.acts.gather(&s.acts, &b.src[..rows]);
            matmul_grouped(
                &self.jobs(&b.starts, |e| &e.up, 0),
                &b.acts,
                &mut [&mut b.up],
                threads,
            );
        }
        self.mark_products("ffn_moe_gate_up", b, |e| [&e.gate, &e.up]);
        if let Some(bias) = &self.biases {
            // ggml's `add_id`: each gathered row plus its expert's bias row.
            add_expert_biases(&mut b.gate, &bias.gate, &b.starts, f);
            add_expert_biases(&mut b.up, &bias.up, &b.starts, f);
            crate::profile::mark("bias");
        }

        glu_rows(act, &mut b.gate[..rows * f], &b.up[..rows * f], f, threads);
        crate::profile::mark("ffn_moe_glu");

        let down_ty = self.experts[0].down.act_type();
        let (gate, slot) = (&b.gate, &b.slot);
        crate::quantize::sums::routed(
            self.experts[0].down.name,
            n_expert,
            f,
            (n, k),
            |t, i| b.chosen[t * k + i].0 as usize,
            |t, i| &gate[slot[t * k + i] * f..(slot[t * k + i] + 1) * f],
        );
        b.acts.quantize(down_ty, &b.gate[..rows * f], f, threads);
        crate::profile::mark("quantize activations");
        matmul_grouped(
            &self.jobs(&b.starts, |e| &e.down, 0),
            &b.acts,
            &mut [&mut b.down],
            threads,
        );
        self.mark_products("ffn_moe_down", b, |e| [&e.down]);
        if let Some(bias) = &self.biases {
            add_expert_biases(&mut b.down, &bias.down, &b.starts, d);
            crate::profile::mark("bias");
        }

        // Each token's experts weighted and added in its rank order, as ggml adds the views.
        for t in 0..n {
            let o = &mut s.o[t * d..(t + 1) * d];
            for i in 0..k {
                let (r, (_, w)) = (b.slot[t * k + i], b.chosen[t * k + i]);
                let y = &b.down[r * d..(r + 1) * d];
                if i == 0 {
                    o.iter_mut().zip(y).for_each(|(o, &y)| *o = y * w);
                } else {
                    o.iter_mut().zip(y).for_each(|(o, &y)| *o += y * w);
                }
            }
        }
        crate::profile::mark("ffn_moe_sum");
        tap.rows("ffn_moe_out", l, pos0, &s.o[..n * d], n);
        if self.shared.is_some() {
            // ggml's `moe_out + ffn_shexp * sigmoid(gate)`.
            for t in 0..n {
                let g = sigmoid(b.shared_gate[t]);
                let (o, y) = (&mut s.o[t * d..(t + 1) * d], &b.shared[t * d..(t + 1) * d]);
                o.iter_mut().zip(y).for_each(|(o, &y)| *o += y * g);
            }
            crate::profile::mark("ffn_shexp_add");
            tap.rows("ffn_out", l, pos0, &s.o[..n * d], n);
        }
    }

    /// One product for each expert given tokens: its matrix `pick` with its rows (`starts`,
    /// [`MoeBuffers::group`]), into output `out`.
    fn jobs<'m>(
        &'m self,
        starts: &[usize],
        pick: impl Fn(&'m Expert<'a>) -> &'m Matrix<'a>,
        out: usize,
    ) -> Vec<Job<'m, 'a>> {
        let given = |e: &usize| starts[*e] < starts[*e + 1];
        (0..self.experts.len())
            .filter(given)
            .map(|e| Job {
                w: pick(&self.experts[e]),
                tokens: starts[e]..starts[e + 1],
                out,
            })
            .collect()
    }

    /// The profile's count of the weights the experts given tokens read, and their products.
    fn mark_products<const M: usize>(
        &self,
        name: &'static str,
        b: &MoeBuffers,
        pick: impl for<'e> Fn(&'e Expert<'a>) -> [&'e Matrix<'a>; M],
    ) {
        let (mut weight_bytes, mut macs) = (0u64, 0u64);
        for (e, x) in self.experts.iter().enumerate() {
            let tokens = (b.starts[e + 1] - b.starts[e]) as u64;
            if tokens > 0 {
                for w in pick(x) {
                    weight_bytes += w.bytes() as u64;
                    macs += tokens * (w.rows * w.cols) as u64;
                }
            }
        }
        crate::profile::mark_product(name, weight_bytes, macs);
    }
}

/// Add expert `e`'s bias row (`width` values of `bias`, expert by expert) to each row of `x`
/// gathered for it (rows `starts[e]..starts[e + 1]`, [`MoeBuffers::group`]).
fn add_expert_biases(x: &mut [f32], bias: &[f32], starts: &[usize], width: usize) {
    for (e, b) in bias.chunks_exact(width).enumerate() {
        let rows = &mut x[starts[e] * width..starts[e + 1] * width];
        for row in rows.chunks_exact_mut(width) {
            crate::ops::add_inplace(row, b);
        }
    }
}

/// One token's experts and their weights (`chosen`, best first) from its router's logits, as
/// `gating` asks; `probs` is scratch of one value per expert.
fn route(logits: &[f32], probs: &mut [f32], chosen: &mut [(u32, f32)], gating: Gating) {
    probs.copy_from_slice(logits);
    match gating {
        Gating::Softmax { norm } => {
            softmax(probs);
            choose(probs, chosen);
            if norm {
                let sum = chosen.iter().map(|&(_, w)| w as f64).sum::<f64>() as f32;
                // ggml's clamp to F16's smallest normal, 2^-14, against a division by zero.
                const LEAST: f32 = 1.0 / 16384.0;
                let sum = if sum > LEAST { sum } else { LEAST };
                chosen.iter_mut().for_each(|(_, w)| *w /= sum);
            }
        }
        Gating::SoftmaxOfChosen => {
            choose(probs, chosen);
            let k = chosen.len();
            for (p, &(_, l)) in probs.iter_mut().zip(chosen.iter()) {
                *p = l;
            }
            softmax(&mut probs[..k]);
            for (c, &p) in chosen.iter_mut().zip(probs.iter()) {
                c.1 = p;
            }
        }
    }
}

/// The `chosen.len()` largest of `v` (expert, value), largest first; of equal values, the
/// lower index first (the order llama.cpp's sort gives up to sixteen experts). `v` is left as
/// it was.
fn choose(v: &mut [f32], chosen: &mut [(u32, f32)]) {
    // A chosen expert's value is set below any other's, so that each pass takes the next.
    for c in chosen.iter_mut() {
        let (mut e, mut best) = (0, v[0]);
        for (i, &p) in v.iter().enumerate().skip(1) {
            if p > best {
                (e, best) = (i, p);
            }
        }
        *c = (e as u32, best);
        v[e] = f32::NEG_INFINITY;
    }
    for &(e, p) in chosen.iter() {
        v[e as usize] = p;
    }
}

/// ggml's `soft_max` of one row, in place, as the reference CPU (an AVX-512 build) computes
/// it: `e^(x - max)` by [`expf_ggml`] in groups of sixteen, each group's sum added to an f64
/// total in `_mm512_reduce_add_ps`'s order, libm's `expf` on the tail; then each value times
/// the f32 of the total's inverse.
fn softmax(v: &mut [f32]) {
    let max = v
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if m > x { m } else { x });
    let body = v.len() / 16 * 16;
    let mut sum = 0.0f64;
    for p in v[..body].chunks_exact_mut(16) {
        let e: [f32; 16] = std::array::from_fn(|i| expf_ggml(p[i] - max));
        p.copy_from_slice(&e);
        sum += reduce_add_16(e) as f64;
    }
    for p in &mut v[body..] {
        *p = (*p - max).exp();
        sum += *p as f64;
    }
    let inv = (1.0 / sum) as f32;
    v.iter_mut().for_each(|p| *p *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_the_most_probable_in_order_and_normalises() {
        let logits: Vec<f32> = (0..20).map(|i| ((i * 7) % 20) as f32 * 0.3).collect();
        let mut probs = vec![0.0; 20];
        let mut chosen = vec![(0, 0.0); 3];
        route(
            &logits,
            &mut probs,
            &mut chosen,
            Gating::Softmax { norm: false },
        );
        let total: f32 = probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
        let mut order: Vec<usize> = (0..20).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let got: Vec<usize> = chosen.iter().map(|&(e, _)| e as usize).collect();
        assert_eq!(got, order[..3]);
        assert_eq!(chosen[0].1, probs[order[0]]);
        route(
            &logits,
            &mut probs,
            &mut chosen,
            Gating::Softmax { norm: true },
        );
        let s: f32 = chosen.iter().map(|c| c.1).sum();
        assert!((s - 1.0).abs() < 1e-6 && chosen[0].1 > chosen[1].1);
    }

    #[test]
    fn gpt_oss_weights_are_a_softmax_of_the_chosen_logits() {
        let logits = [0.5, -1.0, 3.0, 2.0, 2.5, -4.0];
        let (mut probs, mut chosen) = (vec![0.0; 6], vec![(0, 0.0); 3]);
        route(&logits, &mut probs, &mut chosen, Gating::SoftmaxOfChosen);
        let got: Vec<u32> = chosen.iter().map(|c| c.0).collect();
        assert_eq!(got, [2, 4, 3]);
        let z: f64 = [3.0f64, 2.5, 2.0].iter().map(|l| (l - 3.0).exp()).sum();
        for (&(_, w), l) in chosen.iter().zip([3.0f64, 2.5, 2.0]) {
            assert!((w as f64 - (l - 3.0).exp() / z).abs() < 1e-6, "{chosen:?}");
        }
    }

    #[test]
    fn ties_go_to_the_lower_expert() {
        let logits = [1.0, 2.0, 2.0, 0.5, 2.0];
        let (mut probs, mut chosen) = (vec![0.0; 5], vec![(0, 0.0); 4]);
        route(
            &logits,
            &mut probs,
            &mut chosen,
            Gating::Softmax { norm: true },
        );
        let got: Vec<u32> = chosen.iter().map(|c| c.0).collect();
        assert_eq!(got, [1, 2, 4, 0]);
    }
}
