//! Batched passes over several sequences (what a server's step runs) give each sequence the
//! bits it gets alone: prompts split into chunks of any size beside other sequences' chunks
//! and decode steps, on SmolLM2, Gemma 3 and the mixtures of experts (joint passes) and Qwen
//! 3.5's mixture (one sequence after another), at 1 to 13 threads.

mod common;
use common::*;

use synapse_engine::{load, Batch, Logits, Model, Seq, State, Threads};
use synapse_gguf::GgufFile;

/// Three prompts of different lengths from a model's vocabulary.
fn prompts(n_vocab: usize) -> Vec<Vec<u32>> {
    [5usize, 11, 17]
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            (0..n)
                .map(|i| ((i * 7919 + k * 104_729 + 1) % n_vocab) as u32)
                .collect()
        })
        .collect()
}

/// Each sequence fed in the chunks `plan` gives it, pass by pass (`plan[pass][seq]`: a
/// number of tokens, 0 for none), every chunk asking for all its rows' logits: the rows, per
/// sequence, in order.
fn batched(
    model: &dyn Model,
    batch: &mut Batch,
    seqs: &[Vec<u32>],
    plan: &[[usize; 3]],
    threads: usize,
) -> Vec<Vec<f32>> {
    let n_vocab = model.info().n_vocab;
    let threads = Threads::new(threads);
    // States with the least scratch a joint pass needs: one token's.
    let scratch = if batch.is_joint() { 1 } else { 32 };
    let mut states: Vec<State> = (0..3)
        .map(|_| model.new_state(64, scratch).unwrap())
        .collect();
    let mut fed = [0usize; 3];
    let mut rows = vec![Vec::new(); 3];
    for pass in plan {
        let mut out = vec![f32::NAN; pass.iter().sum::<usize>() * n_vocab];
        let mut list: Vec<Seq> = Vec::new();
        let mut which = Vec::new();
        for ((i, st), &n) in states.iter_mut().enumerate().zip(pass) {
            if n == 0 {
                continue;
            }
            list.push(Seq {
                state: st,
                tokens: &seqs[i][fed[i]..fed[i] + n],
                logits: Logits::All,
            });
            which.push((i, n));
            fed[i] += n;
        }
        model
            .forward_batch(batch, &mut list, &mut out, &threads)
            .unwrap();
        let mut at = 0;
        for (i, n) in which {
            rows[i].extend_from_slice(&out[at..at + n * n_vocab]);
            at += n * n_vocab;
        }
    }
    rows
}

fn check(path: std::path::PathBuf, joint: bool) {
    let file = GgufFile::open(path).unwrap();
    let model = load(&file).unwrap();
    let seqs = prompts(model.info().n_vocab);
    let alone: Vec<Vec<f32>> = seqs.iter().map(|s| run(model.as_ref(), s, 64, 1)).collect();
    let mut batch = model.new_batch(24).unwrap();
    assert_eq!(batch.is_joint(), joint);
    // Prompts in chunks beside each other, then beside single tokens (decode steps), then
    // single tokens alone, then single tokens together: every sequence's 5, 11 and 17 tokens.
    let plans: [&[[usize; 3]]; 4] = [
        &[[5, 4, 9], [0, 7, 8]],
        &[[1, 3, 2], [1, 8, 1], [1, 0, 14], [2, 0, 0]],
        &[[1, 11, 1], [1, 0, 1], [1, 0, 15], [1, 0, 0], [1, 0, 0]],
        // Every sequence one token a pass (attention for all of them in one call).
        &[
            [1, 1, 1],
            [1, 1, 1],
            [1, 1, 1],
            [1, 1, 1],
            [1, 1, 1],
            [0, 6, 12],
        ],
    ];
    for (p, plan) in plans.iter().enumerate() {
        for threads in [1, 2, 3, 13] {
            let got = batched(model.as_ref(), &mut batch, &seqs, plan, threads);
            for i in 0..3 {
                assert!(
                    got[i] == alone[i],
                    "plan {p}, {threads} threads: sequence {i} differs from its run alone"
                );
            }
        }
    }
}

#[test]
fn smollm2_joint_passes_give_each_sequence_its_own_bits() {
    check(model_path("SmolLM2-135M-Instruct.Q4_1.gguf"), true);
}

#[test]
fn gemma3_joint_passes_give_each_sequence_its_own_bits() {
    check(model_path("gemma-3-270m-q4_k_m.gguf"), true);
}

/// Mixtures of experts: sequences whose tokens share experts in one pass (and Qwen 3.5's, one
/// after another) give each sequence its own bits.
#[test]
fn mixtures_give_each_sequence_its_own_bits() {
    check(data("tiny-qwen3moe-Q4_K.gguf"), true);
    check(data("tiny-llamamoe-Q8_0.gguf"), true);
    check(data("tiny-qwen35moe-Q4_K.gguf"), false);
}

/// Past Gemma 3's sliding window (512 positions): the local layers' runs see only their last
/// 512 positions, in chunks and one token at a time beside another sequence.
#[test]
fn gemma3_joint_passes_keep_the_sliding_window() {
    let file = GgufFile::open(model_path("gemma-3-270m-q4_k_m.gguf")).unwrap();
    let model = load(&file).unwrap();
    let n_vocab = model.info().n_vocab;
    let long: Vec<u32> = (0..530)
        .map(|i| ((i * 7919 + 3) % n_vocab) as u32)
        .collect();
    let short: Vec<u32> = (0..7)
        .map(|i| ((i * 104_729 + 5) % n_vocab) as u32)
        .collect();
    let threads = Threads::new(2);
    let mut alone = model.new_state(600, 64).unwrap();
    let want = model
        .prefill(&mut alone, &long, 64, Logits::All, &threads)
        .unwrap();
    let mut batch = model.new_batch(600).unwrap();
    let (mut a, mut b) = (
        model.new_state(600, 1).unwrap(),
        model.new_state(600, 1).unwrap(),
    );
    let mut got = Vec::new();
    let mut fed = 0;
    // 515 tokens in one pass, then one token a pass beside the short sequence's tokens.
    for n in [515].into_iter().chain(std::iter::repeat_n(1, 15)) {
        let mut out = vec![0.0; (n + 1) * n_vocab];
        let i = (fed % short.len()).min(short.len() - 1);
        b.reset();
        let mut seqs = [
            Seq {
                state: &mut a,
                tokens: &long[fed..fed + n],
                logits: Logits::All,
            },
            Seq {
                state: &mut b,
                tokens: &short[i..i + 1],
                logits: Logits::Last,
            },
        ];
        model
            .forward_batch(&mut batch, &mut seqs, &mut out, &threads)
            .unwrap();
        got.extend_from_slice(&out[..n * n_vocab]);
        fed += n;
    }
    assert!(got == want, "the long sequence differs from its run alone");
}

#[test]
fn a_batch_larger_than_its_scratch_or_a_foreign_state_is_refused() {
    let file = GgufFile::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let model = load(&file).unwrap();
    let other = load(&file).unwrap();
    let mut batch = model.new_batch(4).unwrap();
    let threads = Threads::new(1);
    let mut st = model.new_state(16, 1).unwrap();
    let mut out = vec![0.0; model.info().n_vocab];
    let tokens = [1u32, 2, 3, 4, 5];
    let mut seqs = [Seq {
        state: &mut st,
        tokens: &tokens,
        logits: Logits::Last,
    }];
    let e = model
        .forward_batch(&mut batch, &mut seqs, &mut out, &threads)
        .unwrap_err();
    assert!(e.to_string().contains('5'), "{e}");
    let mut foreign = other.new_state(16, 1).unwrap();
    let mut seqs = [Seq {
        state: &mut foreign,
        tokens: &tokens[..2],
        logits: Logits::Last,
    }];
    assert!(model
        .forward_batch(&mut batch, &mut seqs, &mut out, &threads)
        .is_err());
    assert_eq!(foreign.pos, 0);
}

#[test]
fn a_prefix_copied_from_another_state_gives_the_bits_of_feeding_it() {
    let file = GgufFile::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let model = load(&file).unwrap();
    let threads = Threads::new(2);
    let ids = &prompts(model.info().n_vocab)[2];
    let alone = run(model.as_ref(), ids, 64, 1);
    let n_vocab = model.info().n_vocab;
    let mut src = model.new_state(64, 32).unwrap();
    model
        .prefill(&mut src, &ids[..12], 32, Logits::None, &threads)
        .unwrap();
    // A state that held other tokens takes the first 9 of them, then feeds the rest.
    let mut dst = model.new_state(32, 32).unwrap();
    model
        .prefill(&mut dst, &[3, 1, 4, 1, 5], 32, Logits::None, &threads)
        .unwrap();
    assert!(!dst.copy_prefix(&src, 13), "past what the source holds");
    assert!(dst.copy_prefix(&src, 9));
    assert_eq!(dst.pos, 9);
    let rest = model
        .prefill(&mut dst, &ids[9..], 32, Logits::All, &threads)
        .unwrap();
    assert!(rest == alone[9 * n_vocab..]);
    let other = load(&file).unwrap();
    let foreign = other.new_state(64, 32).unwrap();
    assert!(!dst.copy_prefix(&foreign, 0));
}
