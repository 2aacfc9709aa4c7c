//! What every architecture's loading and layers share: reading weight matrices and vectors
//! from the file, the products with the activations (`mm`), and the attention's shape.

use synapse_gguf::{GgmlType, GgufFile};

use crate::attention::AttnShape;
use crate::matmul::{matmul, Acts, Matrix, Threads};
use crate::ModelError;

/// `out = w · x` for the first `n` rows of `x` (`(n, w.cols)`), quantizing `x` first.
pub(crate) fn mm(
    name: &'static str,
    w: &Matrix,
    x: &[f32],
    n: usize,
    acts: &mut Acts,
    out: &mut [f32],
    threads: &Threads,
) {
    crate::quantize::sums::dense(w.name, x, n, w.cols);
    acts.quantize(w.act_type(), &x[..n * w.cols], w.cols, threads);
    crate::profile::mark("quantize activations");
    matmul(w, acts, &mut out[..n * w.rows], threads);
    let macs = (n * w.rows * w.cols) as u64;
    crate::profile::mark_product(name, w.bytes() as u64, macs);
}

/// [`mm`] for matrices that share their input (Q, K, V; gate, up): the input quantized once
/// and all the products in one hand-off to the threads when the matrices take the same
/// activation type, separate [`mm`]s otherwise. Same bits either way.
pub(crate) fn mm_many(
    name: &'static str,
    ws: &[&Matrix],
    x: &[f32],
    n: usize,
    acts: &mut Acts,
    outs: &mut [&mut [f32]],
    threads: &Threads,
) {
    let (ty, cols) = (ws[0].act_type(), ws[0].cols);
    if ws.iter().all(|w| w.act_type() == ty && w.cols == cols) {
        // A fused matrix's parts (Phi-3's attn_qkv) share its name: its input counts once.
        for (i, w) in ws.iter().enumerate() {
            if ws[..i].iter().all(|p| p.name != w.name) {
                crate::quantize::sums::dense(w.name, x, n, cols);
            }
        }
        acts.quantize(ty, &x[..n * cols], cols, threads);
        crate::profile::mark("quantize activations");
        crate::matmul::matmul_many(ws, acts, outs, threads);
        let bytes = ws.iter().map(|w| w.bytes() as u64).sum();
        let macs = ws.iter().map(|w| (n * w.rows * w.cols) as u64).sum();
        crate::profile::mark_product(name, bytes, macs);
    } else {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            mm(name, w, x, n, acts, out, threads);
        }
    }
}

/// A 1-D F32 (or F16/BF16) tensor of `n` values, decoded: norm weights, RoPE factors.
pub(crate) fn vector(file: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let t = file.tensor(name).map_err(|_| ModelError::MissingTensor {
        tensor: name.into(),
    })?;
    if t.info.n_elements() as usize != n
        || !matches!(
            t.info.ggml_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
        )
    {
        return Err(ModelError::Shape {
            tensor: name.into(),
            shape: t.info.shape.clone(),
            expected: format!("[{n}] of F32"),
        });
    }
    synapse_quant::dequantize(t.info.ggml_type, t.data).map_err(|e| ModelError::Tensor {
        tensor: name.into(),
        source: e,
    })
}

/// Attention shape of a layer.
pub(crate) fn attn_shape(n_head: usize, n_head_kv: usize, head_dim: usize) -> AttnShape {
    AttnShape {
        n_head,
        n_head_kv,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        softcap: None,
    }
}

/// `elem` bytes times each of `dims`, or `None` where that overflows.
pub(crate) fn bytes(elem: usize, dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(elem, |a, &d| a.checked_mul(d))
}

/// A weight matrix of the file, checked to have `cols` inputs (and `rows` outputs if given).
pub(crate) fn matrix<'a>(
    file: &'a GgufFile,
    name: &str,
    cols: usize,
    rows: Option<usize>,
) -> Result<Matrix<'a>, ModelError> {
    let t = file.tensor(name).map_err(|_| ModelError::MissingTensor {
        tensor: name.into(),
    })?;
    let m = Matrix::new(t, cols, rows)?;
    // The token embedding is read by row lookups, in the file's layout.
    if name == "token_embd.weight" {
        return Ok(m);
    }
    packed(file, m, name)
}

/// `m` packed (where the CPU has kernels for its format), with the file's pages of the packed
/// rows let go: the packed copy is the one the process keeps.
pub(crate) fn packed<'a>(
    file: &'a GgufFile,
    m: Matrix<'a>,
    name: &str,
) -> Result<Matrix<'a>, ModelError> {
    m.pack(name, &|bytes| file.release(bytes))
}

/// A fused projection split into its parts: tensor `name` (`cols` inputs) as matrices of
/// `parts` rows each, in order, each packed on its own.
pub(crate) fn fused<'a>(
    file: &'a GgufFile,
    name: &str,
    cols: usize,
    parts: &[usize],
) -> Result<Vec<Matrix<'a>>, ModelError> {
    let t = file.tensor(name).map_err(|_| ModelError::MissingTensor {
        tensor: name.into(),
    })?;
    let m = Matrix::new(t, cols, Some(parts.iter().sum()))?;
    let mut start = 0;
    let ranges: Vec<_> = parts
        .iter()
        .map(|&n| {
            start += n;
            start - n..start
        })
        .collect();
    m.split_rows(&ranges)
        .into_iter()
        .map(|m| packed(file, m, name))
        .collect()
}

/// [`vector`], or `None` when the file has no tensor of that name.
pub(crate) fn optional_vector(
    file: &GgufFile,
    name: &str,
    n: usize,
) -> Result<Option<Vec<f32>>, ModelError> {
    match file.tensor(name) {
        Ok(_) => vector(file, name, n).map(Some),
        Err(_) => Ok(None),
    }
}

/// The output matrix, or the token embedding when the file ties them (no `output.weight`).
pub(crate) fn output_matrix<'a>(
    file: &'a GgufFile,
    tok_embd: Matrix<'a>,
    n_embd: usize,
) -> Result<Matrix<'a>, ModelError> {
    match file.tensor("output.weight") {
        Ok(_) => matrix(file, "output.weight", n_embd, Some(tok_embd.rows)),
        // Tied: the output packs the embedding's rows, whose pages then come back from the
        // file only for the rows that tokens look up.
        Err(_) => packed(file, tok_embd, "token_embd.weight"),
    }
}

/// Ask for every tensor of the blocks `blocks` (`blk.{i}.*`) without reading it: blocks a model
/// passes over as llama.cpp does, which then count as read for the registry's check for tensors
/// a loader ignored.
pub(crate) fn pass_over_blocks(file: &GgufFile, blocks: std::ops::Range<usize>) {
    for info in file.tensor_infos() {
        let block = info.name.strip_prefix("blk.").and_then(|rest| {
            let (i, _) = rest.split_once('.')?;
            i.parse::<usize>().ok()
        });
        if block.is_some_and(|i| blocks.contains(&i)) {
            let _ = file.tensor(&info.name);
        }
    }
}

/// Add a bias to each of the `n` rows of `x` (ggml's `ggml_add` of a broadcast vector).
#[inline(always)]
pub(crate) fn add_bias_rows(x: &mut [f32], b: &[f32], n: usize) {
    for row in x[..n * b.len()].chunks_exact_mut(b.len()) {
        crate::ops::add_inplace(row, b);
    }
}
