//! A corpus of malformed GGUF images: each must give the error that names what is wrong, and
//! none may panic. Files the fuzzer found are kept in `tests/corpus/` and replayed here too.
//!
//! `SYNAPSE_DUMP_CORPUS=DIR cargo test -p synapse-gguf --test malformed` also writes the cases
//! out, to seed the fuzzer (`fuzz/corpus/parse_gguf`).

use synapse_gguf::{parse_header, GgmlType, GgufError, GgufFile, GgufWriter, Value, ValueType};

/// Little-endian byte builder for hand-made headers.
#[derive(Clone, Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default()
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn u8(self, v: u8) -> Raw {
        self.bytes(&[v])
    }
    fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A key with a u32 value.
    fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(ValueType::U32 as u32).u32(v)
    }
    /// A tensor info.
    fn tensor(self, name: &str, shape: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(shape.len() as u32);
        for &d in shape {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Pad to 32 and append `n` bytes of tensor data.
    fn data(mut self, n: usize) -> Raw {
        let len = self.0.len().next_multiple_of(32);
        self.0.resize(len + n, 0);
        self
    }
}

type Check = fn(&GgufError) -> bool;

fn cases() -> Vec<(&'static str, Vec<u8>, Check)> {
    let f32_id = GgmlType::F32.id();
    let q4_0 = GgmlType::Q4_0.id();
    let one_tensor = |name: &str, shape: &[u64], ty: u32, offset: u64, data: usize| {
        Raw::header(3, 1, 0)
            .tensor(name, shape, ty, offset)
            .data(data)
            .0
    };
    let mut nested = Raw::header(3, 0, 1)
        .str("deep")
        .u32(ValueType::Array as u32);
    for _ in 0..20 {
        nested = nested.u32(ValueType::Array as u32).u64(1);
    }
    vec![
        ("empty", vec![], |e| matches!(e, GgufError::BadMagic { .. })),
        ("bad_magic", b"GGML\x03\0\0\0".to_vec(), |e| {
            matches!(e, GgufError::BadMagic { .. })
        }),
        ("magic_only", b"GGUF".to_vec(), |e| {
            matches!(e, GgufError::Truncated { offset: 4, .. })
        }),
        ("version_1", Raw::header(1, 0, 0).0, |e| {
            matches!(e, GgufError::UnsupportedVersion { version: 1 })
        }),
        ("big_endian", Raw::header(3u32.swap_bytes(), 0, 0).0, |e| {
            matches!(e, GgufError::BigEndian { .. })
        }),
        ("absurd_tensor_count", Raw::header(3, u64::MAX, 0).0, |e| {
            matches!(
                e,
                GgufError::CountTooLarge {
                    count: u64::MAX,
                    ..
                }
            )
        }),
        ("absurd_kv_count", Raw::header(3, 0, 1 << 60).0, |e| {
            matches!(e, GgufError::CountTooLarge { .. })
        }),
        (
            "absurd_key_length",
            Raw::header(3, 0, 1).u64(u64::MAX - 3).bytes(&[0; 16]).0,
            |e| matches!(e, GgufError::CountTooLarge { offset: 24, .. }),
        ),
        (
            "bad_utf8_key",
            Raw::header(3, 0, 1)
                .u64(2)
                .bytes(&[0xC3, 0x28])
                .u32(4)
                .u32(0)
                .0,
            |e| matches!(e, GgufError::BadUtf8 { offset: 24, .. }),
        ),
        (
            "bad_value_type",
            Raw::header(3, 0, 1).str("k").u32(13).u32(0).0,
            |e| matches!(e, GgufError::BadValueType { type_id: 13, .. }),
        ),
        (
            "bad_bool",
            Raw::header(3, 0, 1)
                .str("k")
                .u32(ValueType::Bool as u32)
                .u8(2)
                .0,
            |e| matches!(e, GgufError::BadValueType { .. }),
        ),
        (
            "bad_utf8_value",
            Raw::header(3, 0, 1).str("k").u32(8).u64(1).u8(0xFF).0,
            |e| matches!(e, GgufError::BadUtf8 { .. }),
        ),
        (
            "absurd_array_count",
            Raw::header(3, 0, 1).str("k").u32(9).u32(10).u64(1 << 61).0,
            |e| matches!(e, GgufError::CountTooLarge { .. }),
        ),
        (
            "bad_array_elem_type",
            Raw::header(3, 0, 1).str("k").u32(9).u32(99).u64(0).0,
            |e| matches!(e, GgufError::BadValueType { type_id: 99, .. }),
        ),
        ("array_too_deep", nested.0, |e| {
            matches!(e, GgufError::NestedTooDeep { .. })
        }),
        (
            "duplicate_key",
            Raw::header(3, 0, 2).kv_u32("a", 1).kv_u32("a", 2).0,
            |e| matches!(e, GgufError::DuplicateKey { .. }),
        ),
        (
            "alignment_zero",
            Raw::header(3, 0, 1).kv_u32("general.alignment", 0).0,
            |e| matches!(e, GgufError::BadAlignment { .. }),
        ),
        (
            "alignment_three",
            Raw::header(3, 0, 1).kv_u32("general.alignment", 3).0,
            |e| matches!(e, GgufError::BadAlignment { .. }),
        ),
        (
            "alignment_string",
            Raw::header(3, 0, 1)
                .str("general.alignment")
                .u32(8)
                .str("32")
                .0,
            |e| matches!(e, GgufError::BadAlignment { .. }),
        ),
        (
            "too_many_dims",
            one_tensor("t", &[1, 1, 1, 1, 1], f32_id, 0, 4),
            |e| matches!(e, GgufError::TooManyDims { n_dims: 5, .. }),
        ),
        ("removed_type", one_tensor("t", &[32], 4, 0, 32), |e| {
            matches!(e, GgufError::UnknownType { type_id: 4, .. })
        }),
        ("unknown_type", one_tensor("t", &[32], 999, 0, 32), |e| {
            matches!(e, GgufError::UnknownType { type_id: 999, .. })
        }),
        (
            "element_overflow",
            one_tensor("t", &[u64::MAX, 2], f32_id, 0, 0),
            |e| matches!(e, GgufError::BadShape { .. }),
        ),
        (
            "bytes_overflow",
            one_tensor("t", &[1 << 62], f32_id, 0, 0),
            |e| matches!(e, GgufError::BadShape { .. }),
        ),
        (
            "not_block_multiple",
            one_tensor("t", &[33], q4_0, 0, 64),
            |e| matches!(e, GgufError::BadShape { .. }),
        ),
        (
            "misaligned_offset",
            one_tensor("t", &[4], f32_id, 1, 64),
            |e| matches!(e, GgufError::Misaligned { offset: 1, .. }),
        ),
        (
            "offset_overflows",
            one_tensor("t", &[8], f32_id, u64::MAX - 31, 64),
            |e| matches!(e, GgufError::OutOfBounds { .. }),
        ),
        (
            "data_past_end",
            one_tensor("t", &[64], f32_id, 0, 255),
            |e| {
                matches!(
                    e,
                    GgufError::OutOfBounds {
                        end: 256,
                        len: 255,
                        ..
                    }
                )
            },
        ),
        (
            "overlap",
            Raw::header(3, 2, 0)
                .tensor("a", &[16], f32_id, 0)
                .tensor("b", &[16], f32_id, 32)
                .data(128)
                .0,
            |e| matches!(e, GgufError::Overlap { .. }),
        ),
        (
            "duplicate_tensor",
            Raw::header(3, 2, 0)
                .tensor("a", &[8], f32_id, 0)
                .tensor("a", &[8], f32_id, 32)
                .data(64)
                .0,
            |e| matches!(e, GgufError::DuplicateTensor { .. }),
        ),
        (
            "tensor_name_utf8",
            Raw::header(3, 1, 0).u64(1).u8(0x80).bytes(&[0; 32]).0,
            |e| matches!(e, GgufError::BadUtf8 { .. }),
        ),
    ]
}

#[test]
fn each_malformed_file_gives_its_error() {
    let dump = std::env::var_os("SYNAPSE_DUMP_CORPUS");
    for (name, bytes, check) in cases() {
        if let Some(dir) = &dump {
            std::fs::write(std::path::Path::new(dir).join(name), &bytes).unwrap();
        }
        match parse_header(&bytes) {
            Ok(_) => panic!("{name}: parsed without error"),
            Err(e) => assert!(check(&e), "{name}: unexpected error: {e}"),
        }
    }
}

/// A valid file with metadata of every type and three tensors, to cut and corrupt.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("n", Value::U32(7))
        .set(
            "scores",
            Value::Array(synapse_gguf::Array::F32(vec![1.0, 2.0])),
        )
        .set(
            "tokens",
            Value::Array(synapse_gguf::Array::String(vec!["a".into(), "bc".into()])),
        );
    w.add_tensor("a", GgmlType::F32, &[8], vec![0u8; 32])
        .unwrap();
    w.add_tensor("b", GgmlType::Q4_0, &[32, 2], vec![0u8; 36])
        .unwrap();
    w.add_tensor("c", GgmlType::Q4_K, &[256], vec![0u8; 144])
        .unwrap();
    w.to_bytes().unwrap()
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let bytes = valid_file();
    let h = parse_header(&bytes).unwrap();
    // The padding after the last tensor may go; nothing before its end may.
    let end = h
        .tensors
        .iter()
        .map(|t| h.data_start + t.offset + t.size)
        .max()
        .unwrap();
    assert!(parse_header(&bytes[..end as usize]).is_ok());
    for len in 0..end as usize {
        let r = parse_header(&bytes[..len]);
        assert!(
            r.is_err(),
            "truncated to {len} of {} bytes: parsed",
            bytes.len()
        );
    }
}

#[test]
fn every_single_byte_corruption_is_handled() {
    // Not every corrupted byte makes the file invalid (a value byte is just another value), but
    // none may panic, and a file that still parses must still have every tensor inside it.
    let bytes = valid_file();
    for i in 0..bytes.len() {
        for v in [0x00, 0xFF, 0x7F, 0x80, bytes[i] ^ 1] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Ok(f) = GgufFile::from_bytes(b.clone()) {
                for t in f.tensors() {
                    assert_eq!(t.data.len() as u64, t.info.size);
                }
            }
        }
    }
}

/// Replays what the fuzzer learned: its minimized corpus (`fuzz/corpus/parse_gguf`, inputs that
/// reach distinct code paths) and the inputs that ever crashed it (`tests/corpus`).
#[test]
fn fuzzer_corpus_and_findings_replay_cleanly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in [
        root.join("tests/corpus"),
        root.join("../../fuzz/corpus/parse_gguf"),
    ] {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            // The property the fuzzer checks: no panic, and a parsed file's tensors lie inside it.
            if let Ok(f) = GgufFile::from_bytes(bytes) {
                for t in f.tensors() {
                    assert_eq!(t.data.len() as u64, t.info.size, "{}", path.display());
                }
            }
            n += 1;
        }
    }
    assert!(n > 100, "only {n} corpus files");
}
