//! The GGUF reader: parse and validate the header, then hand out zero-copy views of tensor data.
//!
//! Layout of a GGUF file (versions 2 and 3, little-endian):
//!
//! ```text
//! "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv x      { key: string | value_type u32 | value }
//! n_tensors x { name: string | n_dims u32 | ne[n_dims] u64 | ggml_type u32 | offset u64 }
//! padding to `general.alignment` (default 32)
//! data section: each tensor at its offset (relative to the section), aligned
//! string = len u64 | len bytes of UTF-8;  array = elem_type u32 | count u64 | count values
//! ```
//!
//! Every read is bounds-checked against the bytes that remain, every count is bounded by those
//! bytes before anything is allocated, and every size is computed with checked arithmetic, so a
//! hostile file yields a [`GgufError`] rather than a panic, an overflow or a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{GgufError, Result};
use crate::types::GgmlType;
use crate::value::{Array, Value, ValueType};

pub const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal; this bounds the recursion a hostile file can ask for.
pub const MAX_ARRAY_DEPTH: u32 = 8;
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Metadata key/value pairs, in file order, with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Insert or replace a value, keeping the position of a replaced key.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// Remove a key, returning its value; the keys after it keep their order.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, value) = self.entries.remove(i);
        for j in self.index.values_mut() {
            if *j > i {
                *j -= 1;
            }
        }
        Some(value)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.into(),
            expected,
            found: v.value_type(),
        }
    }

    /// An integer of any width that is non-negative.
    pub fn u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong(key, "a non-negative integer", v))
    }

    /// An integer of any width.
    pub fn i64(&self, key: &str) -> Result<i64> {
        let v = self.require(key)?;
        v.as_i64().ok_or_else(|| Self::wrong(key, "an integer", v))
    }

    /// A float of either width, or an integer (some converters write integral floats as ints).
    pub fn f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64()
            .or_else(|| v.as_i64().map(|i| i as f64))
            .ok_or_else(|| Self::wrong(key, "a number", v))
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "a string", v))
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| Self::wrong(key, "a bool", v))
    }

    pub fn array(&self, key: &str) -> Result<&Array> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| Self::wrong(key, "an array", v))
    }
}

/// Where a tensor's data lies and how to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// ggml order: `shape[0]` is the row length (contiguous), then rows, then higher dims.
    pub shape: Vec<u64>,
    /// Offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data, computed from type and shape.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Values per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Rows: the product of every dimension but the first.
    pub fn n_rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }
}

/// Everything before the data section, validated against the length of the file.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// File offset of the data section.
    pub data_start: u64,
}

/// Bytes behind a [`GgufFile`]: a read-only memory map, or a buffer (tests, fuzzing).
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An open GGUF file: validated header plus the mapped bytes.
pub struct GgufFile {
    path: Option<PathBuf>,
    backing: Backing,
    header: Header,
    by_name: HashMap<String, usize>,
    /// Per tensor, whether [`GgufFile::tensor`] was asked for it: what a loader never asked
    /// for, it ignored ([`GgufFile::unasked_tensors`]).
    asked: Box<[AtomicBool]>,
}

/// A tensor's description together with its bytes in the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl GgufFile {
    /// Map and validate a GGUF file. The weights are not read: pages come in on first touch.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_with(path.as_ref(), false)
    }

    /// [`GgufFile::open`], with every page of the file mapped in before it returns
    /// (`MAP_POPULATE` where the system has it, as llama.cpp maps models): for inference, whose
    /// first forward pass would otherwise take a page fault per page of weights, several
    /// threads at once. Still no copy: the pages are the page cache's.
    pub fn open_populated(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_with(path.as_ref(), true)
    }

    fn open_with(path: &Path, populate: bool) -> Result<GgufFile> {
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        crate::files::expect_regular(path, false)?;
        let file = File::open(path).map_err(io)?;
        let mut options = memmap2::MmapOptions::new();
        if populate {
            options.populate();
        }
        // SAFETY: the map is read-only (shared with the page cache). The usual caveat of every
        // mmap-based reader applies: if another process truncates the file while it is mapped,
        // touching the lost pages raises SIGBUS. Nothing here writes through the map.
        let map = unsafe { options.map(&file) }.map_err(io)?;
        let mut f = Self::from_backing(Backing::Mmap(map)).map_err(|e| GgufError::InFile {
            path: path.to_path_buf(),
            error: Box::new(e),
        })?;
        f.path = Some(path.to_path_buf());
        Ok(f)
    }

    /// Let the process's mapping of the pages wholly inside `bytes` (a slice of this file's
    /// bytes, as [`GgufFile::tensor`] gives them) go, after their contents were copied
    /// elsewhere: the pages leave the resident set (the page cache keeps them), and a later
    /// read of them maps them in again from the file, with the same contents. Nothing happens
    /// for a file held in memory, a slice from elsewhere, or a system without `madvise`.
    pub fn release(&self, bytes: &[u8]) {
        let Backing::Mmap(map) = &self.backing else {
            return;
        };
        let (base, start) = (map.as_ptr() as usize, bytes.as_ptr() as usize);
        if bytes.is_empty() || start < base || start + bytes.len() > base + map.len() {
            return;
        }
        // x86-64's page. Where pages are larger, the advice covers the larger pages around
        // the range, whose other bytes then also come back from the file when read: the same
        // bytes, so nothing changes but residency.
        const PAGE: usize = 4096;
        let first = (start - base).next_multiple_of(PAGE);
        let end = (start - base + bytes.len()) / PAGE * PAGE;
        if first < end {
            // SAFETY: the map is read-only (nothing in it was ever written through it), so
            // dropping its pages loses nothing: the next read faults them in again from the
            // file, which holds the same bytes (the caveat of `open`: unless another process
            // changes the file). Slices into the map stay valid. A failure (an old kernel,
            // say) only leaves the pages resident.
            #[cfg(unix)]
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
            };
        }
    }

    /// Validate a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<GgufFile> {
        let header = parse_header(backing.bytes())?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let asked = header
            .tensors
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect();
        Ok(GgufFile {
            path: None,
            backing,
            header,
            by_name,
            asked,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn version(&self) -> u32 {
        self.header.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// The named tensor, or an error naming it. The tensor counts as asked for from then on.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let &i = self
            .by_name
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor {
                tensor: name.into(),
            })?;
        self.asked[i].store(true, Ordering::Relaxed);
        Ok(self.view(&self.header.tensors[i]))
    }

    /// The names of the tensors [`GgufFile::tensor`] was never asked for, in file order: after
    /// a model's loader, the tensors it ignores.
    pub fn unasked_tensors(&self) -> Vec<&str> {
        let tensors = self.header.tensors.iter().zip(self.asked.iter());
        tensors
            .filter(|(_, asked)| !asked.load(Ordering::Relaxed))
            .map(|(t, _)| t.name.as_str())
            .collect()
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.header.tensors.iter().map(|t| self.view(t))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // parse_header checked that [data_start + offset, + size) lies inside the file, so the
        // conversions and the slice cannot fail; `get` keeps that a non-panicking invariant.
        let start = (self.header.data_start + info.offset) as usize;
        let data = self
            .backing
            .bytes()
            .get(start..start + info.size as usize)
            .unwrap_or(&[]);
        TensorView { info, data }
    }
}

/// A bounds-checked reader over the header bytes. Offsets in errors are file offsets.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of items each at least `min_len` bytes long, checked against the bytes left.
    fn count(&mut self, min_len: u64, what: &dyn Fn() -> String) -> Result<u64> {
        let offset = self.pos as u64;
        let count = self.u64(what)?;
        if count.saturating_mul(min_len) > self.remaining() {
            return Err(GgufError::CountTooLarge {
                what: what(),
                offset,
                count,
                remaining: self.remaining(),
            });
        }
        Ok(count)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let offset = self.pos as u64;
        let len = self.count(1, what)?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::BadUtf8 {
                what: what(),
                offset,
            }),
        }
    }

    fn value_type(&mut self, what: &dyn Fn() -> String) -> Result<ValueType> {
        let offset = self.pos as u64;
        let id = self.u32(what)?;
        ValueType::from_id(id).ok_or_else(|| GgufError::BadValueType {
            what: what(),
            offset,
            type_id: id,
        })
    }

    fn value(&mut self, ty: ValueType, depth: u32, what: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let offset = self.pos as u64;
                match self.array::<1>(what)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(GgufError::BadValueType {
                            what: format!("{} (bool byte {b})", what()),
                            offset,
                            type_id: ValueType::Bool as u32,
                        })
                    }
                }
            }
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(depth + 1, what)?),
        })
    }

    fn array_value(&mut self, depth: u32, what: &dyn Fn() -> String) -> Result<Array> {
        let offset = self.pos as u64;
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestedTooDeep {
                what: what(),
                offset,
                max: MAX_ARRAY_DEPTH,
            });
        }
        let elem = self.value_type(what)?;
        let n = self.count(elem.min_encoded_len(), what)? as usize;
        // `count` bounded n by the bytes left, so these allocations are at most a small multiple
        // of the file's size.
        macro_rules! prim {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take((n * size_of::<$t>()) as u64, what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => prim!(U8, u8),
            ValueType::I8 => prim!(I8, i8),
            ValueType::U16 => prim!(U16, u16),
            ValueType::I16 => prim!(I16, i16),
            ValueType::U32 => prim!(U32, u32),
            ValueType::I32 => prim!(I32, i32),
            ValueType::F32 => prim!(F32, f32),
            ValueType::U64 => prim!(U64, u64),
            ValueType::I64 => prim!(I64, i64),
            ValueType::F64 => prim!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(matches!(self.value(elem, depth, what)?, Value::Bool(true)));
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(&|| format!("{} element {i}", what()))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.array_value(depth + 1, &|| format!("{} element {i}", what()))?);
                }
                Array::Array(v)
            }
        })
    }
}

/// Parse and validate everything before the data section of a GGUF image, and check every
/// tensor's data range against the image's length.
pub fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };

    let magic = c
        .take(4, &|| "magic".into())
        .map_err(|_| GgufError::BadMagic {
            found: buf[..buf.len().min(4)].to_vec(),
        })?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = c.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(GgufError::BigEndian { raw: v });
        }
        v => return Err(GgufError::UnsupportedVersion { version: v }),
    }

    // Smallest possible tensor info: empty name (8) + n_dims (4) + type (4) + offset (8).
    const MIN_TENSOR_INFO: u64 = 8 + 4 + 4 + 8;
    // Smallest possible key/value: empty key (8) + type (4) + one byte of value.
    const MIN_KV: u64 = 8 + 4 + 1;
    let n_tensors = c.count(MIN_TENSOR_INFO, &|| "tensor count".into())?;
    let n_kv = c.count(MIN_KV, &|| "metadata count".into())?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key_offset = c.pos as u64;
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata `{key}`");
        let ty = c.value_type(&what)?;
        let value = c.value(ty, 0, &what)?;
        if metadata.get(&key).is_some() {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        metadata.insert(key, value);
    }

    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 30 => a,
            _ => {
                return Err(GgufError::BadAlignment {
                    value: v.to_string(),
                })
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut seen = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let info_offset = c.pos as u64;
        let name = c.string(&|| format!("tensor #{i} name"))?;
        let what = || format!("tensor `{name}`");
        let dims_offset = c.pos as u64;
        let n_dims = c.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                offset: dims_offset,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(c.u64(&what)?);
        }
        let type_offset = c.pos as u64;
        let type_id = c.u32(&what)?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownType {
            tensor: name.clone(),
            offset: type_offset,
            type_id,
        })?;
        let offset = c.u64(&what)?;
        let size = tensor_size(&name, ggml_type, &shape)?;
        if offset % alignment != 0 {
            return Err(GgufError::Misaligned {
                tensor: name,
                offset,
                alignment,
            });
        }
        if seen.insert(name.clone(), ()).is_some() {
            return Err(GgufError::DuplicateTensor {
                tensor: name,
                offset: info_offset,
            });
        }
        tensors.push(TensorInfo {
            name,
            ggml_type,
            shape,
            offset,
            size,
        });
    }

    // The data section starts at the next multiple of the alignment. A file without tensors may
    // end before it.
    let data_start = (c.pos as u64).next_multiple_of(alignment);
    let file_len = buf.len() as u64;
    let data_len = file_len.saturating_sub(data_start);
    for t in &tensors {
        let end = t.offset.checked_add(t.size);
        if end.is_none_or(|end| end > data_len) {
            return Err(GgufError::OutOfBounds {
                tensor: t.name.clone(),
                start: t.offset,
                end: end.unwrap_or(u64::MAX),
                len: data_len,
                data_start,
            });
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        if pair[0].offset + pair[0].size > pair[1].offset {
            return Err(GgufError::Overlap {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
                offset: pair[1].offset,
            });
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

/// Bytes of a tensor of this type and shape, or an error saying why the shape is impossible.
pub fn tensor_size(name: &str, ggml_type: GgmlType, shape: &[u64]) -> Result<u64> {
    let bad = |reason: String| GgufError::BadShape {
        tensor: name.into(),
        ggml_type,
        shape: shape.to_vec(),
        reason,
    };
    // ggml keeps sizes in int64_t.
    let n = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| bad("element count overflows".into()))?;
    let row = shape.first().copied().unwrap_or(1);
    let block = ggml_type.block_len() as u64;
    if row % block != 0 {
        return Err(bad(format!(
            "row length {row} is not a multiple of the block length {block}"
        )));
    }
    ggml_type
        .bytes_for(n)
        .filter(|&b| b <= i64::MAX as u64)
        .ok_or_else(|| bad("byte size overflows".into()))
}
