//! Speculative decoding gives plain decoding's output, token for token and logit for logit:
//! greedy and seeded sampling, prompt lookup and a draft model, several guess lengths and
//! thread counts, on SmolLM2, Gemma 3 and random-weight files of the llama, Qwen2, Qwen3 and
//! Qwen 3.5 architectures (whose recurrent state must roll back too). Each case also checks
//! that guesses were both accepted and rejected, so that both paths ran.

mod common;
use common::*;

use synapse_engine::generate::{Generator, Request, Timings};
use synapse_engine::sampler::SamplerConfig;
use synapse_engine::speculate::{DraftModel, Lookup, Speculation};
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::{load, Model, ModelError, Threads};
use synapse_gguf::{GgmlType, GgufFile, GgufWriter};

/// What a generation gives: its tokens, the logits each token was drawn from, its timings.
struct Run {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    timings: Timings,
}

fn decode(
    model: &dyn Model,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    sampling: &SamplerConfig,
    spec: Option<Speculation>,
    threads: usize,
) -> Run {
    let threads = Threads::new(threads);
    let mut gen = Generator::new(model, tok, prompt.len() + n + 8, 16).unwrap();
    gen.speculate(spec).unwrap();
    let req = Request {
        prompt,
        max_tokens: n,
        stop: &[],
        sampling: sampling.clone(),
    };
    let mut g = gen.start(&req, &threads).unwrap();
    let mut logits = Vec::new();
    loop {
        let row = g.logits().to_vec();
        if g.next_piece().unwrap().is_none() {
            break;
        }
        logits.push(row);
    }
    let out = g.finish();
    Run {
        tokens: out.tokens,
        logits,
        timings: out.timings,
    }
}

fn sampled(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temp: 0.7,
        seed,
        ..SamplerConfig::default()
    }
}

/// Plain decoding's run against speculative ones (`make` builds the speculation for a guess
/// length): the same tokens and the same logits bits. Returns the guesses accepted and
/// rejected over all of them.
fn check(
    label: &str,
    model: &dyn Model,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    make: &dyn Fn(usize) -> Speculation<'static>,
    ks: &[usize],
) -> [usize; 2] {
    let mut accepted = 0;
    let mut rejected = 0;
    // Hot sampling too: the whole vocabulary in play, where guesses go wrong most.
    let hot = SamplerConfig {
        temp: 1.5,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 11,
        ..SamplerConfig::default()
    };
    for sampling in [SamplerConfig::greedy(), sampled(7), hot] {
        let plain = decode(model, tok, prompt, n, &sampling, None, 2);
        assert_eq!(plain.timings.drafted, 0);
        for &k in ks {
            for threads in [1, 3] {
                let what = format!("{label}, temp {}, k {k}, {threads} threads", sampling.temp);
                let spec = decode(model, tok, prompt, n, &sampling, Some(make(k)), threads);
                assert_eq!(spec.tokens, plain.tokens, "{what}: tokens");
                assert_eq!(spec.logits.len(), plain.logits.len(), "{what}");
                for (i, (a, b)) in spec.logits.iter().zip(&plain.logits).enumerate() {
                    assert!(
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{what}: the logits of token {i} differ"
                    );
                }
                let t = &spec.timings;
                assert!(t.accepted <= t.drafted, "{what}: {t:?}");
                assert_eq!(
                    t.decode_steps + t.accepted,
                    plain.timings.decode_steps,
                    "{what}: every token a pass or an accepted guess: {t:?}"
                );
                accepted += t.accepted;
                rejected += t.drafted - t.accepted;
            }
        }
    }
    [accepted, rejected]
}

/// Both paths ran: guesses accepted and guesses rejected.
fn assert_both(label: &str, counts: &[[usize; 2]]) {
    let [a, r] = counts
        .iter()
        .fold([0, 0], |s, c| [s[0] + c[0], s[1] + c[1]]);
    assert!(
        a > 0 && r > 0,
        "{label}: {a} guesses accepted, {r} rejected: both paths must run"
    );
}

/// A file's model and tokenizer, leaked: the speculations the tests build borrow them for
/// as long as the test runs.
fn open(path: std::path::PathBuf) -> (&'static dyn Model, &'static Tokenizer) {
    let file: &'static GgufFile = Box::leak(Box::new(GgufFile::open(path).unwrap()));
    let tok = Box::leak(Box::new(Tokenizer::from_metadata(file.metadata()).unwrap()));
    (Box::leak(load(file).unwrap()), tok)
}

/// A draft that agrees with `path`'s model often but not always: the same file with its
/// final norm's weights scaled channel by channel.
fn perturbed(path: std::path::PathBuf) -> (&'static dyn Model, &'static Tokenizer) {
    let src = GgufFile::open(path).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    let mut scaled = false;
    for t in src.tensors() {
        let data: std::borrow::Cow<[u8]> = if t.info.name == "output_norm.weight" {
            assert_eq!(t.info.ggml_type, GgmlType::F32);
            scaled = true;
            t.data
                .chunks(4)
                .enumerate()
                .map(|(i, b)| {
                    let x = f32::from_le_bytes(b.try_into().unwrap());
                    x * (1.0 + 0.5 * ((i * 7) as f32).sin())
                })
                .flat_map(f32::to_le_bytes)
                .collect::<Vec<u8>>()
                .into()
        } else {
            t.data.into()
        };
        w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, data)
            .unwrap();
    }
    assert!(scaled, "no output_norm.weight");
    let file: &'static GgufFile = Box::leak(Box::new(
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap(),
    ));
    let tok = Box::leak(Box::new(Tokenizer::from_metadata(file.metadata()).unwrap()));
    (Box::leak(load(file).unwrap()), tok)
}

fn lookup(k: usize) -> Speculation<'static> {
    Speculation::lookup(Lookup::default(), k)
}

/// A prompt that asks for its own text again: code to be edited.
const CODE: &str = "Rename the variable `total` to `sum` in this function:\n\n\
    def add_all(values):\n    total = 0\n    for v in values:\n        total = total + v\n    \
    return total\n\nThe function with `total` renamed to `sum`:\n\ndef add_all(values):\n";

#[test]
fn smollm2_lookup_and_draft_give_plain_output() {
    let path = || model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    let (model, tok) = open(path());
    let prompt = tok.encode(CODE, false, true);
    let looked = check(
        "SmolLM2 lookup",
        model,
        tok,
        &prompt,
        40,
        &lookup,
        &[1, 3, 8],
    );
    assert_both("SmolLM2 lookup", &[looked]);

    // The same file as its own draft agrees on every token, greedy or sampled (the draft
    // draws what the target draws: the same random stream, position by position); a second
    // copy, whose own state must follow the target's.
    let (same, stok) = open(path());
    let n_ctx = prompt.len() + 64;
    let greedy = SamplerConfig::greedy();
    for sampling in [greedy, sampled(3)] {
        let d = DraftModel::new(same, stok, model, tok, n_ctx, 16).unwrap();
        let spec = decode(
            model,
            tok,
            &prompt,
            24,
            &sampling,
            Some(Speculation::draft_model(d, 4)),
            2,
        );
        assert_eq!(
            spec.tokens,
            decode(model, tok, &prompt, 24, &sampling, None, 2).tokens
        );
        let t = &spec.timings;
        assert!(t.accepted == t.drafted && t.drafted > 0, "{t:?}");
    }
    let (draft, dtok) = perturbed(path());
    let make = |k| {
        Speculation::draft_model(
            DraftModel::new(draft, dtok, model, tok, n_ctx, 16).unwrap(),
            k,
        )
    };
    let drafted = check("SmolLM2 drafted", model, tok, &prompt, 40, &make, &[2, 6]);
    assert_both("SmolLM2 drafted", &[drafted]);
}

#[test]
fn gemma3_lookup_and_draft_give_plain_output() {
    let path = || model_path("gemma-3-270m-q4_k_m.gguf");
    let (model, tok) = open(path());
    let prompt = tok.encode(CODE, true, true);
    let looked = check("Gemma 3 lookup", model, tok, &prompt, 32, &lookup, &[2, 6]);
    let (draft, dtok) = perturbed(path());
    let n_ctx = prompt.len() + 64;
    let make = |k| {
        Speculation::draft_model(
            DraftModel::new(draft, dtok, model, tok, n_ctx, 16).unwrap(),
            k,
        )
    };
    let drafted = check("Gemma 3 drafted", model, tok, &prompt, 32, &make, &[3]);
    assert_both("Gemma 3", &[looked, drafted]);
}

/// Random-weight files, drafted by themselves perturbed (often right) and by lookup in their
/// output (seldom right). The Qwen3 files' output (the dense and the mixture) is one token over
/// and over, which lookup always guesses: a Qwen2 file with the same vocabulary drafts them,
/// seldom right.
#[test]
fn random_weight_architectures_roll_back_exactly() {
    let ids: Vec<u32> = (0..24).map(|i| 1 + (i * 37) % 250).collect();
    for (name, other) in [
        ("tiny-Q4_K", None),
        ("tiny-qwen2-Q8_0", None),
        ("tiny-qwen3-Q4_K", Some("tiny-qwen2-Q8_0")),
        ("tiny-qwen35-Q4_K", None),
        ("tiny-qwen3moe-Q4_K", Some("tiny-qwen2-Q8_0")),
        ("tiny-qwen35moe-Q4_K", None),
    ] {
        let path = |name: &str| data(&format!("{name}.gguf"));
        let (model, tok) = open(path(name));
        let (draft, dtok) = match other {
            Some(o) => open(path(o)),
            None => perturbed(path(name)),
        };
        let n = 48;
        let looked = check(name, model, tok, &ids, n, &lookup, &[2, 5]);
        let make = |k| {
            let d = DraftModel::new(draft, dtok, model, tok, ids.len() + n + 8, 16).unwrap();
            Speculation::draft_model(d, k)
        };
        let drafted = check(&format!("{name} drafted"), model, tok, &ids, n, &make, &[3]);
        assert_both(name, &[looked, drafted]);
        if other.is_none() {
            // Guesses accepted and then one rejected within a pass: the partial rollback.
            assert_both(&format!("{name} drafted"), &[drafted]);
        }
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let (model, tok) = open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf"));
    let (other, otok) = open(model_path("gemma-3-270m-q4_k_m.gguf"));
    let e = DraftModel::new(other, otok, model, tok, 64, 8)
        .err()
        .unwrap();
    assert!(matches!(e, ModelError::DraftVocabulary(_)), "{e}");
    assert!(e.to_string().contains("vocabulary"), "{e}");
}

#[test]
fn lookup_guesses_what_followed_the_longest_earlier_match() {
    let l = Lookup::default();
    let guess = |ctx: &[u32], k| {
        let mut out = Vec::new();
        l.draft(ctx, k, &mut out);
        out
    };
    // "1 2 3" recurs: what followed its latest occurrence.
    assert_eq!(
        guess(&[1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2),
        [7, 8]
    );
    // The longest match wins over a later shorter one.
    assert_eq!(guess(&[5, 2, 3, 6, 9, 2, 3, 7, 5, 2, 3], 3), [6, 9, 2]);
    // Up to the end of the sequence, no further.
    assert_eq!(guess(&[4, 4, 4], 5), [4]);
    // One token in common is not enough; nothing recurs, nothing guessed.
    assert!(guess(&[1, 2, 3, 9, 3], 4).is_empty());
    assert!(guess(&[1], 4).is_empty() && guess(&[], 4).is_empty());
}
