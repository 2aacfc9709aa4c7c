//! Loading a model whose metadata lies: a small valid random-weight model
//! (`crates/engine/tests/data/forward/`) with some metadata values replaced, added or removed
//! (same type or another: integers huge or negative, floats NaN or infinite, arrays of any
//! length, strings), rewritten with `GgufWriter`, then `synapse_engine::load`; if that
//! succeeds, a state of at most 8 positions and a forward pass of 1 to 4 tokens on 1 to 3
//! threads. Either step may refuse the file with an error; neither may panic, abort, or
//! allocate without bound. Tensors are never altered: only what the metadata says about them.
//!
//! Input layout (bytes past the end read as zeros):
//! `[base, n_ctx, n_batch, threads, n_tokens, logits, 4 x u16 token, edit...]`, an edit being
//! `[key index, op, operands...]` (see [`value`]), at most [`MAX_EDITS`] of them.

use std::sync::OnceLock;

use synapse_engine::{Logits, Threads};
use synapse_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};

use super::Bytes;

pub const MAX_EDITS: usize = 8;
/// The longest array an edit makes (elements, not bytes).
pub const MAX_ARRAY: usize = 1 << 20;

/// Models small enough to rewrite on every input: each architecture once, a tied output,
/// biases (qwen2), the hybrid recurrent one (qwen35).
const FILES: &[&str] = &[
    "tiny-Q2_K.gguf",
    "tiny-tied-Q2_K.gguf",
    "tiny-qwen2-Q8_0.gguf",
    "tiny-qwen3-Q4_K.gguf",
    "tiny-qwen35-Q4_K.gguf",
];

/// Keys the loaders read beyond those the files hold (after `<arch>.`): each may be added.
const EXTRA_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attention.recurrent_layers",
    "rope.dimension_count",
    "rope.dimension_sections",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.type",
    "rope.scaling.factor",
    "final_logit_softcapping",
    "full_attention_interval",
    "nextn_predict_layers",
    "ssm.conv_kernel",
    "ssm.inner_size",
    "ssm.state_size",
    "ssm.time_step_rank",
    "ssm.group_count",
];

const WORDS: &[&str] = &[
    "", "llama", "gemma3", "qwen2", "qwen3", "qwen35", "none", "linear", "yarn", "mamba9", "gpt2",
];

pub struct Base {
    pub name: String,
    pub arch: String,
    pub file: GgufFile,
    /// The keys an edit picks from: the file's, then [`EXTRA_KEYS`] it lacks.
    keys: Vec<String>,
}

/// A Gemma 3 built from the tiny Qwen3 (same blocks, with per-head norms): renamed keys, the
/// two post-norms Gemma adds, a sliding window of 2 on layer 0 and a logit soft-cap.
fn gemma3_from_qwen3() -> GgufFile {
    let src = GgufFile::open(
        super::repo_root().join("crates/engine/tests/data/forward/tiny-qwen3-Q4_K.gguf"),
    )
    .unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        let k = match k.strip_prefix("qwen3.") {
            Some(rest) => format!("gemma3.{rest}"),
            None => k.to_string(),
        };
        w.set(k, v.clone());
    }
    w.set("general.architecture", Value::String("gemma3".into()));
    w.set("gemma3.attention.sliding_window", Value::U32(2));
    w.set("gemma3.attention.sliding_window_pattern", Value::U32(2));
    w.set("gemma3.final_logit_softcapping", Value::F32(30.0));
    w.set("gemma3.rope.freq_base_swa", Value::F32(10000.0));
    let n_embd = src.metadata().u64("qwen3.embedding_length").unwrap();
    let n_layer = src.metadata().u64("qwen3.block_count").unwrap();
    let ones: Vec<u8> = (0..n_embd).flat_map(|_| 1f32.to_le_bytes()).collect();
    for t in src.tensors() {
        w.add_tensor(
            t.info.name.clone(),
            t.info.ggml_type,
            &t.info.shape,
            t.data.to_vec(),
        )
        .unwrap();
    }
    for i in 0..n_layer {
        for n in ["post_attention_norm", "post_ffw_norm"] {
            w.add_tensor(
                format!("blk.{i}.{n}.weight"),
                GgmlType::F32,
                &[n_embd],
                ones.clone(),
            )
            .unwrap();
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

pub fn bases() -> &'static [Base] {
    static B: OnceLock<Vec<Base>> = OnceLock::new();
    B.get_or_init(|| {
        let dir = super::repo_root().join("crates/engine/tests/data/forward");
        let mut files: Vec<(String, GgufFile)> = FILES
            .iter()
            .map(|f| {
                let p = dir.join(f);
                let file = GgufFile::from_bytes(
                    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
                )
                .unwrap();
                (f.to_string(), file)
            })
            .collect();
        files.push(("gemma3 (from tiny-qwen3-Q4_K)".into(), gemma3_from_qwen3()));
        files
            .into_iter()
            .map(|(name, file)| {
                let arch = file
                    .metadata()
                    .str("general.architecture")
                    .unwrap()
                    .to_string();
                let mut keys: Vec<String> =
                    file.metadata().iter().map(|(k, _)| k.to_string()).collect();
                for k in EXTRA_KEYS.iter().map(|s| format!("{arch}.{s}")) {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                keys.push("general.alignment".into());
                Base {
                    name,
                    arch,
                    file,
                    keys,
                }
            })
            .collect()
    })
}

fn threads(n: usize) -> &'static Threads {
    static T: OnceLock<[Threads; 3]> = OnceLock::new();
    &T.get_or_init(|| [Threads::new(1), Threads::new(2), Threads::new(3)])[n - 1]
}

/// Load every base unaltered and run it: a base that fails would make the check vacuous.
pub fn init() {
    for b in bases() {
        let m = synapse_engine::load(&b.file).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        let mut st = m
            .new_state(4, 2)
            .unwrap_or_else(|e| panic!("{}: {e}", b.name));
        let out = m
            .prefill(&mut st, &[1, 2, 3], 2, Logits::All, threads(2))
            .unwrap_or_else(|e| panic!("{}: {e}", b.name));
        assert_eq!(out.len(), 3 * m.info().n_vocab, "{}", b.name);
        assert!(out.iter().all(|x| x.is_finite()), "{}", b.name);
    }
}

const INTS: &[i128] = &[
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    16,
    63,
    64,
    65,
    127,
    128,
    255,
    256,
    257,
    1023,
    1024,
    4096,
    32767,
    65535,
    65536,
    1 << 20,
    i32::MAX as i128,
    1 << 31,
    u32::MAX as i128,
    1 << 32,
    1 << 40,
    i64::MAX as i128,
    u64::MAX as i128,
    -1,
    -2,
    i32::MIN as i128,
    i64::MIN as i128,
];

const FLOATS: &[f64] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    2.0,
    8.0,
    30.0,
    1e-6,
    1e-30,
    1e-45,
    1e30,
    1e300,
    f32::MAX as f64,
    f64::MAX,
    f64::MIN_POSITIVE,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
];

const ARRAY_LENS: &[usize] = &[0, 1, 2, 3, 4, 5, 8, 16, 255, 256, 4096, 65536, MAX_ARRAY];

/// An integer of scalar type `t` (0..8: u8 i8 u16 i16 u32 i32 u64 i64), wrapped.
fn int_value(t: u8, x: i128) -> Value {
    match t % 8 {
        0 => Value::U8(x as u8),
        1 => Value::I8(x as i8),
        2 => Value::U16(x as u16),
        3 => Value::I16(x as i16),
        4 => Value::U32(x as u32),
        5 => Value::I32(x as i32),
        6 => Value::U64(x as u64),
        _ => Value::I64(x as i64),
    }
}

fn float_value(t: u8, x: f64) -> Value {
    if t % 2 == 0 {
        Value::F32(x as f32)
    } else {
        Value::F64(x)
    }
}

fn as_i128(v: &Value) -> Option<i128> {
    v.as_i64()
        .map(i128::from)
        .or_else(|| v.as_u64().map(i128::from))
}

/// An array of `len` elements of type `t`, element `i` being `f(i)` converted.
fn array(t: u8, len: usize, f: impl Fn(usize) -> i128) -> Array {
    macro_rules! v {
        ($g:expr) => {
            (0..len).map(|i| $g(f(i))).collect()
        };
    }
    match t % 13 {
        0 => Array::U8(v!(|x| x as u8)),
        1 => Array::I8(v!(|x| x as i8)),
        2 => Array::U16(v!(|x| x as u16)),
        3 => Array::I16(v!(|x| x as i16)),
        4 => Array::U32(v!(|x| x as u32)),
        5 => Array::I32(v!(|x| x as i32)),
        6 => Array::U64(v!(|x| x as u64)),
        7 => Array::I64(v!(|x| x as i64)),
        8 => Array::F32(v!(|x| x as f32)),
        9 => Array::F64(v!(|x| x as f64)),
        10 => Array::Bool(v!(|x: i128| x & 1 == 1)),
        11 => Array::String(v!(|x: i128| x.to_string())),
        _ => Array::Array(
            (0..len.min(16))
                .map(|i| Array::U32(vec![f(i) as u32; 2]))
                .collect(),
        ),
    }
}

/// The value an edit sets, from its op byte and operands; `None` removes the key.
pub fn value(b: &mut Bytes, old: Option<&Value>) -> Option<Value> {
    let op = b.u8();
    Some(match op % 20 {
        0 => Value::U8(b.u8()),
        1 => Value::I8(b.u8() as i8),
        2 => Value::U16(b.u16()),
        3 => Value::I16(b.u16() as i16),
        4 => Value::U32(b.u32()),
        5 => Value::I32(b.u32() as i32),
        6 => Value::U64(b.u64()),
        7 => Value::I64(b.u64() as i64),
        8 => Value::F32(f32::from_bits(b.u32())),
        9 => Value::F64(f64::from_bits(b.u64())),
        10 => Value::Bool(b.u8() & 1 == 1),
        11 => {
            let n = b.u8() as usize % 32;
            Value::String(String::from_utf8_lossy(b.take(n)).into_owned())
        }
        12 => {
            let t = b.u8();
            int_value(t, INTS[b.u8() as usize % INTS.len()])
        }
        13 => {
            let t = b.u8();
            float_value(t, FLOATS[b.u8() as usize % FLOATS.len()])
        }
        14 => Value::String(WORDS[b.u8() as usize % WORDS.len()].into()),
        15 => return None,
        // The old value moved a little, in its own type: the likeliest to pass the loader's
        // shape checks and reach the forward pass.
        16 | 17 => {
            let delta = b.u8() as i8 as i128;
            match old {
                Some(Value::F32(x)) => Value::F32(x * (1.0 + delta as f32 / 16.0)),
                Some(Value::F64(x)) => Value::F64(x * (1.0 + delta as f64 / 16.0)),
                Some(v @ (Value::Bool(_) | Value::String(_))) => v.clone(),
                Some(Value::Array(a)) => {
                    // The same elements, one more or fewer (or the first changed).
                    let n = a.len();
                    let t = a.elem_type() as u8;
                    let get = |i: usize| {
                        a.get(i.min(n.saturating_sub(1)))
                            .as_ref()
                            .and_then(as_i128)
                            .unwrap_or(1)
                    };
                    let len = (n as i128 + delta.signum()).max(0) as usize;
                    let t = [0, 1, 2, 3, 4, 5, 8, 10, 11, 12, 6, 7, 9]
                        .get(t as usize)
                        .copied()
                        .unwrap_or(4);
                    Value::Array(array(
                        t,
                        len,
                        |i| if i == 0 { get(0) + delta } else { get(i) },
                    ))
                }
                Some(v) => {
                    let x = as_i128(v).unwrap_or(0);
                    let x = if op % 20 == 16 {
                        x + delta
                    } else if delta < 0 {
                        x >> (-delta % 64)
                    } else {
                        x << (delta % 64)
                    };
                    let t = match v {
                        Value::U8(_) => 0,
                        Value::I8(_) => 1,
                        Value::U16(_) => 2,
                        Value::I16(_) => 3,
                        Value::U32(_) => 4,
                        Value::I32(_) => 5,
                        Value::U64(_) => 6,
                        _ => 7,
                    };
                    int_value(t, x)
                }
                None => int_value(4, delta.max(0)),
            }
        }
        18 => {
            let t = b.u8();
            let len = ARRAY_LENS[b.u8() as usize % ARRAY_LENS.len()];
            let x = INTS[b.u8() as usize % INTS.len()];
            Value::Array(array(t, len, |_| x))
        }
        _ => {
            let t = b.u8();
            let len = b.u8() as usize % 16;
            let xs: Vec<i128> = (0..len).map(|_| b.u8() as i8 as i128).collect();
            Value::Array(array(t, len, |i| xs[i]))
        }
    })
}

/// How far an input got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reached {
    /// The writer or the reader refused the metadata.
    Unwritable,
    /// `load` refused it.
    Refused,
    /// Loaded; the state or the pass refused it.
    Loaded,
    /// A forward pass ran.
    Ran,
}

pub fn check(data: &[u8]) {
    run(data);
}

pub fn run(data: &[u8]) -> Reached {
    let mut b = Bytes(data);
    let bases = bases();
    let base = &bases[b.u8() as usize % bases.len()];
    let n_ctx = 1 + b.u8() as usize % 8;
    let n_batch = 1 + b.u8() as usize % 8;
    let n_threads = 1 + b.u8() as usize % 3;
    let n_tokens = 1 + b.u8() as usize % 4;
    let logits = [Logits::All, Logits::Last, Logits::None][b.u8() as usize % 3];
    let raw_tokens: Vec<u16> = (0..4).map(|_| b.u16()).collect();

    let mut edits: Vec<(&str, Option<Value>)> = Vec::new();
    while !b.is_empty() && edits.len() < MAX_EDITS {
        let key = base.keys[b.u8() as usize % base.keys.len()].as_str();
        let old = base.file.metadata().get(key);
        let v = value(&mut b, old);
        edits.retain(|(k, _)| *k != key);
        edits.push((key, v));
    }
    let mut w = GgufWriter::new();
    for (k, v) in base.file.metadata().iter() {
        if !edits.iter().any(|(e, _)| *e == k) {
            w.set(k, v.clone());
        }
    }
    for (k, v) in &edits {
        if let Some(v) = v {
            w.set(*k, v.clone());
        }
    }
    for t in base.file.tensors() {
        w.add_tensor(t.info.name.clone(), t.info.ggml_type, &t.info.shape, t.data)
            .unwrap();
    }
    // A value the writer refuses (an alignment that is no power of two) or the reader does.
    let Ok(bytes) = w.to_bytes() else {
        return Reached::Unwritable;
    };
    let Ok(file) = GgufFile::from_bytes(bytes) else {
        return Reached::Unwritable;
    };
    let Ok(model) = synapse_engine::load(&file) else {
        return Reached::Refused;
    };
    let info = model.info().clone();
    // A state too large for the system is an error too.
    let Ok(mut st) = model.new_state(n_ctx, n_batch) else {
        return Reached::Loaded;
    };
    // Mostly valid ids, a few past the vocabulary (an error, not a panic).
    let tokens: Vec<u32> = raw_tokens[..n_tokens]
        .iter()
        .map(|&t| t as u32 % (info.n_vocab as u32).saturating_add(2).max(1))
        .collect();
    if let Ok(out) = model.prefill(&mut st, &tokens, n_batch, logits, threads(n_threads)) {
        assert_eq!(
            out.len(),
            logits.rows(tokens.len()) * info.n_vocab,
            "{}",
            base.name
        );
        // One more token after the prompt, if the context has room.
        let mut one = vec![0.0; info.n_vocab];
        let _ = model.forward(
            &mut st,
            &tokens[..1],
            Logits::Last,
            &mut one,
            threads(n_threads),
        );
        return Reached::Ran;
    }
    Reached::Loaded
}
