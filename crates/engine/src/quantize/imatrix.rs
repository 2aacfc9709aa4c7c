//! Importance matrices: for each matrix of a model, the mean square of the activations that
//! multiplied each of its columns over a calibration text. The quantizers weigh a column's
//! rounding error by it.
//!
//! Two file formats are read, both as llama.cpp's `llama-quantize` reads them: the GGUF one that
//! `llama-imatrix` writes now (per matrix `NAME.in_sum2`, the sums of squares, one row per
//! expert, and `NAME.counts`, the tokens each expert saw; the metadata `imatrix.datasets`,
//! `imatrix.chunk_count`, `imatrix.chunk_size`), and the older binary `.dat` (entries of a
//! name, a call count and the sums divided by that count, then the chunk count and dataset).

use std::collections::BTreeMap;
use std::path::Path;

use synapse_gguf::{GgmlType, GgufFile, Value};

/// Errors reading an importance matrix; each names the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ImatrixError {
    #[error("{path}: {message}")]
    Bad { path: String, message: String },
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
}

/// An importance matrix, normalised as llama-quantize uses it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Imatrix {
    /// Per matrix name: one importance per column, for each expert in turn (`n_expert·ne0`
    /// values for an expert tensor).
    pub entries: BTreeMap<String, Vec<f32>>,
    /// The texts it was computed on.
    pub datasets: Vec<String>,
    /// Chunks of text evaluated (0 where the file does not say).
    pub chunk_count: u32,
}

impl Imatrix {
    /// Read either format (GGUF when the file starts with its magic).
    pub fn load(path: &Path) -> Result<Imatrix, ImatrixError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| ImatrixError::Io {
            path: name.clone(),
            error,
        })?;
        Imatrix::from_bytes(bytes).map_err(|message| ImatrixError::Bad {
            path: name,
            message,
        })
    }

    /// [`Imatrix::load`] of a file's bytes; the error says what is wrong in them.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Imatrix, String> {
        let m = if bytes.starts_with(b"GGUF") {
            let file = GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?;
            from_gguf(&file)
        } else {
            from_legacy(&bytes)
        }?;
        if m.entries.is_empty() {
            return Err("no importance data in the file".into());
        }
        for (k, v) in &m.entries {
            if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                return Err(format!("entry `{k}` holds a non-finite value ({x})"));
            }
        }
        Ok(m)
    }

    /// The importance of `tensor`'s columns, checked against its row length and expert count:
    /// `None` if the file has no entry for it.
    pub fn for_tensor(
        &self,
        tensor: &str,
        ne0: u64,
        experts: u64,
    ) -> Result<Option<&[f32]>, String> {
        let Some(v) = self.entries.get(tensor) else {
            return Ok(None);
        };
        if v.len() as u64 != ne0 * experts {
            return Err(format!(
                "the importance matrix has {} values for `{tensor}`, which needs {} ({ne0} columns x {experts} experts): \
                 was it computed for another model?",
                v.len(),
                ne0 * experts
            ));
        }
        Ok(Some(v))
    }
}

fn from_gguf(file: &GgufFile) -> Result<Imatrix, String> {
    let meta = file.metadata();
    let mut m = Imatrix::default();
    let datasets = meta.get("imatrix.datasets");
    let chunks = meta.get("imatrix.chunk_count");
    if datasets.is_none() || chunks.is_none() || meta.get("imatrix.chunk_size").is_none() {
        return Err(
            "missing the imatrix metadata (imatrix.datasets, imatrix.chunk_count, \
                    imatrix.chunk_size): not an importance matrix"
                .into(),
        );
    }
    if let Some(Value::Array(synapse_gguf::Array::String(d))) = datasets {
        m.datasets = d.clone();
    }
    m.chunk_count = chunks
        .and_then(Value::as_u64)
        .and_then(|c| u32::try_from(c).ok())
        .ok_or("imatrix.chunk_count is not a 32-bit count")?;
    let mut sums = BTreeMap::new();
    let mut counts = BTreeMap::new();
    for t in file.tensors() {
        let name = &t.info.name;
        let (base, into) = if let Some(b) = name.strip_suffix(".in_sum2") {
            (b, &mut sums)
        } else if let Some(b) = name.strip_suffix(".counts") {
            (b, &mut counts)
        } else {
            continue;
        };
        if t.info.ggml_type != GgmlType::F32 {
            return Err(format!("`{name}` is {}, not F32", t.info.ggml_type));
        }
        let v: Vec<f32> = t
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        into.insert(base.to_string(), v);
    }
    for (name, s) in sums {
        let c = counts
            .remove(&name)
            .ok_or_else(|| format!("`{name}` has sums but no counts"))?;
        if c.is_empty() || s.len() % c.len() != 0 {
            return Err(format!(
                "`{name}`: {} sums do not split over {} experts' counts",
                s.len(),
                c.len()
            ));
        }
        let ne0 = s.len() / c.len();
        let mut e = vec![0.0f32; s.len()];
        for (j, &count) in c.iter().enumerate() {
            // llama-quantize rounds counts to integers, then divides in single precision;
            // an expert that saw no token gets importance 1 everywhere.
            let count = count.round() as i64 as f32;
            for i in 0..ne0 {
                e[j * ne0 + i] = if count > 0.0 {
                    s[j * ne0 + i] / count
                } else {
                    1.0
                };
            }
        }
        m.entries.insert(name, e);
    }
    if let Some(name) = counts.keys().next() {
        return Err(format!("`{name}` has counts but no sums"));
    }
    Ok(m)
}

/// A little-endian reader over the legacy file that errors on a short read.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err(format!("the file ends inside {what}"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
}

fn from_legacy(bytes: &[u8]) -> Result<Imatrix, String> {
    let mut r = Bytes(bytes);
    let n = r.i32("the entry count")?;
    if n < 1 {
        return Err(format!(
            "{n} entries: neither a GGUF nor a legacy importance matrix"
        ));
    }
    let mut m = Imatrix::default();
    for i in 0..n {
        let what = format!("entry {}", i + 1);
        let len = r.i32(&what)?;
        let len = usize::try_from(len).map_err(|_| format!("{what}: a name of {len} bytes"))?;
        let raw = r.take(len, &what)?;
        // The name ends at its first NUL, as a C string read does.
        let raw = raw.split(|&b| b == 0).next().unwrap_or_default();
        let name = String::from_utf8_lossy(raw).into_owned();
        let ncall = r.i32(&what)?;
        let nval = r.i32(&what)?;
        if nval < 1 {
            return Err(format!("{what} (`{name}`): {nval} values"));
        }
        let data = r.take(nval as usize * 4, &what)?;
        let e: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| {
                let s = f32::from_le_bytes(c.try_into().unwrap());
                if ncall > 0 {
                    s / ncall as f32
                } else {
                    s
                }
            })
            .collect();
        m.entries.insert(name, e);
    }
    // Optional trailer: the chunk count, then the dataset's name.
    if !r.0.is_empty() {
        if let Ok(chunks) = r.i32("the chunk count") {
            m.chunk_count = chunks.max(0) as u32;
            if let Ok(len) = r.i32("the dataset name") {
                if len > 0 {
                    if let Ok(d) = r.take(len as usize, "the dataset name") {
                        let d = d.split(|&b| b == 0).next().unwrap_or_default();
                        m.datasets.push(String::from_utf8_lossy(d).into_owned());
                    }
                }
            }
        }
    }
    Ok(m)
}

/// The file llama-imatrix writes for what a run collected: `general.type` "imatrix", the
/// datasets, the chunks (the most rows any run of sums took, in whole chunks) and the chunk
/// size; then, by name, each matrix's `NAME.in_sum2` (its sums, a row per expert) and
/// `NAME.counts` (rows added into each), in F32.
pub fn to_gguf(
    stats: &BTreeMap<String, super::collect::Stat>,
    datasets: &[String],
    chunk_size: usize,
) -> Result<synapse_gguf::GgufWriter<'static>, synapse_gguf::GgufError> {
    let mut w = synapse_gguf::GgufWriter::new();
    let chunks = stats
        .values()
        .flat_map(|s| s.counts.iter())
        .map(|&c| c / chunk_size.max(1) as i64)
        .max()
        .unwrap_or(0);
    w.set("general.type", Value::String("imatrix".into()));
    w.set(
        "imatrix.datasets",
        Value::Array(synapse_gguf::Array::String(datasets.to_vec())),
    );
    w.set("imatrix.chunk_count", Value::U32(chunks as u32));
    w.set("imatrix.chunk_size", Value::U32(chunk_size as u32));
    let f32s =
        |v: &mut dyn Iterator<Item = f32>| -> Vec<u8> { v.flat_map(f32::to_le_bytes).collect() };
    for (name, s) in stats {
        let runs = s.counts.len() as u64;
        if s.values.is_empty() || runs == 0 {
            continue;
        }
        // Shapes as ggml counts dimensions: a single run is one-dimensional.
        let cols = s.values.len() as u64 / runs;
        let (sums_shape, counts_shape) = if runs == 1 {
            (vec![cols], vec![1])
        } else {
            (vec![cols, runs], vec![1, runs])
        };
        w.add_tensor(
            format!("{name}.in_sum2"),
            GgmlType::F32,
            &sums_shape,
            f32s(&mut s.values.iter().copied()),
        )?;
        w.add_tensor(
            format!("{name}.counts"),
            GgmlType::F32,
            &counts_shape,
            f32s(&mut s.counts.iter().map(|&c| c as f32)),
        )?;
    }
    Ok(w)
}
