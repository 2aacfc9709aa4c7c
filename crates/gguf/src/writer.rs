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

    /// Write the file to `out`.
    pub fn write(&self, out: &mut impl Write) -> Result<()> {
        let alignment = alignment_of(&self.metadata)?;
        let io = |e: io::Error| GgufError::Write(e.to_string());
        let specs = self
            .tensors
            .iter()
            .map(|t| (&t.name[..], t.ggml_type, &t.shape[..], t.data.len() as u64));
        out.write_all(&header(&self.metadata, specs, alignment))
            .map_err(io)?;
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

/// The alignment of the data section that `metadata` asks for.
fn alignment_of(metadata: &Metadata) -> Result<u64> {
    match metadata.get(ALIGNMENT_KEY) {
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

/// The header of a GGUF v3 file (magic, counts, metadata, tensor infos), padded to the data
/// section's alignment; each tensor's data starts at the next aligned offset after the last.
fn header<'t>(
    metadata: &Metadata,
    tensors: impl ExactSizeIterator<Item = (&'t str, GgmlType, &'t [u64], u64)>,
    alignment: u64,
) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(b"GGUF");
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata.iter() {
        put_string(&mut h, k);
        h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        put_value(&mut h, v);
    }
    let mut offset = 0u64;
    for (name, ty, shape, size) in tensors {
        put_string(&mut h, name);
        h.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape {
            h.extend_from_slice(&d.to_le_bytes());
        }
        h.extend_from_slice(&ty.id().to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + size).next_multiple_of(alignment);
    }
    pad(&mut h, alignment);
    h
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

/// A tensor [`StreamWriter`] will write: its bytes come later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml order, `shape[0]` the row length.
    pub shape: Vec<u64>,
}

/// A GGUF file written as it is produced, for outputs too large to hold: the header (every
/// tensor's name, type and shape) first, then each tensor's bytes in order, in pieces of any
/// size. It goes to a temporary file beside the target that [`StreamWriter::finish`] renames
/// into place once every byte is written; a failure, or a drop before `finish`, leaves nothing
/// under the target's name and the old file, if any, untouched.
pub struct StreamWriter {
    path: std::path::PathBuf,
    out: io::BufWriter<tempfile::NamedTempFile>,
    /// `(name, bytes)` of each tensor, and how far the writing is.
    sizes: Vec<(String, u64)>,
    current: usize,
    written: u64,
    alignment: u64,
}

impl StreamWriter {
    /// Start `path` with `metadata` and the tensors `specs`, in that order.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        specs: &[TensorSpec],
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let alignment = alignment_of(metadata)?;
        let mut sizes = Vec::with_capacity(specs.len());
        for t in specs {
            if t.shape.len() > MAX_DIMS as usize {
                return Err(GgufError::Write(format!(
                    "tensor `{}`: {} dimensions, at most {MAX_DIMS}",
                    t.name,
                    t.shape.len()
                )));
            }
            if sizes.iter().any(|(n, _)| *n == t.name) {
                return Err(GgufError::Write(format!("tensor `{}` added twice", t.name)));
            }
            sizes.push((t.name.clone(), tensor_size(&t.name, t.ggml_type, &t.shape)?));
        }
        let io_err = |error| GgufError::Io {
            path: path.clone(),
            error,
        };
        crate::files::expect_regular(&path, true)?;
        let tmp = crate::files::temp_beside(&path).map_err(io_err)?;
        let mut out = io::BufWriter::with_capacity(1 << 20, tmp);
        let specs = specs
            .iter()
            .zip(&sizes)
            .map(|(t, (_, size))| (&t.name[..], t.ggml_type, &t.shape[..], *size));
        out.write_all(&header(metadata, specs, alignment))
            .map_err(io_err)?;
        let mut w = StreamWriter {
            path,
            out,
            sizes,
            current: 0,
            written: 0,
            alignment,
        };
        w.skip_empty()?;
        Ok(w)
    }

    /// The name of the tensor whose bytes come next, `None` once all are written.
    pub fn next_tensor(&self) -> Option<&str> {
        self.sizes.get(self.current).map(|(n, _)| &n[..])
    }

    /// Append bytes of the current tensor; a piece may not run past its end. The padding after
    /// a tensor is written when its last byte is.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((name, size)) = self.sizes.get(self.current) else {
            return Err(GgufError::Write(format!(
                "{} bytes after the last tensor",
                bytes.len()
            )));
        };
        if self.written + bytes.len() as u64 > *size {
            return Err(GgufError::Write(format!(
                "tensor `{name}` holds {size} bytes; {} more after {}",
                bytes.len(),
                self.written
            )));
        }
        self.put(bytes)?;
        self.written += bytes.len() as u64;
        self.skip_empty()
    }

    /// After a complete tensor: its padding, and on to the next (past any of no bytes).
    fn skip_empty(&mut self) -> Result<()> {
        while let Some((_, size)) = self.sizes.get(self.current) {
            if self.written < *size {
                break;
            }
            let fill = size.next_multiple_of(self.alignment) - size;
            self.put(&vec![0u8; fill as usize])?;
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|error| GgufError::Io {
            path: self.path.clone(),
            error,
        })
    }

    /// Check every tensor is complete, sync, and rename the file into place.
    pub fn finish(self) -> Result<()> {
        if let Some((name, size)) = self.sizes.get(self.current) {
            return Err(GgufError::Write(format!(
                "tensor `{name}` incomplete: {} of {size} bytes written",
                self.written
            )));
        }
        let io_err = |error| GgufError::Io {
            path: self.path.clone(),
            error,
        };
        let tmp = self.out.into_inner().map_err(|e| io_err(e.into_error()))?;
        crate::files::replace_with(tmp, &self.path).map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect()
    }

    /// A streamed file is byte for byte the one [`GgufWriter`] writes, whatever the pieces;
    /// a tensor of no bytes is skipped over.
    #[test]
    fn streamed_file_equals_the_buffered_one() {
        let shapes: [(&str, GgmlType, Vec<u64>); 4] = [
            ("a", GgmlType::F32, vec![3, 5]),
            ("empty", GgmlType::F32, vec![0]),
            ("b", GgmlType::Q8_0, vec![64, 3]),
            ("c", GgmlType::F32, vec![7]),
        ];
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("x".into()));
        let mut datas = Vec::new();
        for (name, ty, shape) in &shapes {
            let size = tensor_size(name, *ty, shape).unwrap() as usize;
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + name.len()) as u8).collect();
            w.add_tensor(*name, *ty, shape, data.clone()).unwrap();
            datas.push(data);
        }
        let want = w.to_bytes().unwrap();
        let specs: Vec<TensorSpec> = shapes
            .iter()
            .map(|(n, t, s)| TensorSpec {
                name: n.to_string(),
                ggml_type: *t,
                shape: s.clone(),
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.gguf");
        let mut s = StreamWriter::create(&path, &w.metadata, &specs).unwrap();
        for data in &datas {
            for piece in data.chunks(11) {
                s.write(piece).unwrap();
            }
        }
        assert_eq!(s.next_tensor(), None);
        s.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    /// Too many bytes, too few, or a drop before `finish`: an error, and no file.
    #[test]
    fn incomplete_or_overrun_streams_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.gguf");
        let spec = [TensorSpec {
            name: "t".into(),
            ggml_type: GgmlType::F32,
            shape: vec![4],
        }];
        let meta = Metadata::default();
        let mut s = StreamWriter::create(&path, &meta, &spec).unwrap();
        s.write(&f32_bytes(3)).unwrap();
        assert!(s.write(&f32_bytes(2)).is_err(), "past the tensor's end");
        assert!(s.finish().is_err(), "one value short");
        let s = StreamWriter::create(&path, &meta, &spec).unwrap();
        drop(s);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

/// Writing in place of an existing path (`crate::files`' checks, through the writer).
#[cfg(all(test, unix))]
mod replace_tests {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    use crate::{GgufError, GgufWriter, Value};

    fn writer() -> GgufWriter<'static> {
        let mut w = GgufWriter::new();
        w.set("general.name", Value::String("x".into()));
        w
    }

    /// `write_file` refuses a FIFO (it used to rename a regular file over it), replaces a
    /// regular file keeping its permissions, and leaves no temporary file either way.
    #[test]
    fn write_file_replaces_only_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("out.fifo");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let e = writer().write_file(&fifo).unwrap_err();
        assert!(
            matches!(e, GgufError::NotAFile { what: "a FIFO", .. }),
            "{e}"
        );
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        let e = writer().write_file(dir.path()).unwrap_err();
        assert!(
            e.to_string().contains("a directory, not a regular file"),
            "{e}"
        );

        let out = dir.path().join("out.gguf");
        std::fs::write(&out, b"old").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        writer().write_file(&out).unwrap();
        let meta = std::fs::metadata(&out).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        assert_eq!(std::fs::read(&out).unwrap(), writer().to_bytes().unwrap());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
