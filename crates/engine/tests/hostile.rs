//! Hostile files and misuse of the API: each case here aborted the process on an allocation,
//! panicked or gave garbage before hyperparameters were checked in one pass
//! (`model/hparams.rs`); now each is a clear error that names the key (or the token, or the
//! state) at fault, and loads nothing sized by a bad value. The files are the small test models
//! with one metadata value or tensor changed ([`rewrite`]); Gemma 3's is built from the llama
//! one ([`tiny_gemma3`]).

mod common;
use common::*;

use synapse_engine::tokenizer::{Tokenizer, TokenizerError};
use synapse_engine::{load, Logits, ModelError, Threads};
use synapse_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};

fn open(name: &str) -> GgufFile {
    GgufFile::open(data(name)).unwrap()
}

fn tiny_llama() -> GgufFile {
    open("tiny-Q8_0.gguf")
}

fn tiny_qwen35() -> GgufFile {
    open("tiny-qwen35-Q4_K.gguf")
}

/// A tensor to put in a rewritten file: name, type, shape, bytes.
type NewTensor = (String, GgmlType, Vec<u64>, Vec<u8>);

/// A copy of `src` with metadata values set and tensors added or replaced (by name).
fn rewrite(src: &GgufFile, set: &[(&str, Value)], tensors: &[NewTensor]) -> GgufFile {
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    for (k, v) in set {
        w.set(*k, v.clone());
    }
    for t in src.tensors() {
        if tensors.iter().all(|n| n.0 != t.info.name) {
            w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
                .unwrap();
        }
    }
    for (name, ty, shape, data) in tensors {
        w.add_tensor(name.clone(), *ty, shape, data.as_slice())
            .unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// An F32 tensor of `shape` filled with `v`.
fn f32_tensor(name: &str, shape: &[u64], v: f32) -> NewTensor {
    let n: u64 = shape.iter().product();
    let data = (0..n).flat_map(|_| v.to_le_bytes()).collect();
    (name.into(), GgmlType::F32, shape.to_vec(), data)
}

/// A two-layer Gemma 3 (no sliding window) made of the tiny llama's weights (less its Llama 3
/// RoPE factors, which Gemma 3 has not), with unit norms for the ones Gemma 3 adds, and `set`
/// applied to its metadata (keys as Gemma 3 spells them).
fn tiny_gemma3(set: &[(&str, Value)]) -> GgufFile {
    let src = tiny_llama();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        match k.strip_prefix("llama.") {
            Some(rest) => w.set(format!("gemma3.{rest}"), v.clone()),
            None => w.set(k, v.clone()),
        };
    }
    w.set("general.architecture", Value::String("gemma3".into()));
    for (k, v) in set {
        w.set(*k, v.clone());
    }
    for t in src.tensors().filter(|t| t.info.name != "rope_freqs.weight") {
        w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
            .unwrap();
    }
    for i in 0..2 {
        for (s, n) in [
            ("attn_q_norm", 64),
            ("attn_k_norm", 64),
            ("post_attention_norm", 256),
            ("post_ffw_norm", 256),
        ] {
            let (name, ty, shape, data) = f32_tensor(&format!("blk.{i}.{s}.weight"), &[n], 1.0);
            w.add_tensor(name, ty, &shape, data).unwrap();
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// The error loading `f` gives, as text; it must name every one of `names`.
fn load_error(f: &GgufFile, names: &[&str]) -> String {
    let e = match load(f) {
        Ok(_) => panic!("loaded, expected an error naming {names:?}"),
        Err(e) => e.to_string(),
    };
    for n in names {
        assert!(e.contains(n), "`{n}` not named in: {e}");
    }
    if std::env::var_os("SHOW_ERRORS").is_some() {
        eprintln!("{e}");
    }
    e
}

/// The three small files load as they are (so that each error below is the change's).
#[test]
fn the_unaltered_files_load_and_run() {
    let threads = Threads::new(1);
    for f in [tiny_llama(), tiny_qwen35(), tiny_gemma3(&[])] {
        let model = load(&f).unwrap();
        let mut st = model.new_state(16, 8).unwrap();
        let out = model
            .prefill(&mut st, &[1, 2, 3], 8, Logits::Last, &threads)
            .unwrap();
        assert!(out.iter().all(|x| x.is_finite()));
    }
}

/// Before: Gemma 3 and Qwen 3.5 sized vectors by `block_count` before they looked for the
/// layers, and a count of 2^40 aborted the process on a terabyte allocation; a count below the
/// layers the file holds ran the first layers alone, without a word.
#[test]
fn a_block_count_that_is_not_the_layers_held_is_named() {
    let huge = Value::U64(1 << 40);
    let f = tiny_gemma3(&[("gemma3.block_count", huge.clone())]);
    load_error(&f, &["gemma3.block_count", "1099511627776", "layer 2"]);
    let f = rewrite(&tiny_qwen35(), &[("qwen35.block_count", huge.clone())], &[]);
    load_error(&f, &["qwen35.block_count", "1099511627776", "layer 4"]);
    let f = rewrite(&tiny_llama(), &[("llama.block_count", huge)], &[]);
    load_error(&f, &["llama.block_count", "1099511627776"]);
    let f = rewrite(&tiny_llama(), &[("llama.block_count", Value::U32(1))], &[]);
    load_error(&f, &["llama.block_count", "layer 1", "past the last"]);
}

/// Before: head counts whose product with the head width wraps around to the tensors' rows, and
/// a convolution of 2^55 taps whose product with the channels wraps around to the tensor's
/// size, panicked on the overflow where overflows are checked (as in these tests) and, where
/// the products wrap (release builds), passed every shape check: the cache and the attention
/// then walked 2^59 heads, the convolution's state was allocated with the wrapped size. A
/// context length of 0 loaded; a feed-forward length or KV head count that the tensors do not
/// have was an error naming the tensor alone, and a delta-net head of 2^20 was taken.
#[test]
fn counts_and_dimensions_are_checked_against_the_tensors() {
    let f = rewrite(
        &tiny_llama(),
        &[
            ("llama.attention.head_count", Value::U64((1 << 59) + 4)),
            ("llama.attention.head_count_kv", Value::U64((1 << 58) + 2)),
            ("llama.attention.key_length", Value::U32(64)),
        ],
        &[],
    );
    load_error(&f, &["llama.attention.head_count", "overflow"]);
    let f = rewrite(
        &tiny_qwen35(),
        &[("qwen35.ssm.conv_kernel", Value::U64((1 << 55) + 4))],
        &[],
    );
    load_error(
        &f,
        &["qwen35.ssm.conv_kernel", "36028797018963972", "overflow"],
    );
    let f = rewrite(
        &tiny_llama(),
        &[("llama.feed_forward_length", Value::U64(1 << 40))],
        &[],
    );
    load_error(
        &f,
        &["llama.feed_forward_length", "1099511627776", "ffn_up"],
    );
    let f = rewrite(
        &tiny_llama(),
        &[("llama.attention.head_count_kv", Value::U32(1))],
        &[],
    );
    load_error(
        &f,
        &["llama.attention.head_count_kv", "blk.0.attn_k.weight"],
    );
    let f = rewrite(
        &tiny_llama(),
        &[("llama.context_length", Value::U32(0))],
        &[],
    );
    load_error(&f, &["llama.context_length", "= 0"]);
    let f = rewrite(
        &tiny_qwen35(),
        &[("qwen35.ssm.state_size", Value::U32(1 << 20))],
        &[],
    );
    load_error(&f, &["qwen35.ssm.state_size", "1048576"]);
}

/// Before: sections whose sum overflows panicked (on the overflow, or, where it wraps to 0 in a
/// release build, on a division by zero); sections past llama.cpp's `int` were taken.
#[test]
fn rope_sections_that_overflow_are_named() {
    let key = "qwen35.rope.dimension_sections";
    for sections in [
        Array::U64(vec![u64::MAX, 1, 0, 0]),
        Array::U64(vec![1 << 63, 1 << 63, 0, 0]),
        Array::U32(vec![u32::MAX, 1, 1, 1]),
        Array::I32(vec![i32::MAX, i32::MAX, 0, 0]),
    ] {
        let f = rewrite(&tiny_qwen35(), &[(key, Value::Array(sections))], &[]);
        load_error(&f, &[key, "at most 2147483647"]);
    }
}

/// Before: a NaN, negative, zero or infinite epsilon loaded, and the norms made garbage of the
/// logits (every one 0 on the tiny llama with a NaN epsilon).
#[test]
fn a_bad_rms_epsilon_is_named() {
    for eps in [f32::NAN, -1e-5, 0.0, f32::INFINITY] {
        let v = Value::F32(eps);
        for (f, key) in [
            (tiny_llama(), "llama.attention.layer_norm_rms_epsilon"),
            (tiny_qwen35(), "qwen35.attention.layer_norm_rms_epsilon"),
        ] {
            let f = rewrite(&f, &[(key, v.clone())], &[]);
            load_error(&f, &[key, &eps.to_string()]);
        }
        let key = "gemma3.attention.layer_norm_rms_epsilon";
        load_error(&tiny_gemma3(&[(key, v)]), &[key, &eps.to_string()]);
    }
}

/// Before: a RoPE base of 0, below 0, NaN or infinite loaded and ran, with angles that are NaN
/// or nothing.
#[test]
fn a_bad_rope_base_is_named() {
    for base in [0.0, -10000.0, f32::NAN, f32::INFINITY] {
        let v = Value::F32(base);
        let key = "llama.rope.freq_base";
        let f = rewrite(&tiny_llama(), &[(key, v.clone())], &[]);
        load_error(&f, &[key, &base.to_string()]);
        let key = "qwen35.rope.freq_base";
        let f = rewrite(&tiny_qwen35(), &[(key, v.clone())], &[]);
        load_error(&f, &[key, &base.to_string()]);
        for key in ["gemma3.rope.freq_base", "gemma3.rope.freq_base_swa"] {
            load_error(&tiny_gemma3(&[(key, v.clone())]), &[key, &base.to_string()]);
        }
    }
}

/// Before: a linear scaling factor that is NaN or below 0 was taken for no scaling, without a
/// word; NaN frequency factors made NaN angles. (0 is no scaling, as llama.cpp reads it.)
#[test]
fn bad_rope_scaling_factors_are_named() {
    for factor in [f32::NAN, f32::INFINITY, -2.0] {
        for arch in ["llama", "gemma3"] {
            let set = [
                (
                    format!("{arch}.rope.scaling.type"),
                    Value::String("linear".into()),
                ),
                (format!("{arch}.rope.scaling.factor"), Value::F32(factor)),
            ];
            let set: Vec<(&str, Value)> =
                set.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            let f = match arch {
                "llama" => rewrite(&tiny_llama(), &set, &[]),
                _ => tiny_gemma3(&set),
            };
            load_error(&f, &[set[1].0, &factor.to_string()]);
        }
    }
    let nan = f32_tensor("rope_freqs.weight", &[32], f32::NAN);
    let f = rewrite(&tiny_llama(), &[], &[nan]);
    load_error(&f, &["rope_freqs.weight", "NaN"]);
    // Scaling a file cannot ask for is named with the key.
    let key = "qwen35.rope.scaling.type";
    let f = rewrite(
        &tiny_qwen35(),
        &[(key, Value::String("linear".into()))],
        &[],
    );
    load_error(&f, &[key, "`linear`"]);
}

/// YaRN's keys, Mistral 3's attention temperature and LongRoPE's attention factor are checked
/// like the other floats, and a scaling type an architecture does not take is named.
#[test]
fn bad_yarn_and_temperature_keys_are_named() {
    let mistral3 = open("tiny-mistral3-IQ4_NL.gguf");
    for key in [
        "mistral3.rope.scaling.yarn_beta_fast",
        "mistral3.rope.scaling.yarn_log_multiplier",
        "mistral3.attention.temperature_scale",
    ] {
        for v in [f32::NAN, f32::INFINITY] {
            load_error(&rewrite(&mistral3, &[(key, Value::F32(v))], &[]), &[key]);
        }
    }
    let key = "mistral3.rope.scaling.original_context_length";
    load_error(&rewrite(&mistral3, &[(key, Value::U32(0))], &[]), &[key]);
    for v in [0.0, -1.0, f32::NAN] {
        let key = "llama.rope.scaling.attn_factor";
        load_error(
            &rewrite(&tiny_llama(), &[(key, Value::F32(v))], &[]),
            &[key],
        );
    }
    let key = "llama.rope.scaling.type";
    let f = rewrite(
        &tiny_llama(),
        &[(key, Value::String("longrope".into()))],
        &[],
    );
    load_error(&f, &[key, "`longrope`", "none, linear, yarn"]);
}

/// Before: a NaN, infinite or negative soft-cap loaded, and every logit came out NaN (or
/// uncapped).
#[test]
fn a_bad_logit_softcap_is_named() {
    let key = "gemma3.final_logit_softcapping";
    for cap in [f32::NAN, f32::INFINITY, -30.0] {
        load_error(&tiny_gemma3(&[(key, Value::F32(cap))]), &[key]);
    }
    // 0 is no soft-capping.
    load(&tiny_gemma3(&[(key, Value::F32(0.0))])).unwrap();
}

/// Before: a 100-token vocabulary on an embedding of 257 rows loaded (ids past the vocabulary
/// had no text; with more tokens than rows, ids past the rows were refused as out of range).
#[test]
fn a_vocabulary_that_is_not_the_embeddings_rows_is_named() {
    let src = tiny_llama();
    let md = src.metadata();
    let Some(Value::Array(Array::String(tokens))) = md.get("tokenizer.ggml.tokens") else {
        panic!("no tokens");
    };
    let Some(Value::Array(Array::I32(types))) = md.get("tokenizer.ggml.token_type") else {
        panic!("no token types");
    };
    let f = rewrite(
        &src,
        &[
            (
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(tokens[..100].to_vec())),
            ),
            (
                "tokenizer.ggml.token_type",
                Value::Array(Array::I32(types[..100].to_vec())),
            ),
        ],
        &[],
    );
    // The vocabulary alone is well formed: the model is what it does not fit.
    Tokenizer::from_metadata(f.metadata()).unwrap();
    load_error(&f, &["tokenizer.ggml.tokens", "100 tokens", "257 rows"]);
    let f = rewrite(&src, &[("llama.vocab_size", Value::U32(49152))], &[]);
    load_error(&f, &["llama.vocab_size", "49152", "257 rows"]);
}

/// Before: token types outside llama.cpp's 0 to 6 were taken for "undefined", whose tokens
/// have no text: their output was empty.
#[test]
fn token_types_outside_the_defined_ones_are_named() {
    let md = tiny_llama().metadata().clone();
    for bad in [99, -5, 7] {
        let mut md = md.clone();
        let Some(Value::Array(Array::I32(types))) = md.get("tokenizer.ggml.token_type") else {
            panic!("no token types");
        };
        let mut types = types.clone();
        types[42] = bad;
        md.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
        let e = Tokenizer::from_metadata(&md).unwrap_err();
        assert_eq!(e, TokenizerError::BadTokenType { id: 42, value: bad });
        let e = e.to_string();
        assert!(
            e.contains("tokenizer.ggml.token_type") && e.contains(&format!("type {bad}")),
            "{e}"
        );
    }
}

/// Before: a vocabulary of empty strings loaded, and every prompt encoded to no tokens ("the
/// prompt is empty"); so did one of control tokens alone.
#[test]
fn a_vocabulary_that_cannot_encode_text_is_refused() {
    let md = tiny_llama().metadata().clone();
    let mut empty = md.clone();
    empty.insert(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(vec![String::new(); 257])),
    );
    let mut control = md.clone();
    control.insert(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![3; 257])),
    );
    for md in [empty, control] {
        let e = Tokenizer::from_metadata(&md).unwrap_err();
        assert_eq!(e, TokenizerError::NoTextTokens { count: 257 });
        assert!(e.to_string().contains("tokenizer.ggml.tokens"), "{e}");
    }
    // A few empty tokens among others are tolerated, as llama.cpp does.
    let mut some = md.clone();
    let Some(Value::Array(Array::String(tokens))) = md.get("tokenizer.ggml.tokens") else {
        panic!("no tokens");
    };
    let mut tokens = tokens.clone();
    tokens[200] = String::new();
    some.insert("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    let t = Tokenizer::from_metadata(&some).unwrap();
    assert!(!t.encode("hello", false, false).is_empty());
}

/// Before: a state made by one model ran in another's forward pass: a llama state in Qwen 3.5's
/// panicked (its scratch is not the hybrid's; nor has it a recurrent state), and between models
/// of the same shapes it ran on the other's cache without a word.
#[test]
fn a_state_belongs_to_the_model_that_made_it() {
    let threads = Threads::new(1);
    let (f1, f2, f3) = (tiny_llama(), tiny_llama(), tiny_qwen35());
    let (a, b, q) = (load(&f1).unwrap(), load(&f2).unwrap(), load(&f3).unwrap());
    let n_vocab = a.info().n_vocab;
    let mut out = vec![0.0; n_vocab];
    let mut st = a.new_state(16, 8).unwrap();
    for other in [&b, &q] {
        let e = other
            .forward(&mut st, &[1, 2], Logits::Last, &mut out, &threads)
            .unwrap_err();
        assert!(matches!(e, ModelError::ForeignState), "{e}");
        assert!(e.to_string().contains("another model"), "{e}");
        let e = other
            .prefill(&mut st, &[1, 2], 8, Logits::Last, &threads)
            .unwrap_err();
        assert!(matches!(e, ModelError::ForeignState), "{e}");
    }
    // Its own model still takes it, untouched by the refusals.
    assert_eq!(st.pos, 0);
    a.forward(&mut st, &[1, 2], Logits::Last, &mut out, &threads)
        .unwrap();
    let mut st = q.new_state(16, 8).unwrap();
    let e = a
        .forward(&mut st, &[1], Logits::Last, &mut out, &threads)
        .unwrap_err();
    assert!(matches!(e, ModelError::ForeignState), "{e}");
}

/// Before: a state of absurd size overflowed its size arithmetic (a panic) or aborted the
/// process on the allocation.
#[test]
fn a_state_too_large_is_an_error() {
    for f in [tiny_llama(), tiny_qwen35()] {
        let model = load(&f).unwrap();
        for (n_ctx, n_batch) in [
            (usize::MAX, usize::MAX),
            (usize::MAX, 8),
            (1 << 40, 1 << 40),
            (1 << 62, 1 << 62),
        ] {
            let e = match model.new_state(n_ctx, n_batch) {
                Ok(_) => panic!("a state for {n_ctx} positions in batches of {n_batch}"),
                Err(e) => e,
            };
            assert!(matches!(e, ModelError::StateSize { .. }), "{e}");
            assert!(e.to_string().contains(&n_ctx.to_string()), "{e}");
        }
        // A state for no tokens is refused too (batches of 0 made a prefill panic).
        for (n_ctx, n_batch) in [(0, 8), (16, 0)] {
            let e = model.new_state(n_ctx, n_batch).err().unwrap();
            assert!(e.to_string().contains("at least one token"), "{e}");
        }
        // A batch larger than the context needs no more scratch than the context.
        let threads = Threads::new(1);
        let mut st = model.new_state(64, usize::MAX).unwrap();
        model
            .prefill(&mut st, &[1, 2, 3], usize::MAX, Logits::Last, &threads)
            .unwrap();
    }
}

/// Before: a position set past the context overflowed the context check (a panic where
/// overflows are checked, a pass over memory out of the cache where they wrap).
#[test]
fn a_position_past_the_context_is_an_error() {
    let threads = Threads::new(1);
    let f = tiny_llama();
    let model = load(&f).unwrap();
    let mut st = model.new_state(16, 8).unwrap();
    let mut out = vec![0.0; model.info().n_vocab];
    st.pos = usize::MAX;
    let e = model
        .forward(&mut st, &[1], Logits::Last, &mut out, &threads)
        .unwrap_err();
    assert!(matches!(e, ModelError::ContextFull { .. }), "{e}");
}

/// Before: a forward pass of no tokens asked for the last token's logits panicked (its last
/// layer kept one row of none).
#[test]
fn the_last_logits_of_no_tokens_is_an_error() {
    let threads = Threads::new(1);
    for f in [tiny_llama(), tiny_qwen35(), tiny_gemma3(&[])] {
        let model = load(&f).unwrap();
        let mut st = model.new_state(16, 8).unwrap();
        let mut out = vec![0.0; model.info().n_vocab];
        let e = model
            .forward(&mut st, &[], Logits::Last, &mut out, &threads)
            .unwrap_err();
        assert!(matches!(e, ModelError::NoTokens), "{e}");
        model
            .forward(&mut st, &[], Logits::None, &mut out, &threads)
            .unwrap();
    }
}

/// Before: the KV cache grew as positions came with an allocation that aborted when refused,
/// so a huge context that a state allowed (`-c 16000000`) aborted once filled that far. Its
/// room is now asked for before a pass, and a refusal is an error naming the cache; the
/// state is left as it was.
#[test]
fn a_kv_cache_the_system_will_not_hold_is_an_error() {
    let f = tiny_llama();
    let model = load(&f).unwrap();
    let threads = Threads::new(1);
    let n_ctx = 1 << 40;
    let mut st = model.new_state(n_ctx, 8).unwrap();
    st.pos = n_ctx - 2;
    let mut out = vec![0.0; model.info().n_vocab];
    let e = model
        .forward(&mut st, &[1], Logits::Last, &mut out, &threads)
        .unwrap_err();
    assert!(matches!(e, ModelError::StateSize { .. }), "{e}");
    assert!(e.to_string().contains("KV cache"), "{e}");
    assert_eq!(st.pos, n_ctx - 2);
    // The same state still runs from the start.
    st.reset();
    model
        .forward(&mut st, &[1], Logits::Last, &mut out, &threads)
        .unwrap();
}

/// A mixture's counts: more experts used than there are, experts past llama.cpp's 512, a count
/// or a width the stacked tensors do not have, and a `qwen3moe` file without experts are each
/// an error naming the key (or the tensor and its shape), before anything is sized by them.
#[test]
fn expert_counts_and_widths_are_checked() {
    let moe = open("tiny-qwen3moe-Q4_K.gguf");
    let f = rewrite(&moe, &[("qwen3moe.expert_used_count", Value::U32(9))], &[]);
    load_error(&f, &["qwen3moe.expert_used_count", "= 9", "8 experts"]);
    let f = rewrite(&moe, &[("qwen3moe.expert_used_count", Value::U32(0))], &[]);
    load_error(&f, &["qwen3moe.expert_used_count", "at least 1"]);
    let f = rewrite(&moe, &[("qwen3moe.expert_count", Value::U64(1 << 40))], &[]);
    load_error(&f, &["qwen3moe.expert_count", "at most 512"]);
    let f = rewrite(&moe, &[("qwen3moe.expert_count", Value::U32(4))], &[]);
    load_error(
        &f,
        &[
            "blk.0.ffn_gate_exps.weight",
            "[256, 256, 8]",
            "[256, 256, 4]",
        ],
    );
    let width = ("qwen3moe.expert_feed_forward_length", Value::U64(1 << 40));
    let f = rewrite(&moe, &[width], &[]);
    load_error(&f, &["blk.0.ffn_gate_exps.weight", "1099511627776"]);
    let f = rewrite(&moe, &[("qwen3moe.expert_count", Value::U32(0))], &[]);
    load_error(&f, &["qwen3moe.expert_count", "needs experts"]);
    let mixtral = open("tiny-llamamoe-Q8_0.gguf");
    let f = rewrite(&mixtral, &[("llama.expert_used_count", Value::U32(5))], &[]);
    load_error(&f, &["llama.expert_used_count", "4 experts"]);
    // A file whose stacked experts are missing names the tensor.
    let mut w = GgufWriter::new();
    w.set_all(mixtral.metadata());
    for t in mixtral.tensors() {
        if t.info.name != "blk.1.ffn_up_exps.weight" {
            w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
                .unwrap();
        }
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    load_error(&f, &["blk.1.ffn_up_exps.weight"]);
}

/// gpt-oss's own keys and tensors: the window and the experts' width are required (llama.cpp
/// requires them), a RoPE base of its own on the window's layers is refused rather than
/// ignored, and a missing sink, bias or output matrix is named; sinks of the wrong length too.
#[test]
fn gpt_oss_keys_and_tensors_are_checked() {
    let g = open("tiny-gpt-oss-MXFP4.gguf");
    let without = |drop: &str| {
        let mut w = GgufWriter::new();
        w.set_all(g.metadata());
        for t in g.tensors().filter(|t| t.info.name != drop) {
            w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
                .unwrap();
        }
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    };
    for t in [
        "blk.1.attn_sinks.weight",
        "blk.2.attn_output.bias",
        "blk.0.ffn_gate_inp.bias",
        "blk.1.ffn_down_exps.bias",
        "output.weight",
    ] {
        load_error(&without(t), &[t]);
    }
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata().iter() {
        if k != "gpt-oss.attention.sliding_window" {
            w.set(k.to_string(), v.clone());
        }
    }
    for t in g.tensors() {
        w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
            .unwrap();
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    load_error(&f, &["gpt-oss.attention.sliding_window"]);
    let base = ("gpt-oss.rope.freq_base_swa", Value::F32(10.0));
    load_error(
        &rewrite(&g, &[base], &[]),
        &["freq_base_swa", "not supported"],
    );
    let sinks = f32_tensor("blk.0.attn_sinks.weight", &[4], 0.0);
    load_error(&rewrite(&g, &[], &[sinks]), &["blk.0.attn_sinks.weight"]);
    // An expert bias with the right count but transposed (experts first) is named too.
    let bias = f32_tensor("blk.1.ffn_up_exps.bias", &[8, 256], 0.0);
    load_error(
        &rewrite(&g, &[], &[bias]),
        &["blk.1.ffn_up_exps.bias", "[256, 8]"],
    );
}

/// A tensor the loader does not read is refused by name, as llama.cpp refuses a file with a
/// tensor it does not create: a bias llama.cpp would add (in any layer, not only the first),
/// or a tensor no architecture has. The count of the others is given.
#[test]
fn tensors_a_loader_does_not_read_are_named() {
    let src = tiny_llama();
    let n_embd = src.tensor("blk.1.attn_output.weight").unwrap().info.shape[1];
    let bias = f32_tensor("blk.1.attn_output.bias", &[n_embd], 0.0);
    let e = load_error(
        &rewrite(&src, &[], &[bias]),
        &["blk.1.attn_output.bias", "`llama`"],
    );
    assert!(!e.contains("more"), "{e}");
    let extra = [
        f32_tensor("blk.0.ffn_down.bias", &[n_embd], 0.0),
        f32_tensor("mystery.weight", &[4], 1.0),
    ];
    load_error(
        &rewrite(&src, &[], &extra),
        &["blk.0.ffn_down.bias", "(and 1 more)"],
    );
}

/// Granite's scales: a logit scale of 0, below 0 or not finite (it divides the logits), or a
/// residual scale that is not finite, is named; so are the biases and experts it does not run.
#[test]
fn granite_scales_are_checked() {
    let g = open("tiny-granite-Q6_K.gguf");
    for bad in [0.0, -8.0, f32::NAN, f32::INFINITY] {
        let f = rewrite(&g, &[("granite.logit_scale", Value::F32(bad))], &[]);
        load_error(&f, &["granite.logit_scale", "finite number above 0"]);
    }
    let f = rewrite(&g, &[("granite.residual_scale", Value::F32(f32::NAN))], &[]);
    load_error(&f, &["granite.residual_scale", "finite"]);
    let f = rewrite(
        &g,
        &[("granite.rope.scaling.finetuned", Value::U32(1))],
        &[],
    );
    load_error(&f, &["granite.rope.scaling.finetuned", "bool"]);
    let bias = f32_tensor("blk.0.ffn_up.bias", &[512], 0.0);
    let f = rewrite(&g, &[], &[bias]);
    load_error(&f, &["blk.0.ffn_up.bias", "not supported"]);
}
