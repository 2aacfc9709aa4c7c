//! Quantizing a model file: the plan of [`super::rules`], then each tensor read in place,
//! decoded to f32, encoded by `synapse_quant::encode` on the threads and streamed out, with
//! the metadata llama-quantize writes, so that the output is llama-quantize's byte for byte.

use std::path::Path;

use synapse_gguf::{GgmlType, GgufFile, Metadata, StreamWriter, TensorSpec, Value};
use synapse_quant::encode;

use super::imatrix::Imatrix;
use super::rules::{self, Choice, Mix, Options, RuleError};

/// ggml's quantization version, written to `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;
/// Decoded f32 values a thread holds at once.
const SLAB_VALUES: usize = 4 << 20;

/// What to make of a model.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub mix: Mix,
    pub options: Options,
    /// The importance matrix and the path it was read from (recorded in the metadata).
    pub imatrix: Option<(&'a Imatrix, String)>,
    pub threads: usize,
}

/// Why a file could not be quantized. Nothing is left at the output path.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Rules(#[from] RuleError),
    #[error(transparent)]
    Gguf(#[from] synapse_gguf::GgufError),
    #[error("tensor `{tensor}`: {to} needs an importance matrix (--imatrix) for it")]
    NeedsImatrix { tensor: String, to: GgmlType },
    #[error("{0}")]
    Imatrix(String),
    #[error("tensor `{tensor}` has {dims} dimensions; at most 3 (rows of experts) are quantized")]
    TooManyDims { tensor: String, dims: usize },
    #[error("tensor `{tensor}` ({from} to {to}): {error}")]
    Encode {
        tensor: String,
        from: GgmlType,
        to: GgmlType,
        error: synapse_quant::QuantError,
    },
}

/// One tensor written, for progress reports.
#[derive(Debug, Clone)]
pub struct Written<'a> {
    /// 1-based, of `total`.
    pub index: usize,
    pub total: usize,
    pub name: &'a str,
    pub shape: &'a [u64],
    pub choice: Choice,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Totals of a finished run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub tensors: usize,
    pub converted: usize,
    /// Tensors whose row length forced a type other than the rules' choice.
    pub fallbacks: usize,
    /// Converted tensors the importance matrix had no entry for.
    pub without_importance: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// The output's metadata as llama-quantize writes it: the input's keys in their order, then
/// the quantization version and file type (moved to the end, as ggml's setters do), without
/// the split keys, and then the importance matrix's provenance.
pub fn output_metadata(
    input: &Metadata,
    file_type: u32,
    imatrix: Option<(&Imatrix, &str)>,
) -> Metadata {
    let mut meta = input.clone();
    let set_last = |meta: &mut Metadata, key: &str, value: Value| {
        meta.remove(key);
        meta.insert(key, value);
    };
    set_last(
        &mut meta,
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    set_last(&mut meta, "general.file_type", Value::U32(file_type));
    for key in ["split.no", "split.count", "split.tensors.count"] {
        meta.remove(key);
    }
    if let Some((m, path)) = imatrix {
        // llama-quantize passes these as overrides of at most 127 bytes.
        set_last(
            &mut meta,
            "quantize.imatrix.file",
            Value::String(truncate(path, 127)),
        );
        if let Some(d) = m.datasets.first() {
            set_last(
                &mut meta,
                "quantize.imatrix.dataset",
                Value::String(truncate(d, 127)),
            );
        }
        set_last(
            &mut meta,
            "quantize.imatrix.entries_count",
            Value::U32(m.entries.len() as u32),
        );
        if m.chunk_count > 0 {
            set_last(
                &mut meta,
                "quantize.imatrix.chunks_count",
                Value::U32(m.chunk_count),
            );
        }
    }
    meta
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Quantize `input` into `output` as `request` says, calling `progress` after each tensor.
/// Every check that can fail before a byte is written runs first; a failure later removes the
/// partial output.
pub fn quantize_file(
    input: &GgufFile,
    output: &Path,
    request: &Request,
    progress: &mut dyn FnMut(&Written),
) -> Result<Summary, QuantizeError> {
    let (facts, tensors) = rules::describe(input)?;
    let mut options = request.options.clone();
    options.has_imatrix = request
        .imatrix
        .as_ref()
        .is_some_and(|(m, _)| !m.entries.is_empty());
    let plan = rules::plan(&facts, &tensors, request.mix, &options)?;

    // The importance of each converted tensor, checked before anything is written.
    let mut importance = Vec::with_capacity(plan.len());
    let mut summary = Summary::default();
    for c in &plan {
        let t = &tensors[c.index];
        let mut imp = None;
        if c.converts() {
            if t.shape.len() > 3 && t.shape[3..].iter().any(|&d| d > 1) {
                return Err(QuantizeError::TooManyDims {
                    tensor: t.name.clone(),
                    dims: t.shape.len(),
                });
            }
            if let Some((m, _)) = &request.imatrix {
                let experts = t.shape.get(2).copied().unwrap_or(1);
                match m.for_tensor(&t.name, t.shape[0], experts) {
                    Ok(found) => imp = found,
                    // llama-quantize lets the token embeddings' entries be the wrong size.
                    Err(_)
                        if matches!(
                            &t.name[..],
                            "token_embd.weight" | "per_layer_token_embd.weight"
                        ) => {}
                    Err(e) => return Err(QuantizeError::Imatrix(e)),
                }
                if imp.is_none() {
                    summary.without_importance += 1;
                }
            }
            if imp.is_none() && c.requires_imatrix {
                return Err(QuantizeError::NeedsImatrix {
                    tensor: t.name.clone(),
                    to: c.to,
                });
            }
        }
        importance.push(imp);
    }

    let meta = output_metadata(
        input.metadata(),
        request.mix.file_type(),
        request.imatrix.as_ref().map(|(m, p)| (*m, p.as_str())),
    );
    // Shapes as ggml counts dimensions (trailing 1s dropped), as llama-quantize writes them.
    let specs: Vec<TensorSpec> = plan
        .iter()
        .map(|c| {
            let t = &tensors[c.index];
            TensorSpec {
                name: t.name.clone(),
                ggml_type: c.to,
                shape: t.shape[..t.n_dims().min(t.shape.len())].to_vec(),
            }
        })
        .collect();
    let mut out = StreamWriter::create(output, &meta, &specs)?;
    let total = plan.len();
    for (k, (c, imp)) in plan.iter().zip(&importance).enumerate() {
        let t = &tensors[c.index];
        let data = input.tensor(&t.name)?.data;
        let bytes_out = if c.converts() {
            convert(t, c, data, *imp, request.threads, &mut out)?
        } else {
            out.write(data)?;
            data.len() as u64
        };
        summary.tensors += 1;
        summary.converted += c.converts() as usize;
        summary.fallbacks += c.fallback_from.is_some() as usize;
        summary.bytes_in += data.len() as u64;
        summary.bytes_out += bytes_out;
        progress(&Written {
            index: k + 1,
            total,
            name: &t.name,
            shape: &t.shape,
            choice: *c,
            bytes_in: data.len() as u64,
            bytes_out,
        });
    }
    out.finish()?;
    Ok(summary)
}

/// Decode and encode one tensor slab by slab, each slab's rows split over the threads, and
/// stream the bytes out; returns the bytes written.
fn convert(
    t: &rules::TensorDesc,
    c: &Choice,
    data: &[u8],
    importance: Option<&[f32]>,
    threads: usize,
    out: &mut StreamWriter,
) -> Result<u64, QuantizeError> {
    let err = |error| QuantizeError::Encode {
        tensor: t.name.clone(),
        from: c.from,
        to: c.to,
        error,
    };
    let n_per_row = t.shape[0] as usize;
    let rows: usize = t.shape[1..].iter().product::<u64>() as usize;
    if n_per_row == 0 || rows == 0 {
        return Ok(0);
    }
    let rows_per_expert = t.shape.get(1).copied().unwrap_or(1).max(1) as usize;
    let row_in = n_per_row / c.from.block_len() * c.from.block_bytes();
    let row_out = n_per_row / c.to.block_len() * c.to.block_bytes();
    let threads = threads.max(1);
    let slab_rows = (SLAB_VALUES * threads / n_per_row.max(1)).clamp(1, rows.max(1));
    let mut buf = vec![0u8; slab_rows * row_out];
    let mut written = 0u64;
    let mut first = 0;
    while first < rows {
        let n = slab_rows.min(rows - first);
        let slab = &mut buf[..n * row_out];
        let per_thread = n.div_ceil(threads);
        std::thread::scope(|s| {
            let jobs: Vec<_> = slab
                .chunks_mut(per_thread * row_out)
                .enumerate()
                .map(|(j, part)| {
                    let start = first + j * per_thread;
                    let count = part.len() / row_out;
                    let src = &data[start * row_in..(start + count) * row_in];
                    let shape = RowShape {
                        n_per_row,
                        row_in,
                        row_out,
                        rows_per_expert,
                    };
                    let job = move || encode_rows(c, &shape, src, start, importance, part);
                    s.spawn(job)
                })
                .collect();
            jobs.into_iter()
                .try_for_each(|j| j.join().expect("an encoding thread panicked"))
        })
        .map_err(err)?;
        out.write(slab)?;
        written += slab.len() as u64;
        first += n;
    }
    Ok(written)
}

/// A tensor's rows: values, bytes in and out, and rows per expert (all of them for a matrix).
struct RowShape {
    n_per_row: usize,
    row_in: usize,
    row_out: usize,
    rows_per_expert: usize,
}

/// Rows `first..` of a tensor (their source bytes `src`) into `out`, one run per expert so
/// that each run takes its expert's importance.
fn encode_rows(
    c: &Choice,
    shape: &RowShape,
    src: &[u8],
    first: usize,
    importance: Option<&[f32]>,
    out: &mut [u8],
) -> Result<(), synapse_quant::QuantError> {
    let RowShape {
        n_per_row,
        row_in,
        row_out,
        rows_per_expert,
    } = *shape;
    let rows = out.len() / row_out;
    let mut x = Vec::new();
    let mut r = 0;
    while r < rows {
        let expert = (first + r) / rows_per_expert;
        let end = rows.min((expert + 1) * rows_per_expert - first);
        x.resize((end - r) * n_per_row, 0.0);
        synapse_quant::dequantize_row(c.from, &src[r * row_in..end * row_in], &mut x)?;
        let imp = importance.map(|w| &w[expert * n_per_row..][..n_per_row]);
        let dst = &mut out[r * row_out..end * row_out];
        encode::quantize_rows(c.to, &x, n_per_row, imp, dst)?;
        encode::check_finite(c.to, dst)?;
        r = end;
    }
    Ok(())
}
