//! The engine's generation loop on SmolLM2: its text is the tokens' text, stop strings cut it
//! exactly, a prompt that extends the last one reuses the state (same bits as a fresh one),
//! and a seeded request draws the same tokens whatever ran before it.

mod common;
use common::*;

use synapse_engine::generate::{Generator, Outcome, Request, StopReason};
use synapse_engine::sampler::SamplerConfig;
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::{load, Model, Threads};
use synapse_gguf::GgufFile;

fn generate(
    gen: &mut Generator,
    prompt: &[u32],
    max_tokens: usize,
    stop: &[String],
    sampling: SamplerConfig,
) -> (String, Outcome) {
    let threads = Threads::new(2);
    let req = Request {
        prompt,
        max_tokens,
        stop,
        sampling,
    };
    let mut text = String::new();
    let out = gen
        .start(&req, &threads)
        .unwrap()
        .run(|piece| text.push_str(piece))
        .unwrap();
    (text, out)
}

fn setup() -> (GgufFile, Tokenizer) {
    let file = GgufFile::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let tok = Tokenizer::from_metadata(file.metadata()).unwrap();
    (file, tok)
}

#[test]
fn text_is_the_tokens_text_and_stop_strings_cut_it() {
    let (file, tok) = setup();
    let model = load(&file).unwrap();
    let prompt = tok.encode("Write a list of five fruits, one per line:\n", false, true);
    let mut gen = Generator::new(model.as_ref(), &tok, 256, 64).unwrap();
    let (text, out) = generate(&mut gen, &prompt, 48, &[], SamplerConfig::greedy());
    assert_eq!(out.stop, StopReason::Length);
    assert_eq!(out.tokens.len(), 48);
    assert_eq!(text, tok.decode(&out.tokens));
    assert_eq!(out.timings.prompt_tokens, prompt.len());

    // A stop string from the middle of that text, spanning a token boundary where one does:
    // the text ends just before it, and the tokens stop at the one that completed it.
    let at = text.len() / 2;
    let at = (at..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap();
    let end = (at + 5..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap();
    let stop = text[at..end].to_string();
    let first = text.find(&stop).unwrap();
    let (cut, out) = generate(
        &mut gen,
        &prompt,
        48,
        &["never there".into(), stop.clone()],
        SamplerConfig::greedy(),
    );
    assert_eq!(out.stop, StopReason::StopString);
    assert_eq!(cut, text[..first], "stop {stop:?}");
    assert!(out.tokens.len() < 48 && tok.decode(&out.tokens).contains(&stop));

    // No tokens asked: no text. One token: its text.
    let (t0, out) = generate(&mut gen, &prompt, 0, &[], SamplerConfig::greedy());
    assert!(t0.is_empty() && out.tokens.is_empty() && out.stop == StopReason::Length);
    let (t1, _) = generate(&mut gen, &prompt, 1, &[], SamplerConfig::greedy());
    assert!(text.starts_with(&t1) && !t1.is_empty());
}

/// A chat's next turn extends the last prompt and reply: only the new tokens are fed, and the
/// continuation is bit for bit a fresh generator's. A full context stops with its reason.
#[test]
fn a_longer_prompt_reuses_the_state_and_changes_no_bit() {
    let (file, tok) = setup();
    let model = load(&file).unwrap();
    let model: &dyn Model = model.as_ref();
    let first = tok.encode("The capital of France is", false, true);
    let mut gen = Generator::new(model, &tok, 128, 7).unwrap();
    let (_, out) = generate(&mut gen, &first, 12, &[], SamplerConfig::greedy());
    let mut next = gen.held().to_vec();
    assert_eq!(next[..first.len()], first[..]);
    next.extend(tok.encode(" And of Spain?", false, true));
    let (text, out2) = generate(&mut gen, &next, 12, &[], SamplerConfig::greedy());
    assert_eq!(
        out2.timings.cached_tokens,
        first.len() + out.tokens.len() - 1
    );

    let mut fresh = Generator::new(model, &tok, 128, 7).unwrap();
    let (want, out3) = generate(&mut fresh, &next, 12, &[], SamplerConfig::greedy());
    assert_eq!(out3.timings.cached_tokens, 0);
    assert_eq!(out2.tokens, out3.tokens);
    assert_eq!(text, want);

    let mut small = Generator::new(model, &tok, first.len() + 3, 64).unwrap();
    let (_, out) = generate(&mut small, &first, 100, &[], SamplerConfig::greedy());
    assert_eq!(out.stop, StopReason::ContextFull);
    // Three fed into the context's last three places, and the one their logits gave.
    assert_eq!(out.tokens.len(), 4);
}

/// A seeded request draws the same tokens on a fresh generator and after other requests.
#[test]
fn a_seeded_request_does_not_depend_on_what_ran_before() {
    let (file, tok) = setup();
    let model = load(&file).unwrap();
    let prompt = tok.encode("Once upon a time", false, true);
    let sampling = SamplerConfig {
        seed: 1234,
        ..SamplerConfig::default()
    };
    let mut a = Generator::new(model.as_ref(), &tok, 256, 64).unwrap();
    let (want, _) = generate(&mut a, &prompt, 24, &[], sampling.clone());
    let other = SamplerConfig {
        seed: 99,
        ..sampling.clone()
    };
    let (_, _) = generate(&mut a, &prompt, 24, &[], other);
    let (got, _) = generate(&mut a, &prompt, 24, &[], sampling.clone());
    assert_eq!(got, want);
    let mut b = Generator::new(model.as_ref(), &tok, 256, 3).unwrap();
    let (got, _) = generate(&mut b, &prompt, 24, &[], sampling);
    assert_eq!(got, want);
}
