//! Which ggml type each tensor gets when a model is quantized to a mix (`Q4_K_M`, `Q6_K`, ...):
//! the decisions of llama.cpp's `llama-quantize` (`src/llama-quant.cpp`), made the same way so
//! that synapse's output can be byte for byte llama-quantize's.
//!
//! The decisions, as llama-quantize takes them:
//!
//! - The tensors are walked in llama.cpp's loader order, which is also the order of the output
//!   file: first the tensors outside the layers, then layer by layer (the number after `blk.`),
//!   each group sorted by name. Some rules count tensors as they go (the first two `attn_v` of
//!   `Q3_K_M`, a layer's share of `attn_v`/`ffn_down` in `Q4_K_M`), so the order matters.
//! - A tensor is quantized only if it is a matrix (ggml's dimension count, trailing 1s dropped,
//!   is at least 2) whose name ends in `weight` and is none of the small or sensitive ones
//!   (norms, the MoE router, positional embeddings, convolutions, ...). The others are copied.
//! - `--token-embedding-type` and `--output-tensor-type` settle `token_embd`/`output` at once;
//!   then a 16-bit mix converts every quantizable tensor to its type; a quantized mix starts from
//!   its default type, takes the first `--tensor-type` pattern that matches, or else (without
//!   `--pure`) the mix's per-tensor rules, and finally falls back to a type whose block divides
//!   the row length when the chosen one does not.
//!
//! [`plan`] returns those decisions in output order; it reads no file and prints nothing.

use std::fmt;

use synapse_gguf::{GgmlType, GgufFile, Metadata, TensorInfo, Value};

macro_rules! mixes {
    ($( $mix:ident = $ftype:literal, $ty:ident; )*) => {
        /// A quantization mix: the `type` argument of llama-quantize (a `llama_ftype`), for the
        /// mixes synapse can write.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Mix {
            $( $mix, )*
        }

        /// Each mix: its name, its `llama_ftype` (`general.file_type`) and its default type.
        const MIXES: &[(Mix, &str, u32, GgmlType)] =
            &[$( (Mix::$mix, stringify!($mix), $ftype, GgmlType::$ty), )*];

        impl Mix {
            /// Every mix synapse writes.
            pub const ALL: &'static [Mix] = &[$( Mix::$mix, )*];
        }
    };
}

mixes! {
    F16 = 1, F16; BF16 = 32, BF16; Q4_0 = 2, Q4_0; Q4_1 = 3, Q4_1; Q5_0 = 8, Q5_0; Q5_1 = 9, Q5_1;
    Q8_0 = 7, Q8_0; Q2_K = 10, Q2_K; Q2_K_S = 21, Q2_K; Q3_K_S = 11, Q3_K; Q3_K_M = 12, Q3_K;
    Q3_K_L = 13, Q3_K; Q4_K_S = 14, Q4_K; Q4_K_M = 15, Q4_K; Q5_K_S = 16, Q5_K; Q5_K_M = 17, Q5_K;
    Q6_K = 18, Q6_K; IQ4_NL = 25, IQ4_NL; IQ4_XS = 30, IQ4_XS; MXFP4_MOE = 38, MXFP4;
}

use GgmlType as T;

/// Every name llama-quantize accepts, in the order it tries them, with its `llama_ftype`. Of two
/// names for one ftype, a number stands for the first.
#[rustfmt::skip]
const LLAMA_QUANTIZE_NAMES: &[(&str, u32)] = &[
    ("Q1_0", 40), ("Q2_0", 41), ("Q4_0", 2), ("Q4_1", 3), ("MXFP4_MOE", 38), ("Q5_0", 8),
    ("Q5_1", 9), ("IQ2_XXS", 19), ("IQ2_XS", 20), ("IQ2_S", 28), ("IQ2_M", 29), ("IQ1_S", 24),
    ("IQ1_M", 31), ("TQ1_0", 36), ("TQ2_0", 37), ("Q2_K", 10), ("Q2_K_S", 21), ("IQ3_XXS", 23),
    ("IQ3_S", 26), ("IQ3_M", 27), ("Q3_K", 12), ("IQ3_XS", 22), ("Q3_K_S", 11), ("Q3_K_M", 12),
    ("Q3_K_L", 13), ("IQ4_NL", 25), ("IQ4_XS", 30), ("Q4_K", 15), ("Q4_K_S", 14), ("Q4_K_M", 15),
    ("Q5_K", 17), ("Q5_K_S", 16), ("Q5_K_M", 17), ("Q6_K", 18), ("Q8_0", 7), ("F16", 1),
    ("BF16", 32), ("F32", 0), ("COPY", 0),
];

impl Mix {
    fn row(self) -> &'static (Mix, &'static str, u32, GgmlType) {
        MIXES
            .iter()
            .find(|r| r.0 == self)
            .expect("every mix has a row")
    }

    /// The name llama-quantize prints (`Q4_K_M`).
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// The `llama_ftype`, as written to `general.file_type`.
    pub fn file_type(self) -> u32 {
        self.row().2
    }

    /// The type a tensor gets unless a rule says otherwise.
    pub fn default_type(self) -> GgmlType {
        self.row().3
    }

    /// The mix with this `llama_ftype`.
    pub fn from_file_type(ftype: u32) -> Option<Mix> {
        MIXES.iter().find(|r| r.2 == ftype).map(|r| r.0)
    }

    /// The mix a llama-quantize `type` argument names: a name in any case (`q4_k_m`, and the
    /// aliases `Q3_K`, `Q4_K`, `Q5_K` for the `_M` mixes) or, failing that, a number read as C's
    /// `stoi` reads it (`15`, for Q4_K_M).
    pub fn parse(arg: &str) -> Result<Mix, RuleError> {
        let by_name = LLAMA_QUANTIZE_NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(arg));
        let found = by_name.or_else(|| {
            let id = leading_int(arg)?;
            LLAMA_QUANTIZE_NAMES
                .iter()
                .find(|(_, f)| i64::from(*f) == id)
        });
        let &(name, ftype) = found.ok_or_else(|| RuleError::UnknownMix { arg: arg.into() })?;
        Mix::from_file_type(ftype).ok_or(RuleError::UnsupportedMix { name, ftype })
    }

    /// [`Mix::parse`], without the reason.
    pub fn from_name(arg: &str) -> Option<Mix> {
        Mix::parse(arg).ok()
    }

    fn is_16_bit(self) -> bool {
        matches!(self, Mix::F16 | Mix::BF16)
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The integer at the start of `s` as C's `strtol` finds it (spaces, a sign, digits; the rest is
/// ignored), or `None` without digits.
fn leading_int(s: &str) -> Option<i64> {
    let s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let v = s[..digits].bytes().fold(0i64, |v, d| {
        v.saturating_mul(10).saturating_add(i64::from(d - b'0'))
    });
    Some(if neg { -v } else { v })
}

/// ggml's `ggml_is_quantized`: every type stored in blocks of more than one value.
fn is_quantized(t: GgmlType) -> bool {
    t.block_len() > 1
}

/// One `--tensor-type NAME=TYPE`: tensors whose name the pattern matches (searched for anywhere
/// in it, as `std::regex_search`) get the type; the first matching pattern wins. llama-quantize's
/// command line lower-cases the pattern before it gets here.
///
/// Patterns are regular expressions there; synapse knows their plain subset: characters, `.`
/// for any character, `\` before a punctuation character for that character, `^` at the start
/// and `$` at the end. Anything else is refused ([`RuleError::UnsupportedPattern`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorTypeOverride {
    pub pattern: String,
    pub ty: GgmlType,
}

/// A compiled [`TensorTypeOverride`] pattern.
struct Pattern {
    /// `None` stands for `.`.
    atoms: Vec<Option<u8>>,
    at_start: bool,
    at_end: bool,
}

impl Pattern {
    fn compile(src: &str) -> Result<Pattern, RuleError> {
        let refuse = || RuleError::UnsupportedPattern {
            pattern: src.into(),
        };
        let mut b = src.as_bytes();
        let at_start = b.first() == Some(&b'^');
        if at_start {
            b = &b[1..];
        }
        // A `$` ends the pattern unless it is escaped (an odd run of `\` before it).
        let escapes = b.iter().rev().skip(1).take_while(|&&c| c == b'\\').count();
        let at_end = b.last() == Some(&b'$') && escapes % 2 == 0;
        if at_end {
            b = &b[..b.len() - 1];
        }
        let mut atoms = Vec::with_capacity(b.len());
        let mut it = b.iter();
        while let Some(&c) = it.next() {
            atoms.push(match c {
                b'.' => None,
                b'\\' => match it.next() {
                    Some(&e) if e.is_ascii_punctuation() => Some(e),
                    _ => return Err(refuse()),
                },
                b'^' | b'$' | b'*' | b'+' | b'?' | b'(' | b')' | b'[' | b']' | b'{' | b'}'
                | b'|' => return Err(refuse()),
                c => Some(c),
            });
        }
        Ok(Pattern {
            atoms,
            at_start,
            at_end,
        })
    }

    fn matches_at(&self, s: &[u8]) -> bool {
        s.len() >= self.atoms.len()
            && (!self.at_end || s.len() == self.atoms.len())
            && self.atoms.iter().zip(s).all(|(a, &c)| match a {
                // ECMAScript's `.` stops at line terminators.
                None => c != b'\n' && c != b'\r',
                Some(a) => *a == c,
            })
    }

    fn is_match(&self, name: &str) -> bool {
        let s = name.as_bytes();
        if self.at_start {
            return self.matches_at(s);
        }
        (0..=s.len()).any(|i| self.matches_at(&s[i..]))
    }
}

/// The options of llama-quantize that change decisions.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--pure`: no per-tensor rules, the mix's default type everywhere (overrides and the
    /// row-length fallback still apply).
    pub pure: bool,
    /// `--leave-output-tensor`: copy `output.weight` as it is.
    pub leave_output_tensor: bool,
    /// `--output-tensor-type`.
    pub output_tensor_type: Option<GgmlType>,
    /// `--token-embedding-type`.
    pub token_embedding_type: Option<GgmlType>,
    /// `--tensor-type`, in command-line order.
    pub tensor_types: Vec<TensorTypeOverride>,
    /// An importance matrix with at least one entry is given (`--imatrix`).
    pub has_imatrix: bool,
    /// `--allow-requantize`: convert tensors that are already quantized.
    pub allow_requantize: bool,
}

/// What the rules need to know of the model, as llama.cpp's loader reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    /// `general.architecture`.
    pub arch: String,
    /// Layers as llama.cpp counts them (`n_layer_all`: `{arch}.block_count`, but for the
    /// architectures that add layers of their own).
    pub n_layer: u32,
    /// `{arch}.nextn_predict_layers`: the layers of `n_layer` that predict further tokens.
    pub n_layer_nextn: u32,
    /// `{arch}.expert_count` (0 for a dense model).
    pub n_expert: u32,
    /// Attention heads of the first layer.
    pub n_head: u32,
    /// Key/value heads of the first layer.
    pub n_head_kv: u32,
}

impl ModelFacts {
    /// Query heads per key/value head (llama.cpp's `n_gqa()`, 0 without key/value heads).
    pub fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's `LLM_TYPE_70B`, whose `attn_v` gets more bits.
    fn is_70b(&self) -> bool {
        let layers = self.n_layer.saturating_sub(self.n_layer_nextn);
        match self.arch.as_str() {
            "llama" | "llama-embed" => {
                self.n_expert != 8 && layers == 80 && self.n_head != self.n_head_kv
            }
            "qwen2" | "deci" | "olmo" => layers == 80,
            "jais2" => layers == 68,
            _ => false,
        }
    }

    /// The facts from a model's metadata, with the defaults llama.cpp's loader takes for the
    /// optional keys.
    pub fn from_metadata(meta: &Metadata) -> Result<ModelFacts, RuleError> {
        let arch = meta.str("general.architecture")?.to_string();
        let mut facts = ModelFacts {
            arch: arch.clone(),
            n_layer: 0,
            n_layer_nextn: 0,
            n_expert: 0,
            n_head: 0,
            n_head_kv: 0,
        };
        // A vision projector's hyperparameters are not read.
        if arch == "clip" {
            return Ok(facts);
        }
        let key = |k: &str| format!("{arch}.{k}");
        let count = |k: &str| -> Result<Option<u32>, RuleError> {
            let Some(v) = meta.get(&key(k)) else {
                return Ok(None);
            };
            let first = match v {
                Value::Array(a) => a.get(0),
                v => Some(v.clone()),
            };
            first
                .as_ref()
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| RuleError::BadKey { key: key(k) })
        };
        facts.n_layer = count("block_count")?.ok_or_else(|| RuleError::BadKey {
            key: key("block_count"),
        })?;
        facts.n_layer_nextn = count("nextn_predict_layers")?.unwrap_or(0);
        facts.n_expert = count("expert_count")?.unwrap_or(0);
        facts.n_head = count("attention.head_count")?.unwrap_or(0);
        facts.n_head_kv = count("attention.head_count_kv")?.unwrap_or(facts.n_head);
        let real_layers = facts.n_layer.saturating_sub(facts.n_layer_nextn);
        match arch.as_str() {
            // One router layer after the others, counted as a prediction layer.
            "graniteswitch" => {
                facts.n_layer = real_layers + 1;
                facts.n_layer_nextn = 1;
            }
            // The layers run `num_loops` times and count as that many.
            "nanbeige" => {
                let loops = count("num_loops")?.unwrap_or(1);
                if loops > 1 {
                    facts.n_layer = real_layers.saturating_mul(loops);
                }
            }
            _ => {}
        }
        Ok(facts)
    }
}

/// A tensor as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    pub name: String,
    pub ggml_type: GgmlType,
    /// GGUF order: `shape[0]` is the row length.
    pub shape: Vec<u64>,
}

impl TensorDesc {
    fn ne(&self, i: usize) -> u64 {
        self.shape.get(i).copied().unwrap_or(1)
    }

    /// ggml's dimension count: trailing dimensions of 1 do not count, and there is at least one.
    pub fn n_dims(&self) -> usize {
        self.shape
            .iter()
            .rposition(|&n| n != 1)
            .map_or(1, |i| i + 1)
    }
}

impl From<&TensorInfo> for TensorDesc {
    fn from(t: &TensorInfo) -> TensorDesc {
        TensorDesc {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            shape: t.shape.clone(),
        }
    }
}

/// The facts and the tensors of an open file, for [`plan`].
pub fn describe(file: &GgufFile) -> Result<(ModelFacts, Vec<TensorDesc>), RuleError> {
    let facts = ModelFacts::from_metadata(file.metadata())?;
    Ok((
        facts,
        file.tensor_infos().iter().map(TensorDesc::from).collect(),
    ))
}

/// The decision for one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The tensor's index in the slice given to [`plan`].
    pub index: usize,
    /// Its type in the input.
    pub from: GgmlType,
    /// Its type in the output; equal to `from`, the bytes are copied.
    pub to: GgmlType,
    /// llama.cpp would quantize it at all (a matrix of weights, not a norm, ...).
    pub quantizable: bool,
    /// The type the rules chose, where the row length forced `to` instead (llama-quantize's
    /// "falling back" warning).
    pub fallback_from: Option<GgmlType>,
    /// llama-quantize refuses to make this type for this tensor without importance data.
    pub requires_imatrix: bool,
}

impl Choice {
    /// The tensor is converted rather than copied.
    pub fn converts(&self) -> bool {
        self.from != self.to
    }
}

/// Why a mix cannot be planned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    #[error("`{arg}` is not a llama-quantize type (Q4_K_M, Q8_0, F16, ... or its number)")]
    UnknownMix { arg: String },
    #[error("llama-quantize's type {name} (file type {ftype}) is not one synapse writes")]
    UnsupportedMix { name: &'static str, ftype: u32 },
    #[error(transparent)]
    Gguf(#[from] synapse_gguf::GgufError),
    #[error("metadata key `{key}` is missing or not a count")]
    BadKey { key: String },
    #[error("tensor `{tensor}` appears twice")]
    DuplicateTensor { tensor: String },
    #[error("tensor name `{tensor}` is {len} bytes; ggml's limit is 63")]
    NameTooLong { tensor: String, len: usize },
    #[error(
        "--tensor-type pattern `{pattern}`: only characters, `.`, `\\` before punctuation, and \
         `^`/`$` at the ends are supported"
    )]
    UnsupportedPattern { pattern: String },
    /// A per-layer rule of a mixture of experts met a name without `blk.N.`, N of the layers.
    #[error("tensor `{tensor}`: its name gives no layer of the model's {n_layer} (blk.N.)")]
    BadLayer { tensor: String, n_layer: u32 },
    #[error(
        "tensor `{tensor}`: llama.cpp has no type to fall back to from {ty} for rows of {row}"
    )]
    NoFallback {
        tensor: String,
        ty: GgmlType,
        row: u64,
    },
    #[error("tensor `{tensor}`: rows of {row} values are not whole blocks of {ty}")]
    RowNotBlocks {
        tensor: String,
        ty: GgmlType,
        row: u64,
    },
    #[error(
        "tensor `{tensor}` would be {ty}, which this quantization needs an importance matrix for"
    )]
    ImatrixRequired { tensor: String, ty: GgmlType },
    #[error("tensor `{tensor}` is already {from}: converting it to {to} needs --allow-requantize")]
    RequantizeDisabled {
        tensor: String,
        from: GgmlType,
        to: GgmlType,
    },
    #[error("tensor `{tensor}` is {from}, which llama-quantize cannot convert")]
    CannotConvert { tensor: String, from: GgmlType },
    #[error("tensor `{tensor}` would be {ty}, a type synapse cannot write")]
    Unwritable { tensor: String, ty: GgmlType },
}

/// llama.cpp's broad kinds of tensors, from the name alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnK,
    /// `attn_v`, and the tensors that hold V with others (`attn_qkv`, `attn_kv_b`).
    AttnV,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if is_token_embd(name) {
        return TokenEmbd;
    }
    // The first fragment found decides.
    const BY_FRAGMENT: &[(&str, Category)] = &[
        ("attn_qkv.weight", AttnV),
        ("attn_kv_b.weight", AttnV),
        ("attn_v.weight", AttnV),
        ("attn_k.weight", AttnK),
        ("attn_q.weight", AttnQ),
        ("attn_output.weight", AttnOutput),
        ("ffn_up", FfnUp),
        ("ffn_gate", FfnGate),
        ("ffn_down", FfnDown),
    ];
    BY_FRAGMENT
        .iter()
        .find(|(f, _)| name.contains(f))
        .map_or(Other, |&(_, c)| c)
}

/// Name fragments of the matrices llama.cpp never quantizes.
#[rustfmt::skip]
const NEVER_QUANTIZED: &[&str] = &[
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
    "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
    "mm.a.code_embd",
];

/// The same for GLM-5-next (`glm5-next`) only.
#[rustfmt::skip]
const NEVER_QUANTIZED_GLM5_NEXT: &[&str] = &[
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
    "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
    "attn_v_b.weight",
];

/// llama.cpp's `tensor_allows_quantization`.
fn allows_quantization(t: &TensorDesc, arch: &str, opts: &Options) -> bool {
    let name = t.name.as_str();
    // llama.cpp's test for a name ending in `weight` also passes any name of five bytes.
    let ends_in_weight = name.ends_with("weight") || name.len() == 5;
    t.n_dims() >= 2
        && ends_in_weight
        && !(opts.leave_output_tensor && name == "output.weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !NEVER_QUANTIZED.iter().any(|f| name.contains(f))
        && !(arch == "glm5-next" && NEVER_QUANTIZED_GLM5_NEXT.iter().any(|f| name.contains(f)))
}

/// The layer of a `blk.N.` name as C's `sscanf("blk.%d.")` reads it.
fn layer_of(name: &str) -> Option<i64> {
    leading_int(name.strip_prefix("blk.")?)
}

/// The order llama.cpp's loader keeps tensors in, which llama-quantize walks and writes: the
/// tensors outside the layers first, then by layer, each group by name.
pub fn output_order(tensors: &[TensorDesc]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| {
        let name = &tensors[i].name;
        (layer_of(name).unwrap_or(-1), name.as_bytes())
    });
    order
}

/// llama.cpp's "use more bits" layers: the first and last eighth, and every third between.
fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The counters the rules keep while walking the tensors.
struct Walk<'a> {
    facts: &'a ModelFacts,
    mix: Mix,
    opts: &'a Options,
    patterns: Vec<Pattern>,
    /// No `output.weight`: the token embedding is also the output projection.
    tied: bool,
    n_attn_v: i64,
    i_attn_v: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

impl Walk<'_> {
    /// The layer a per-layer rule counts a tensor in: its rank among the tensors of its kind,
    /// or for a mixture of experts (whose expert tensors may come in any order) the layer its
    /// name gives.
    fn layer(&self, t: &TensorDesc, counted: i64) -> Result<(i64, i64), RuleError> {
        let n_layer = i64::from(self.facts.n_layer);
        if self.facts.n_expert <= 1 {
            return Ok((counted, n_layer));
        }
        match layer_of(&t.name) {
            Some(layer) if (0..n_layer).contains(&layer) => Ok((layer, n_layer)),
            _ => Err(RuleError::BadLayer {
                tensor: t.name.clone(),
                n_layer: self.facts.n_layer,
            }),
        }
    }

    /// The type of a quantizable tensor.
    fn decide(&mut self, t: &TensorDesc) -> Result<(GgmlType, Option<GgmlType>), RuleError> {
        let cat = category(&t.name);
        let pattern_type = |name: &str| {
            self.patterns
                .iter()
                .zip(&self.opts.tensor_types)
                .find(|(p, _)| p.is_match(name))
                .map(|(_, o)| o.ty)
        };
        if let (Some(ty), Category::TokenEmbd) = (self.opts.token_embedding_type, cat) {
            // A pattern may still name the per-layer embeddings, a table of their own.
            let named = t.name == "per_layer_token_embd.weight" && pattern_type(&t.name).is_some();
            if !named {
                return Ok((ty, None));
            }
        }
        if let (Some(ty), Category::Output) = (self.opts.output_tensor_type, cat) {
            return Ok((ty, None));
        }
        if self.mix.is_16_bit() {
            return Ok((self.mix.default_type(), None));
        }
        let chosen = match pattern_type(&t.name) {
            Some(ty) => ty,
            None if self.opts.pure => self.mix.default_type(),
            None => self.mix_rule(t, cat)?,
        };
        fallback(t, chosen)
    }

    /// The mix's own rules (llama.cpp's `llama_tensor_get_type_impl`), for the mixes synapse
    /// writes.
    fn mix_rule(&mut self, t: &TensorDesc, cat: Category) -> Result<GgmlType, RuleError> {
        use Mix as M;
        let (f, mix, name) = (self.facts, self.mix, t.name.as_str());
        let mut ty = mix.default_type();
        let falcon = f.arch == "falcon";
        let gqa = f.n_gqa();
        let eight_experts = f.n_expert == 8;

        // GLM-5-next keeps its query projections at 8 bits (the quantized mixes' default types
        // are all below).
        if f.arch == "glm5-next"
            && ["attn_q_a", "attn_q_b", "nextn.eh_proj"]
                .iter()
                .any(|s| name.contains(s))
        {
            return Ok(T::Q8_0);
        }

        // A tied token embedding is also the output projection, and quantized as one.
        if cat == Category::Output || (self.tied && cat == Category::TokenEmbd) {
            // Only a tied embedding gets here with --output-tensor-type set.
            return Ok(if let Some(out) = self.opts.output_tensor_type {
                out
            } else if mix == M::MXFP4_MOE || falcon || t.ne(0) % ty.block_len() as u64 != 0 {
                T::Q8_0
            } else if ty != T::Q8_0 {
                T::Q6_K
            } else {
                ty
            });
        }

        // MXFP4_MOE: the experts (stacked, three dimensions) MXFP4, every other matrix Q8_0.
        // (llama.cpp tells BailingMoE 3's experts from its other 3-D tensors by role.)
        if mix == M::MXFP4_MOE {
            let bailing_other = f.arch == "bailingmoe3"
                && !matches!(cat, Category::FfnUp | Category::FfnGate | Category::FfnDown);
            return Ok(if t.ne(2) > 1 && !bailing_other {
                T::MXFP4
            } else {
                T::Q8_0
            });
        }

        match cat {
            Category::TokenEmbd => {
                if let Some(te) = self.opts.token_embedding_type {
                    ty = te;
                }
            }
            Category::AttnV => {
                let (i, n) = (self.i_attn_v, self.n_attn_v);
                ty = match mix {
                    M::Q2_K if gqa >= 4 => T::Q4_K,
                    M::Q2_K => T::Q3_K,
                    M::Q2_K_S if gqa >= 4 => T::Q4_K,
                    M::Q3_K_M if i < 2 => T::Q5_K,
                    M::Q3_K_M => T::Q4_K,
                    M::Q3_K_L => T::Q5_K,
                    M::IQ4_NL | M::IQ4_XS if gqa >= 4 => T::Q5_K,
                    M::Q4_K_M | M::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                    M::Q4_K_S if i < 4 => T::Q5_K,
                    _ => ty,
                };
                // A 70B model shares V between 8 heads: more bits cost little.
                if f.is_70b() && matches!(ty, T::Q3_K | T::Q4_K) {
                    ty = T::Q5_K;
                }
                if eight_experts {
                    ty = T::Q8_0;
                }
                self.i_attn_v += 1;
            }
            Category::AttnK => {
                if eight_experts {
                    ty = T::Q8_0;
                }
            }
            Category::FfnDown => {
                let (i, n) = self.layer(t, self.i_ffn_down)?;
                let more = use_more_bits(i, n);
                ty = match mix {
                    M::Q2_K => T::Q3_K,
                    M::Q2_K_S if i < n / 8 => T::Q4_K,
                    M::Q3_K_M if i < n / 16 => T::Q5_K,
                    M::Q3_K_M if !falcon || more => T::Q4_K,
                    M::Q3_K_M => T::Q3_K,
                    M::Q3_K_L if falcon => T::Q4_K,
                    M::Q3_K_L => T::Q5_K,
                    M::Q4_K_M if falcon && i < n / 16 => T::Q6_K,
                    M::Q4_K_M if falcon && more => T::Q5_K,
                    M::Q4_K_M if !falcon && more => T::Q6_K,
                    M::IQ4_NL | M::IQ4_XS if i < n / 8 && !self.opts.has_imatrix => T::Q5_K,
                    M::Q5_K_M if more => T::Q6_K,
                    M::Q4_K_S if !falcon && i < n / 8 => T::Q5_K,
                    // With importance data, the first layers of Q4_0/Q5_0 take the offset
                    // variant.
                    M::Q4_0 if self.opts.has_imatrix && i < n / 8 => T::Q4_1,
                    M::Q5_0 if self.opts.has_imatrix && i < n / 8 => T::Q5_1,
                    _ => ty,
                };
                self.i_ffn_down += 1;
            }
            Category::AttnOutput => {
                ty = if falcon {
                    if mix == M::Q3_K_L {
                        T::Q4_K
                    } else {
                        ty
                    }
                } else if eight_experts {
                    let bumped = [
                        M::Q2_K,
                        M::Q3_K_S,
                        M::Q3_K_M,
                        M::IQ4_NL,
                        M::Q4_K_S,
                        M::Q4_K_M,
                        M::IQ4_XS,
                    ];
                    if bumped.contains(&mix) {
                        T::Q5_K
                    } else {
                        ty
                    }
                } else {
                    match mix {
                        M::Q2_K => T::Q3_K,
                        M::Q3_K_M => T::Q4_K,
                        M::Q3_K_L => T::Q5_K,
                        _ => ty,
                    }
                };
            }
            // Only the IQ3_XS mix changes these; the layer is still checked.
            Category::FfnGate => {
                self.layer(t, self.i_ffn_gate)?;
                self.i_ffn_gate += 1;
            }
            Category::FfnUp => {
                self.layer(t, self.i_ffn_up)?;
                self.i_ffn_up += 1;
            }
            Category::AttnQ | Category::Output | Category::Other => {}
        }
        Ok(ty)
    }
}

/// llama.cpp's `tensor_type_fallback`: a type whose blocks divide the row length, in place of
/// one whose blocks do not.
fn fallback(t: &TensorDesc, ty: GgmlType) -> Result<(GgmlType, Option<GgmlType>), RuleError> {
    let row = t.ne(0);
    if row % ty.block_len() as u64 == 0 {
        return Ok((ty, None));
    }
    let mut to = match ty {
        T::IQ1_S
        | T::IQ1_M
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ4_XS => T::IQ4_NL,
        T::Q2_K | T::Q3_K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        // A type of 32-value blocks has nothing smaller but 16 bits.
        _ if ty.block_len() <= 32 => ty,
        _ => {
            return Err(RuleError::NoFallback {
                tensor: t.name.clone(),
                ty,
                row,
            })
        }
    };
    if row % to.block_len() as u64 != 0 {
        to = T::F16;
    }
    Ok((to, Some(ty)))
}

/// llama.cpp's `tensor_requires_imatrix`.
fn requires_imatrix(name: &str, ty: GgmlType, mix: Mix) -> bool {
    if is_token_embd(name) || name == "output.weight" {
        return false;
    }
    match ty {
        T::IQ3_XXS | T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ1_M | T::IQ1_S => true,
        T::Q2_K => mix == Mix::Q2_K_S,
        _ => false,
    }
}

/// The type of every tensor of `tensors` when llama-quantize makes `mix` of the model, in the
/// order llama-quantize writes them (see [`output_order`]), or the first reason it would fail
/// (or would make a type synapse cannot write).
pub fn plan(
    model: &ModelFacts,
    tensors: &[TensorDesc],
    mix: Mix,
    opts: &Options,
) -> Result<Vec<Choice>, RuleError> {
    let patterns = opts
        .tensor_types
        .iter()
        .map(|o| Pattern::compile(&o.pattern))
        .collect::<Result<Vec<_>, _>>()?;
    let order = output_order(tensors);
    for w in order.windows(2) {
        if tensors[w[0]].name == tensors[w[1]].name {
            return Err(RuleError::DuplicateTensor {
                tensor: tensors[w[0]].name.clone(),
            });
        }
    }
    if let Some(t) = tensors.iter().find(|t| t.name.len() >= 64) {
        return Err(RuleError::NameTooLong {
            tensor: t.name.clone(),
            len: t.name.len(),
        });
    }
    let mut walk = Walk {
        facts: model,
        mix,
        opts,
        patterns,
        tied: !tensors.iter().any(|t| t.name == "output.weight"),
        n_attn_v: tensors
            .iter()
            .filter(|t| category(&t.name) == Category::AttnV)
            .count() as i64,
        i_attn_v: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
    };

    // As llama-quantize: every type first (the rules count as they go), then the conversions.
    let mut choices = Vec::with_capacity(tensors.len());
    for &index in &order {
        let t = &tensors[index];
        let quantizable = allows_quantization(t, &model.arch, opts);
        let (to, fallback_from) = if quantizable {
            walk.decide(t)?
        } else {
            (t.ggml_type, None)
        };
        let requires_imatrix = requires_imatrix(&t.name, to, mix);
        if quantizable && requires_imatrix && !opts.has_imatrix {
            return Err(RuleError::ImatrixRequired {
                tensor: t.name.clone(),
                ty: to,
            });
        }
        choices.push(Choice {
            index,
            from: t.ggml_type,
            to,
            quantizable,
            fallback_from,
            requires_imatrix,
        });
    }
    for c in choices.iter().filter(|c| c.converts()) {
        let t = &tensors[c.index];
        let tensor = || t.name.clone();
        if is_quantized(c.from) && !opts.allow_requantize {
            return Err(RuleError::RequantizeDisabled {
                tensor: tensor(),
                from: c.from,
                to: c.to,
            });
        }
        if !is_quantized(c.from) && !matches!(c.from, T::F32 | T::F16 | T::BF16) {
            return Err(RuleError::CannotConvert {
                tensor: tensor(),
                from: c.from,
            });
        }
        if !synapse_quant::encode::can_encode(c.to) {
            return Err(RuleError::Unwritable {
                tensor: tensor(),
                ty: c.to,
            });
        }
        if t.ne(0) % c.to.block_len() as u64 != 0 {
            return Err(RuleError::RowNotBlocks {
                tensor: tensor(),
                ty: c.to,
                row: t.ne(0),
            });
        }
    }
    Ok(choices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn desc(name: &str, ty: GgmlType, shape: &[u64]) -> TensorDesc {
        let (name, shape) = (name.into(), shape.to_vec());
        TensorDesc {
            name,
            ggml_type: ty,
            shape,
        }
    }

    fn facts(arch: &str, n_layer: u32, n_head: u32, n_head_kv: u32, n_expert: u32) -> ModelFacts {
        let arch = arch.into();
        ModelFacts {
            arch,
            n_layer,
            n_layer_nextn: 0,
            n_expert,
            n_head,
            n_head_kv,
        }
    }

    fn opts(set: impl FnOnce(&mut Options)) -> Options {
        let mut o = Options::default();
        set(&mut o);
        o
    }

    /// A llama-shaped model in a converter's order (not llama.cpp's): F16 matrices with rows of
    /// `n_embd` (512 for ffn_down), F32 norms, and `output.weight` unless `tied`.
    fn llama(n_layer: u32, n_embd: u64, tied: bool) -> Vec<TensorDesc> {
        let (h, f) = (T::F16, T::F32);
        let mut t = vec![desc("token_embd.weight", h, &[n_embd, 64])];
        for i in 0..n_layer {
            #[rustfmt::skip]
            let layer = [
                ("attn_norm", f, &[n_embd][..]), ("attn_q", h, &[n_embd, n_embd]),
                ("attn_k", h, &[n_embd, 64]), ("attn_v", h, &[n_embd, 64]),
                ("attn_output", h, &[n_embd, n_embd]), ("ffn_norm", f, &[n_embd]),
                ("ffn_gate", h, &[n_embd, 512]), ("ffn_up", h, &[n_embd, 512]),
                ("ffn_down", h, &[512, n_embd]),
            ];
            for (n, ty, shape) in layer {
                t.push(desc(&format!("blk.{i}.{n}.weight"), ty, shape));
            }
        }
        t.push(desc("output_norm.weight", f, &[n_embd]));
        if !tied {
            t.push(desc("output.weight", h, &[n_embd, 64]));
        }
        t
    }

    fn types(m: &ModelFacts, t: &[TensorDesc], mix: Mix, o: &Options) -> HashMap<String, GgmlType> {
        let choices = plan(m, t, mix, o).unwrap();
        choices
            .iter()
            .map(|c| (t[c.index].name.clone(), c.to))
            .collect()
    }

    /// The types of one kind of tensor, layer by layer.
    fn per_layer(ty: &HashMap<String, GgmlType>, kind: &str, n: u32) -> Vec<GgmlType> {
        (0..n)
            .map(|i| ty[&format!("blk.{i}.{kind}.weight")])
            .collect()
    }

    #[test]
    fn mixes_are_named_as_llama_quantize_names_them() {
        for &m in Mix::ALL {
            assert_eq!(Mix::parse(m.name()).unwrap(), m);
            assert_eq!(Mix::parse(&m.name().to_lowercase()).unwrap(), m);
            assert_eq!(Mix::parse(&m.file_type().to_string()).unwrap(), m);
        }
        assert_eq!(Mix::from_name("q4_k"), Some(Mix::Q4_K_M));
        assert_eq!(Mix::from_name("Q3_K"), Some(Mix::Q3_K_M));
        assert_eq!(Mix::from_name(" 17 junk"), Some(Mix::Q5_K_M));
        assert_eq!(
            (Mix::Q4_K_M.file_type(), Mix::Q2_K_S.default_type()),
            (15, T::Q2_K)
        );
        for unsupported in ["IQ2_XXS", "f32", "COPY", "0", "36"] {
            let e = Mix::parse(unsupported).unwrap_err();
            assert!(
                matches!(e, RuleError::UnsupportedMix { .. }),
                "{unsupported}: {e}"
            );
        }
        for unknown in ["Q4_K_X", "", "99", "-"] {
            let e = Mix::parse(unknown).unwrap_err();
            assert!(matches!(e, RuleError::UnknownMix { .. }), "{unknown}: {e}");
        }
    }

    #[test]
    fn tensors_go_in_loader_order() {
        let mut t = llama(11, 256, false);
        t.push(desc("blk.x.odd.weight", T::F32, &[4]));
        let choices = plan(
            &facts("llama", 11, 4, 2, 0),
            &t,
            Mix::Q8_0,
            &Options::default(),
        );
        let order: Vec<&str> = choices
            .unwrap()
            .iter()
            .map(|c| t[c.index].name.as_str())
            .collect();
        let first = [
            "blk.x.odd",
            "output",
            "output_norm",
            "token_embd",
            "blk.0.attn_k",
        ];
        assert_eq!(order[..5], first.map(|n| format!("{n}.weight")));
        let pos = |n: &str| order.iter().position(|&o| o == n).unwrap();
        assert!(pos("blk.9.ffn_up.weight") < pos("blk.10.attn_k.weight"));
        assert_eq!(order.last(), Some(&"blk.10.ffn_up.weight"));
    }

    #[test]
    fn which_tensors_are_quantized() {
        let o = Options::default();
        let yes =
            |n: &str, shape: &[u64]| allows_quantization(&desc(n, T::F32, shape), "llama", &o);
        assert!(
            yes("blk.0.attn_q.weight", &[64, 64])
                && yes("blk.0.ffn_down_exps.weight", &[64, 64, 8])
        );
        assert!(!yes("blk.0.attn_q.weight", &[64]) && !yes("blk.0.attn_q.weight", &[64, 1, 1]));
        assert!(!yes("blk.0.attn_q.bias", &[64, 64]) && !yes("blk.0.attn_norm.weight", &[64, 64]));
        assert!(
            !yes("blk.0.ffn_gate_inp.weight", &[64, 8]) && !yes("position_embd.weight", &[64, 64])
        );
        assert!(!yes("v.patch_embd.weight", &[64, 64]));
        // llama.cpp's test of the suffix passes names of five bytes.
        assert!(yes("abcde", &[64, 64]));
        let leave = opts(|o| o.leave_output_tensor = true);
        assert!(!allows_quantization(
            &desc("output.weight", T::F16, &[64, 64]),
            "llama",
            &leave
        ));
        let glm = |n: &str| allows_quantization(&desc(n, T::F16, &[64, 64]), "glm5-next", &o);
        assert!(!glm("blk.0.attn_k_b.weight") && glm("blk.0.attn_q.weight"));
    }

    #[test]
    fn two_layers_each_mix() {
        // 4 heads over 2 key/value heads; layer 1 is in the last eighth (more bits).
        let (m, t) = (facts("llama", 2, 4, 2, 0), llama(2, 256, false));
        use T::*;
        #[rustfmt::skip]
        let table = [
            // attn_v.0, attn_v.1, ffn_down.0, ffn_down.1, attn_output, attn_q, output
            (Mix::F16, [F16, F16, F16, F16, F16, F16, F16]),
            (Mix::Q4_0, [Q4_0, Q4_0, Q4_0, Q4_0, Q4_0, Q4_0, Q6_K]),
            (Mix::Q8_0, [Q8_0, Q8_0, Q8_0, Q8_0, Q8_0, Q8_0, Q8_0]),
            (Mix::Q2_K, [Q3_K, Q3_K, Q3_K, Q3_K, Q3_K, Q2_K, Q6_K]),
            (Mix::Q3_K_S, [Q3_K, Q3_K, Q3_K, Q3_K, Q3_K, Q3_K, Q6_K]),
            (Mix::Q3_K_M, [Q5_K, Q5_K, Q4_K, Q4_K, Q4_K, Q3_K, Q6_K]),
            (Mix::Q3_K_L, [Q5_K, Q5_K, Q5_K, Q5_K, Q5_K, Q3_K, Q6_K]),
            (Mix::Q4_K_S, [Q5_K, Q5_K, Q4_K, Q4_K, Q4_K, Q4_K, Q6_K]),
            (Mix::Q4_K_M, [Q4_K, Q6_K, Q4_K, Q6_K, Q4_K, Q4_K, Q6_K]),
            (Mix::Q5_K_M, [Q5_K, Q6_K, Q5_K, Q6_K, Q5_K, Q5_K, Q6_K]),
            (Mix::Q6_K, [Q6_K, Q6_K, Q6_K, Q6_K, Q6_K, Q6_K, Q6_K]),
            (Mix::IQ4_NL, [IQ4_NL, IQ4_NL, IQ4_NL, IQ4_NL, IQ4_NL, IQ4_NL, Q6_K]),
            (Mix::IQ4_XS, [IQ4_XS, IQ4_XS, IQ4_XS, IQ4_XS, IQ4_XS, IQ4_XS, Q6_K]),
        ];
        for (mix, want) in table {
            let ty = types(&m, &t, mix, &Options::default());
            let names = [
                "0.attn_v",
                "1.attn_v",
                "0.ffn_down",
                "1.ffn_down",
                "1.attn_output",
                "1.attn_q",
            ];
            let mut got: Vec<GgmlType> = names
                .iter()
                .map(|n| ty[&format!("blk.{n}.weight")])
                .collect();
            got.push(ty["output.weight"]);
            assert_eq!(got, want, "{mix}");
            let embd = if mix == Mix::F16 {
                F16
            } else {
                mix.default_type()
            };
            assert_eq!(
                (ty["token_embd.weight"], ty["blk.0.attn_norm.weight"]),
                (embd, F32)
            );
        }
    }

    #[test]
    fn thirty_two_layers_more_bits_where_llama_cpp_puts_them() {
        // 32 heads over 8: grouped 4 to 1.
        let (m, t) = (facts("llama", 32, 32, 8, 0), llama(32, 256, false));
        let more = |i: u32| !(4..28).contains(&i) || (i + 2) % 3 == 2;
        let q4km: Vec<_> = (0..32)
            .map(|i| if more(i) { T::Q6_K } else { T::Q4_K })
            .collect();
        let ty = types(&m, &t, Mix::Q4_K_M, &Options::default());
        assert_eq!(per_layer(&ty, "attn_v", 32), q4km);
        assert_eq!(per_layer(&ty, "ffn_down", 32), q4km);
        assert_eq!(per_layer(&ty, "ffn_up", 32), [T::Q4_K; 32]);
        let ty = types(&m, &t, Mix::Q3_K_M, &Options::default());
        let q3km: Vec<_> = (0..32)
            .map(|i| if i < 2 { T::Q5_K } else { T::Q4_K })
            .collect();
        assert_eq!(
            (per_layer(&ty, "attn_v", 32), per_layer(&ty, "ffn_down", 32)),
            (q3km.clone(), q3km)
        );
        // Grouped 4 to 1: V takes 4 bits in Q2_K, 5 in IQ4_NL.
        assert_eq!(
            types(&m, &t, Mix::Q2_K, &Options::default())["blk.5.attn_v.weight"],
            T::Q4_K
        );
        let ty = types(&m, &t, Mix::IQ4_NL, &Options::default());
        assert_eq!(ty["blk.5.attn_v.weight"], T::Q5_K);
        assert_eq!(
            per_layer(&ty, "ffn_down", 5),
            [T::Q5_K, T::Q5_K, T::Q5_K, T::Q5_K, T::IQ4_NL]
        );
        // With importance data: IQ4_NL's first ffn_down stay, Q4_0's take Q4_1; Q2_K_S needs it.
        let imatrix = opts(|o| o.has_imatrix = true);
        assert_eq!(
            types(&m, &t, Mix::IQ4_NL, &imatrix)["blk.3.ffn_down.weight"],
            T::IQ4_NL
        );
        let ty = types(&m, &t, Mix::Q4_0, &imatrix);
        assert_eq!(per_layer(&ty, "ffn_down", 32)[3..5], [T::Q4_1, T::Q4_0]);
        let ty = types(&m, &t, Mix::Q2_K_S, &imatrix);
        assert_eq!(per_layer(&ty, "ffn_down", 32)[3..5], [T::Q4_K, T::Q2_K]);
        assert_eq!(ty["blk.4.attn_v.weight"], T::Q4_K);
        let e = plan(&m, &t, Mix::Q2_K_S, &Options::default()).unwrap_err();
        assert!(
            matches!(e, RuleError::ImatrixRequired { tensor, .. } if tensor == "blk.0.attn_k.weight")
        );
    }

    #[test]
    fn rows_not_of_whole_blocks_fall_back() {
        let (m, t) = (facts("llama", 2, 4, 2, 0), llama(2, 96, false));
        let find = |mix: Mix, name: &str| {
            let choices = plan(&m, &t, mix, &Options::default()).unwrap();
            let c = choices.iter().find(|c| t[c.index].name == name).unwrap();
            (c.to, c.fallback_from)
        };
        for (mix, q) in [
            (Mix::Q4_K_M, T::Q5_0),
            (Mix::Q5_K_S, T::Q5_1),
            (Mix::Q6_K, T::Q8_0),
            (Mix::Q2_K, T::Q4_0),
            (Mix::IQ4_XS, T::IQ4_NL),
        ] {
            assert_eq!(
                find(mix, "blk.0.attn_q.weight"),
                (q, Some(mix.default_type())),
                "{mix}"
            );
            // The output is Q8_0 by rule (not by fallback); ffn_down's rows are 512.
            assert_eq!(find(mix, "output.weight"), (T::Q8_0, None), "{mix}");
            assert_eq!(find(mix, "blk.0.ffn_down.weight").1, None);
        }
        // Q4_0's blocks fit rows of 96, so the output takes Q6_K by rule, then falls back.
        assert_eq!(find(Mix::Q4_0, "output.weight"), (T::Q8_0, Some(T::Q6_K)));
        // Rows of 48: only 16 bits fit.
        let ty = types(&m, &llama(2, 48, true), Mix::Q4_K_M, &Options::default());
        assert_eq!(
            (ty["blk.0.attn_q.weight"], ty["token_embd.weight"]),
            (T::F16, T::F16)
        );
    }

    #[test]
    fn pure_and_overrides() {
        let (m, t) = (facts("llama", 32, 32, 8, 0), llama(32, 256, false));
        let pure = opts(|o| o.pure = true);
        let ty = types(&m, &t, Mix::Q4_K_M, &pure);
        assert!(t
            .iter()
            .all(|d| ty[&d.name] == if d.shape.len() == 1 { T::F32 } else { T::Q4_K }));
        assert_eq!(
            types(&m, &llama(2, 96, false), Mix::Q4_K_M, &pure)["output.weight"],
            T::Q5_0
        );

        let o = opts(|o| {
            o.output_tensor_type = Some(T::Q8_0);
            o.token_embedding_type = Some(T::Q5_K);
            o.tensor_types = [(r"blk\.0\.attn_v", T::Q8_0), ("ffn_up", T::Q4_0)]
                .map(|(p, ty)| TensorTypeOverride {
                    pattern: p.into(),
                    ty,
                })
                .to_vec();
        });
        let ty = types(&m, &t, Mix::Q3_K_M, &o);
        assert_eq!(
            (ty["output.weight"], ty["token_embd.weight"]),
            (T::Q8_0, T::Q5_K)
        );
        assert_eq!(ty["blk.7.ffn_up.weight"], T::Q4_0);
        // The overridden V is not counted: the "first two" are layers 1 and 2.
        assert_eq!(
            per_layer(&ty, "attn_v", 4),
            [T::Q8_0, T::Q5_K, T::Q5_K, T::Q4_K]
        );
        // A 16-bit mix ignores the patterns, not the output and embedding types.
        let ty = types(&m, &t, Mix::BF16, &o);
        assert_eq!(
            (ty["output.weight"], ty["blk.0.attn_v.weight"]),
            (T::Q8_0, T::BF16)
        );
    }

    #[test]
    fn tied_embeddings_are_quantized_as_the_output() {
        let (m, t) = (facts("gemma3", 2, 4, 1, 0), llama(2, 256, true));
        assert_eq!(
            types(&m, &t, Mix::Q4_K_M, &Options::default())["token_embd.weight"],
            T::Q6_K
        );
        let out = opts(|o| o.output_tensor_type = Some(T::Q5_0));
        assert_eq!(
            types(&m, &t, Mix::Q4_K_M, &out)["token_embd.weight"],
            T::Q5_0
        );
        // Grouped 4 to 1: V takes Q5_K in IQ4_XS.
        assert_eq!(
            types(&m, &t, Mix::IQ4_XS, &Options::default())["blk.0.attn_v.weight"],
            T::Q5_K
        );
    }

    #[test]
    fn architectures_and_experts() {
        let d = Options::default();
        // Falcon: a Q8_0 output, and its own ffn_down steps in Q4_K_M.
        let ty = types(
            &facts("falcon", 32, 8, 1, 0),
            &llama(32, 256, false),
            Mix::Q4_K_M,
            &d,
        );
        assert_eq!(ty["output.weight"], T::Q8_0);
        let (q4, q5, q6) = (T::Q4_K, T::Q5_K, T::Q6_K);
        assert_eq!(per_layer(&ty, "ffn_down", 7), [q6, q6, q5, q5, q4, q4, q5]);
        // A 70B llama (80 layers, grouped heads): V of Q3_K_S takes Q5_K; not with equal heads.
        let t80 = llama(80, 256, false);
        assert_eq!(
            types(&facts("llama", 80, 64, 8, 0), &t80, Mix::Q3_K_S, &d)["blk.4.attn_v.weight"],
            q5
        );
        assert_eq!(
            types(&facts("llama", 80, 8, 8, 0), &t80, Mix::Q3_K_S, &d)["blk.4.attn_v.weight"],
            T::Q3_K
        );

        // Eight experts: K and V at 8 bits, attn_output Q5_K, ffn_down's layer from its name.
        let mut moe = vec![desc("output.weight", T::F16, &[256, 64])];
        for i in (0..4).rev() {
            for n in ["attn_k", "attn_v", "attn_output"] {
                moe.push(desc(&format!("blk.{i}.{n}.weight"), T::F16, &[256, 256]));
            }
            moe.push(desc(
                &format!("blk.{i}.ffn_down_exps.weight"),
                T::F16,
                &[256, 256, 8],
            ));
        }
        let m = facts("llama", 4, 8, 2, 8);
        let ty = types(&m, &moe, Mix::Q4_K_M, &d);
        let kinds = ["attn_k", "attn_v", "attn_output"].map(|k| ty[&format!("blk.1.{k}.weight")]);
        assert_eq!(kinds, [T::Q8_0, T::Q8_0, T::Q5_K]);
        assert_eq!(per_layer(&ty, "ffn_down_exps", 4), [q4, q4, q6, q6]);
        moe.push(desc("ffn_down_exps.weight", T::F16, &[256, 256, 8]));
        assert!(matches!(
            plan(&m, &moe, Mix::Q4_K_M, &d),
            Err(RuleError::BadLayer { .. })
        ));
    }

    #[test]
    fn refusals() {
        let (m, mut t) = (facts("llama", 2, 4, 2, 0), llama(2, 256, false));
        let err = |t: &[TensorDesc], o: &Options| plan(&m, t, Mix::Q4_K_M, o).unwrap_err();
        let iq2 = opts(|o| o.output_tensor_type = Some(T::IQ2_XXS));
        assert!(matches!(
            err(&t, &iq2),
            RuleError::Unwritable { ty: T::IQ2_XXS, .. }
        ));
        let regex = opts(|o| {
            o.tensor_types = vec![TensorTypeOverride {
                pattern: "attn_(q|k)".into(),
                ty: T::Q8_0,
            }]
        });
        assert!(matches!(
            err(&t, &regex),
            RuleError::UnsupportedPattern { .. }
        ));
        t[2].ggml_type = T::Q4_0;
        assert!(matches!(
            err(&t, &Options::default()),
            RuleError::RequantizeDisabled { .. }
        ));
        assert!(plan(&m, &t, Mix::Q4_K_M, &opts(|o| o.allow_requantize = true)).is_ok());
        // Already the type chosen: copied, not requantized.
        t[2].ggml_type = T::Q4_K;
        assert!(plan(&m, &t, Mix::Q4_K_M, &Options::default()).is_ok());
        t.push(t[2].clone());
        assert!(matches!(
            err(&t, &Options::default()),
            RuleError::DuplicateTensor { .. }
        ));
    }

    #[test]
    fn patterns() {
        let m = |p: &str, n: &str| Pattern::compile(p).unwrap().is_match(n);
        assert!(m("attn_v", "blk.0.attn_v.weight") && m("", "anything"));
        assert!(m(r"blk\.1\.", "blk.1.ffn_up.weight") && !m(r"blk\.1\.", "blk.10.ffn_up.weight"));
        assert!(m("blk.1.", "blk.1x.ffn_up.weight") && m(r"a\$", "xa$y"));
        assert!(m("^blk", "blk.0.x") && !m("^lk", "blk.0.x"));
        assert!(m("weight$", "a.weight") && !m("weigh$", "a.weight"));
        for bad in ["a*", "a|b", "[ab]", r"\d", "a^b"] {
            assert!(Pattern::compile(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn facts_from_metadata() {
        let mut meta = Metadata::default();
        let heads = Value::Array(synapse_gguf::Array::U32(vec![32; 48]));
        meta.insert("general.architecture", Value::String("qwen3moe".into()));
        meta.insert("qwen3moe.block_count", Value::U32(48));
        meta.insert("qwen3moe.expert_count", Value::U32(128));
        meta.insert("qwen3moe.attention.head_count", heads);
        let f = ModelFacts::from_metadata(&meta).unwrap();
        assert_eq!(
            (f.n_layer, f.n_expert, f.n_head, f.n_head_kv, f.n_gqa()),
            (48, 128, 32, 32, 1)
        );
        meta.insert("qwen3moe.attention.head_count_kv", Value::U32(4));
        assert_eq!(ModelFacts::from_metadata(&meta).unwrap().n_gqa(), 8);
        meta.insert(
            "general.architecture",
            Value::String("graniteswitch".into()),
        );
        meta.insert("graniteswitch.block_count", Value::U32(40));
        let f = ModelFacts::from_metadata(&meta).unwrap();
        assert_eq!((f.n_layer, f.n_layer_nextn, f.n_head), (41, 1, 0));
        meta.insert("general.architecture", Value::String("mystery".into()));
        assert!(ModelFacts::from_metadata(&meta).is_err());
    }
}
