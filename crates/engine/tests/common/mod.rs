//! Helpers shared by the forward-pass tests: golden-file readers and the arithmetic of the
//! comparisons.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

use synapse_engine::generate::{Generator, Request, StopReason};
use synapse_engine::sampler::SamplerConfig;
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::{Logits, Model, Threads};
use synapse_gguf::{GgmlType, GgufFile};

/// The kernel configuration `scripts/test.sh` runs these tests under (`SYNAPSE_ISA=avx2`,
/// ...), as the synapse binary takes it; and `SYNAPSE_DUMP_DIR`, to debug a test. Set before
/// the first model loads: every test opens its files through [`data`] or [`model_path`].
pub fn kernels_from_env() {
    let (c, notes) = synapse_quant::KernelConfig::from_vars(|k| std::env::var(k).ok());
    assert!(notes.is_empty(), "{notes:?}");
    synapse_quant::configure(c).expect("one configuration for the whole test binary");
    if let Some(dir) = std::env::var_os("SYNAPSE_DUMP_DIR") {
        synapse_engine::set_dump_dir(dir.into());
    }
}

/// A file under `tests/data/forward`.
pub fn data(name: &str) -> PathBuf {
    kernels_from_env();
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/forward")
        .join(name)
}

/// A model the fetch script brings; a missing one fails the test with the command to run.
pub fn model_path(name: &str) -> PathBuf {
    kernels_from_env();
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

pub fn ints(f: &GgufFile, name: &str) -> Vec<u32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.info.ggml_type, GgmlType::I32);
    t.data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

pub fn floats(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.info.ggml_type, GgmlType::F32);
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x.iter().map(|&v| v as f64 - lse).collect()
}

pub fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

/// Logits of every position, feeding `ids` in batches of `batch` on `threads` threads.
pub fn run(model: &dyn Model, ids: &[u32], batch: usize, threads: usize) -> Vec<f32> {
    let mut st = model.new_state(ids.len(), batch).unwrap();
    model
        .prefill(&mut st, ids, batch, Logits::All, &Threads::new(threads))
        .unwrap()
}

/// D1: `want`, the logits of every position of `ids` on one thread, again on thread counts far
/// above this machine's cores and above the model's heads (a 9-head model on a 64-core
/// machine): 2, 3 and 5 threads over every position at batches of 64, and 8 to 64 threads over
/// the first 24 at batches of 7 (prefill and a tail) and the first 6 one token at a time.
pub fn assert_d1(label: &str, model: &dyn Model, ids: &[u32], want: &[f32]) {
    let n_vocab = model.info().n_vocab;
    for threads in [2, 3, 5] {
        let got = run(model, ids, 64, threads);
        assert!(got == want, "{label}: {threads} threads differ");
    }
    for threads in [8, 13, 32, 64] {
        for (n, batch) in [(24, 7), (6, 1)] {
            let n = n.min(ids.len());
            let got = run(model, &ids[..n], batch, threads);
            assert!(
                got == want[..n * n_vocab],
                "{label}: {threads} threads (batch {batch}) differ"
            );
        }
    }
}

/// A prompt prefilled for its last logits alone (`Logits::Last`: the batches before the last
/// keep only their keys and values from the last layer, the last batch goes on through it with
/// its last row alone) gives row `ids.len() - 1` of `all`, the logits of every position of
/// `ids` and one token more, to the bit, at batch sizes 1, 7, 64 and 93; and the cache it
/// leaves gives that next token row `ids.len()` of `all`.
pub fn last_logits_match_all(label: &str, model: &dyn Model, ids: &[u32], all: &[f32]) {
    let n_vocab = model.info().n_vocab;
    let n = ids.len();
    assert_eq!(
        all.len(),
        (n + 1) * n_vocab,
        "{label}: `all` holds n + 1 rows"
    );
    let next = next_token(model);
    let threads = Threads::new(2);
    for batch in [1, 7, 64, 93] {
        let mut st = model.new_state(n + 1, batch).unwrap();
        let last = model
            .prefill(&mut st, ids, batch, Logits::Last, &threads)
            .unwrap();
        assert!(
            last == all[(n - 1) * n_vocab..n * n_vocab],
            "{label}: batch {batch}: the last logits differ from those of every position"
        );
        let mut after = vec![0.0; n_vocab];
        model
            .forward(&mut st, &[next], Logits::Last, &mut after, &threads)
            .unwrap();
        assert!(
            after == all[n * n_vocab..],
            "{label}: batch {batch}: the token after a last-logits prefill differs"
        );
    }
}

/// The token [`last_logits_match_all`] feeds after a prompt: any id of the vocabulary.
fn next_token(model: &dyn Model) -> u32 {
    model.info().n_vocab as u32 / 3
}

/// `ids` and the token [`last_logits_match_all`] feeds after them.
pub fn with_next(model: &dyn Model, ids: &[u32]) -> Vec<u32> {
    let mut v = ids.to_vec();
    v.push(next_token(model));
    v
}

/// How synapse's logits compare with a golden file's top-K log-probabilities.
pub struct Agreement {
    pub mean_kl: f64,
    pub max_kl: f64,
    /// Fraction of positions whose argmax is the reference's most likely token.
    pub top1: f64,
}

/// Compare `logits` (`(n_positions, n_vocab)`) with the reference's top-`k` token ids and
/// log-probabilities per position: KL(reference || synapse) over those `k` tokens plus one
/// bucket for the rest, and top-1 agreement. Prints a summary (and, with `SYNAPSE_SHOW_KL`, each
/// position whose KL is not ~0) under `label`.
pub fn agreement(
    label: &str,
    logits: &[f32],
    n_vocab: usize,
    top_ids: &[u32],
    top_logp: &[f32],
    k: usize,
) -> Agreement {
    let n = logits.len() / n_vocab;
    let (mut kl_sum, mut max_kl, mut agree) = (0.0, 0.0f64, 0);
    let mut buckets = vec![0.0f64; n.div_ceil(100)];
    for (p, row) in logits.chunks(n_vocab).enumerate() {
        let ours = log_softmax(row);
        let tid = &top_ids[p * k..(p + 1) * k];
        let tlp = &top_logp[p * k..(p + 1) * k];
        let mut kl = 0.0;
        let (mut ref_top, mut our_top) = (0.0, 0.0);
        for (&id, &lp) in tid.iter().zip(tlp) {
            let lp = lp as f64;
            kl += lp.exp() * (lp - ours[id as usize]);
            ref_top += lp.exp();
            our_top += ours[id as usize].exp();
        }
        let (ref_tail, our_tail) = ((1.0 - ref_top).max(1e-12), (1.0 - our_top).max(1e-12));
        kl += ref_tail * (ref_tail / our_tail).ln();
        if std::env::var_os("SYNAPSE_SHOW_KL").is_some() && kl > 1e-9 {
            eprintln!("position {p}: KL {kl:.2e}");
        }
        kl_sum += kl;
        buckets[p / 100] += kl / 100.min(n - p / 100 * 100) as f64;
        max_kl = max_kl.max(kl);
        agree += (argmax(row) == tid[0] as usize) as usize;
    }
    let a = Agreement {
        mean_kl: kl_sum / n as f64,
        max_kl,
        top1: agree as f64 / n as f64,
    };
    eprintln!(
        "{label} vs llama.cpp over {n} positions: mean KL {:.2e}, max KL {:.2e}, top-1 {:.2}%",
        a.mean_kl,
        a.max_kl,
        100.0 * a.top1
    );
    let by_100: Vec<String> = buckets.iter().map(|k| format!("{k:.1e}")).collect();
    eprintln!("mean KL by 100 positions: {by_100:?}");
    a
}

/// Up to `n` greedy tokens after `prompt` (prefilled in batches of 64), as llama.cpp's argmax
/// picks them, through the engine's generation loop: an end-of-generation token ends them
/// (and is the last).
pub fn greedy(
    model: &dyn Model,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    threads: &Threads,
) -> Vec<u32> {
    let mut gen = Generator::new(model, tok, prompt.len() + n + 1, 64).unwrap();
    let req = Request {
        prompt,
        max_tokens: n,
        stop: &[],
        sampling: SamplerConfig::greedy(),
    };
    let out = gen.start(&req, threads).unwrap().run(|_| {}).unwrap();
    let mut got = out.tokens;
    if let StopReason::EndOfGeneration(eog) = out.stop {
        got.push(eog);
    }
    got
}

/// A JSON array of token ids.
pub fn id_list(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Synapse's logits for the golden ids against llama.cpp's: the bounds, then the bits;
/// then G1 (batch sizes 1, 7, 64, 93) and D1 (1 to 64 threads), bit for bit, and a prefill for
/// the last logits alone against them ([`last_logits_match_all`]).
pub fn check_golden(file_name: &str, arch: &str) {
    let file = GgufFile::open(data(&format!("{file_name}.gguf"))).unwrap();
    let model = synapse_engine::load(&file).unwrap();
    assert_eq!(model.info().arch, arch);
    let golden = GgufFile::open(data(&format!("{file_name}.logits.gguf"))).unwrap();
    let ids = ints(&golden, "ids");
    let want = floats(&golden, "logits");
    let n_vocab = model.info().n_vocab;
    assert!(
        ids.len() > 93,
        "the golden ids must outrun the largest batch"
    );

    let got = run(model.as_ref(), &ids, 1, 1);
    let (mut kl_sum, mut agree) = (0.0, 0);
    for (g, w) in got.chunks(n_vocab).zip(want.chunks(n_vocab)) {
        let (lg, lw) = (log_softmax(g), log_softmax(w));
        kl_sum += lw
            .iter()
            .zip(&lg)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
        agree += (argmax(g) == argmax(w)) as usize;
    }
    let mean_kl = kl_sum / ids.len() as f64;
    let exact = got
        .chunks(n_vocab)
        .zip(want.chunks(n_vocab))
        .filter(|(g, w)| g == w)
        .count();
    eprintln!(
        "{file_name}: mean KL {mean_kl:.2e}, top-1 {agree}/{n}, bit-identical positions {exact}/{n}",
        n = ids.len()
    );
    assert!(mean_kl <= 1e-3, "{file_name}: mean KL {mean_kl:.3e}");
    assert!(
        agree as f64 >= 0.99 * ids.len() as f64,
        "{file_name}: top-1 {agree}/{}",
        ids.len()
    );
    // Stronger than the bounds: synapse does llama.cpp's arithmetic in its order (x86 AVX-512
    // build), so the logits are its, to the bit.
    assert!(got == want, "{file_name}: logits differ from llama.cpp's");

    for batch in [7, 64, 93] {
        assert!(
            run(model.as_ref(), &ids, batch, 1) == got,
            "{file_name}: batch {batch} differs from token by token"
        );
    }
    assert_d1(file_name, model.as_ref(), &ids, &got);
    let all = run(model.as_ref(), &with_next(model.as_ref(), &ids), 1, 1);
    last_logits_match_all(file_name, model.as_ref(), &ids, &all);
}
