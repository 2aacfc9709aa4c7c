//! Errors from building a tokenizer out of GGUF metadata. Each names the key or token at fault.

/// Why a vocabulary could not be loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    #[error("GGUF metadata has no `{key}`: the file carries no usable vocabulary")]
    MissingKey { key: &'static str },

    #[error("GGUF metadata `{key}` is {found}, expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },

    #[error(
        "tokenizer model `{model}` (from `tokenizer.ggml.model`) is not supported; \
         supported: {supported}"
    )]
    UnsupportedModel { model: String, supported: String },

    #[error(
        "pre-tokenizer `{pre}` (from `tokenizer.ggml.pre`) is not supported; \
         supported: {supported}"
    )]
    UnknownPreTokenizer { pre: String, supported: String },

    #[error(
        "`{key}` has {found} entries, fewer than the {expected} tokens of `tokenizer.ggml.tokens`"
    )]
    LengthMismatch {
        key: &'static str,
        found: usize,
        expected: usize,
    },

    #[error("`tokenizer.ggml.tokens` is empty")]
    EmptyVocabulary,

    #[error("`tokenizer.ggml.tokens` has {count} entries, more than token ids can address")]
    TooManyTokens { count: usize },

    #[error(
        "token {id} {text:?} appears twice in `tokenizer.ggml.tokens` (first as token {first})"
    )]
    DuplicateToken { id: u32, first: u32, text: String },

    #[error("token {id} {text:?} has type BYTE but is not of the form <0xHH>")]
    BadByteToken { id: u32, text: String },

    #[error(
        "token {id} has type {value} in `tokenizer.ggml.token_type`: the types are 0 to 6 \
         (undefined, normal, unknown, control, user-defined, unused, byte)"
    )]
    BadTokenType { id: u32, value: i32 },

    #[error(
        "none of the {count} tokens of `tokenizer.ggml.tokens` is a non-empty normal, byte, \
         user-defined or unknown token: the vocabulary cannot encode any text"
    )]
    NoTextTokens { count: usize },
}
