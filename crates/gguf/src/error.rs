//! Errors from reading and writing GGUF files. Each names the field, tensor or key at fault and,
//! where there is one, the byte offset in the file.

use std::path::PathBuf;

use crate::value::ValueType;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, mapped or written. The message holds the system's reason
    /// (not a separate `source`, so that an error chain does not print it twice).
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// The path names something other than a regular file: a directory, a device, a FIFO.
    /// Checked before opening (opening a FIFO would wait for a writer).
    #[error("{}: {what}, not a regular file", path.display())]
    NotAFile { path: PathBuf, what: &'static str },

    /// What was wrong with the contents of the file at `path` (the other variants name the
    /// offset in the file, not the file). As with `Io`, the inner error is in the message, not
    /// a separate `source`.
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<GgufError>,
    },

    #[error("not a GGUF file: the first four bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },

    #[error("GGUF version {version} is not supported (synapse reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },

    #[error("big-endian GGUF files are not supported (version field reads {raw:#010x})")]
    BigEndian { raw: u32 },

    #[error("truncated file: {what} at byte {offset} needs {need} bytes, only {have} remain")]
    Truncated {
        what: String,
        offset: u64,
        need: u64,
        have: u64,
    },

    #[error(
        "{what} at byte {offset}: count {count} cannot fit in the {remaining} bytes that remain"
    )]
    CountTooLarge {
        what: String,
        offset: u64,
        count: u64,
        remaining: u64,
    },

    #[error("{what} at byte {offset}: unknown metadata value type {type_id}")]
    BadValueType {
        what: String,
        offset: u64,
        type_id: u32,
    },

    #[error("{what} at byte {offset}: not valid UTF-8")]
    BadUtf8 { what: String, offset: u64 },

    #[error("{what} at byte {offset}: arrays nested deeper than {max} levels")]
    NestedTooDeep { what: String, offset: u64, max: u32 },

    #[error("metadata key `{key}` at byte {offset} appears twice")]
    DuplicateKey { key: String, offset: u64 },

    #[error("metadata `general.alignment` = {value}: must be a power of two between 1 and 2^30")]
    BadAlignment { value: String },

    #[error("tensor `{tensor}` at byte {offset}: {n_dims} dimensions, at most {max} allowed")]
    TooManyDims {
        tensor: String,
        offset: u64,
        n_dims: u32,
        max: u32,
    },

    #[error("tensor `{tensor}` at byte {offset}: unknown ggml type id {type_id}")]
    UnknownType {
        tensor: String,
        offset: u64,
        type_id: u32,
    },

    #[error("tensor `{tensor}` ({ggml_type}, shape {shape:?}): {reason}")]
    BadShape {
        tensor: String,
        ggml_type: crate::GgmlType,
        shape: Vec<u64>,
        reason: String,
    },

    #[error(
        "tensor `{tensor}`: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error(
        "tensor `{tensor}`: data at bytes [{start}, {end}) of the data section lies outside it \
         ({len} bytes, starting at file byte {data_start})"
    )]
    OutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
        data_start: u64,
    },

    #[error("tensors `{first}` and `{second}` overlap at data offset {offset}")]
    Overlap {
        first: String,
        second: String,
        offset: u64,
    },

    #[error("tensor name `{tensor}` at byte {offset} appears twice")]
    DuplicateTensor { tensor: String, offset: u64 },

    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },

    #[error("metadata `{key}` is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: ValueType,
    },

    #[error("tensor `{tensor}` not found")]
    MissingTensor { tensor: String },

    #[error("writing GGUF: {0}")]
    Write(String),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
