//! The GGUF writer (version 3): metadata, tensor infos, aligned data. For tests and tools.

use std::borrow::Cow;
use std::io::{self, Write};
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::reader::{tensor_size, Metadata, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS};
use crate::types::GgmlType;
use crate::value::{Array, Value};

struct PendingTensor<'a> {
    name: String,
    ggml_type: GgmlType,
    shape: Vec<u64>,
    data: Cow<'a, [u8]>,
}

/// Collects metadata and tensors, then writes them as one GGUF v3 file.
///
/// ```
/// use synapse_gguf::{GgmlType, GgufWriter, Value, GgufFile};
/// let mut w = GgufWriter::new();
/// w.set("general.architecture", Value::String("llama".into()));
/// let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// w.add_tensor("t", GgmlType::F32, &[3], data).unwrap();
/// let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
/// assert_eq!(f.tensor("t").unwrap().data.len(), 12);
/// ```
pub struct GgufWriter<'a> {
    metadata: Metadata,
    tensors: Vec<PendingTensor<'a>>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> Self {
        GgufWriter {
            metadata: Metadata::default(),
            tensors: Vec::new(),
        }
    }

    /// Set a metadata value (replacing one of the same key).
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.insert(key, value);
        self
    }

    /// Copy every metadata value of another file (for tools that rewrite tensors).
    pub fn set_all(&mut self, metadata: &Metadata) -> &mut Self {
        for (k, v) in metadata.iter() {
            self.metadata.insert(k, v.clone());
        }
        self
    }

    /// Add a tensor; `data` must hold exactly the bytes its type and shape call for.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ggml_type: GgmlType,
        shape: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let data = data.into();
        if shape.len() > MAX_DIMS as usize {
            return Err(GgufError::Write(format!(
                "tensor `{name}`: {} dimensions, at most {MAX_DIMS}",
                shape.len()
            )));
        }
        let size = tensor_size(&name, ggml_type, shape)?;
        if size != data.len() as u64 {
            return Err(GgufError::Write(format!(
                "tensor `{name}` ({ggml_type}, shape {shape:?}) needs {size} bytes, got {}",
                data.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Write(format!("tensor `{name}` added twice")));
        }
        self.tensors.push(PendingTensor {
            name,
            ggml_type,
            shape: shape.to_vec(),
            data,
        });
        Ok(self)
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.get(ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(v) => {
                v.as_u64()
                    .filter(|a| a.is_power_of_two())
                    .ok_or_else(|| GgufError::BadAlignment {
                        value: v.to_string(),
                    })
            }
        }
    }

    /// Write the file to `out`.
    pub fn write(&self, out: &mut impl Write) -> Result<()> {
        let alignment = self.alignment()?;
        let io = |e: io::Error| GgufError::Write(e.to_string());
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_string(&mut h, k);
            h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut h, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut h, &t.name);
            h.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
        }
        pad(&mut h, alignment);
        out.write_all(&h).map_err(io)?;
        let zeros = vec![0u8; alignment as usize];
        for t in &self.tensors {
            out.write_all(&t.data).map_err(io)?;
            let fill = (t.data.len() as u64).next_multiple_of(alignment) - t.data.len() as u64;
            out.write_all(&zeros[..fill as usize]).map_err(io)?;
        }
        Ok(())
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write(&mut v)?;
        Ok(v)
    }

    /// Write to a file, through a temporary file beside it renamed into place only once the
    /// whole file is written and synced, so that a failed write never leaves a partial GGUF
    /// under the final name or destroys what was there. The target must be a regular file or
    /// absent: a device or a FIFO is refused (renaming over one would replace it).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        crate::files::expect_regular(path, true)?;
        // Removed on drop unless persisted: a failure anywhere below leaves nothing behind.
        let tmp = crate::files::temp_beside(path).map_err(io)?;
        let mut out = io::BufWriter::with_capacity(1 << 20, tmp);
        self.write(&mut out)?;
        let tmp = out.into_inner().map_err(|e| io(e.into_error()))?;
        crate::files::replace_with(tmp, path).map_err(io)
    }
}

fn pad(h: &mut Vec<u8>, alignment: u64) {
    let len = (h.len() as u64).next_multiple_of(alignment);
    h.resize(len as usize, 0);
}

fn put_string(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(*x as u8),
        Value::String(s) => put_string(h, s),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => put_array(h, a),
    }
}

fn put_array(h: &mut Vec<u8>, a: &Array) {
    h.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! prim {
        ($v:expr) => {
            for x in $v {
                h.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => h.extend_from_slice(v),
        Array::I8(v) => prim!(v),
        Array::U16(v) => prim!(v),
        Array::I16(v) => prim!(v),
        Array::U32(v) => prim!(v),
        Array::I32(v) => prim!(v),
        Array::F32(v) => prim!(v),
        Array::U64(v) => prim!(v),
        Array::I64(v) => prim!(v),
        Array::F64(v) => prim!(v),
        Array::Bool(v) => h.extend(v.iter().map(|&b| b as u8)),
        Array::String(v) => v.iter().for_each(|s| put_string(h, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(h, inner)),
    }
}
