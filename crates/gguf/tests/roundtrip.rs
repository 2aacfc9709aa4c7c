//! Writer and reader agree: every value type, nested arrays, alignments, tensors of every type.

use proptest::prelude::*;
use synapse_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-100)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-30000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("f32", Value::F32(-1.5e-7)),
        ("bool", Value::Bool(true)),
        ("string", Value::String("héllo, 世界 🦀".into())),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(std::f64::consts::PI)),
        ("empty_array", Value::Array(Array::I32(vec![]))),
        (
            "floats",
            Value::Array(Array::F32(vec![0.5, -2.0, f32::INFINITY])),
        ),
        ("bools", Value::Array(Array::Bool(vec![true, false, true]))),
        (
            "strings",
            Value::Array(Array::String(vec!["".into(), "a b".into(), "\u{0}".into()])),
        ),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::U8(vec![1, 2, 3]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::F64(vec![1.0]), Array::Array(vec![])]),
            ])),
        ),
    ]
}

#[test]
fn every_value_type_round_trips() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.set(k, v);
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.version(), 3);
    let md = f.metadata();
    assert_eq!(md.len(), every_value().len());
    for (k, v) in every_value() {
        assert_eq!(md.get(k), Some(&v), "{k}");
    }
    // File order is kept.
    let keys: Vec<_> = md.iter().map(|(k, _)| k).collect();
    let want: Vec<_> = every_value().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, want);
}

#[test]
fn typed_getters_name_the_key() {
    let mut w = GgufWriter::new();
    w.set("n", Value::U32(5))
        .set("s", Value::String("x".into()));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let md = f.metadata();
    assert_eq!(md.u64("n").unwrap(), 5);
    assert_eq!(md.i64("n").unwrap(), 5);
    let e = md.str("n").unwrap_err().to_string();
    assert!(e.contains("`n`") && e.contains("u32"), "{e}");
    let e = md.u64("missing").unwrap_err().to_string();
    assert!(e.contains("`missing`"), "{e}");
}

#[test]
fn tensors_of_every_type_round_trip_at_several_alignments() {
    for alignment in [1u32, 8, 32, 64, 4096] {
        let mut w = GgufWriter::new();
        w.set("general.alignment", Value::U32(alignment));
        let mut want = Vec::new();
        for (i, &ty) in GgmlType::ALL.iter().enumerate() {
            let shape = [ty.block_len() as u64 * 2, 3];
            let size = ty.bytes_for(shape[0] * shape[1]).unwrap() as usize;
            let data: Vec<u8> = (0..size).map(|j| (i * 31 + j * 7) as u8).collect();
            let name = format!("t.{}", ty.name());
            w.add_tensor(name.clone(), ty, &shape, data.clone())
                .unwrap();
            want.push((name, ty, shape, data));
        }
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(f.header().alignment, alignment as u64);
        assert_eq!(f.header().data_start % alignment as u64, 0);
        for (name, ty, shape, data) in want {
            let t = f.tensor(&name).unwrap();
            assert_eq!(t.info.ggml_type, ty);
            assert_eq!(t.info.shape, shape);
            assert_eq!(t.info.offset % alignment as u64, 0);
            assert_eq!(t.data, &data[..], "{name} at alignment {alignment}");
        }
    }
}

#[test]
fn writer_refuses_wrong_sizes_and_duplicates() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("a", GgmlType::Q4_0, &[32], vec![0u8; 17])
        .is_err());
    assert!(w
        .add_tensor("a", GgmlType::Q4_0, &[31], vec![0u8; 18])
        .is_err());
    assert!(w
        .add_tensor("a", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0u8; 4])
        .is_err());
    w.add_tensor("a", GgmlType::Q4_0, &[32], vec![0u8; 18])
        .unwrap();
    assert!(w
        .add_tensor("a", GgmlType::Q4_0, &[32], vec![0u8; 18])
        .is_err());
}

#[test]
fn files_on_disk_are_mapped() {
    let dir = std::env::temp_dir().join(format!("synapse-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.gguf");
    let mut w = GgufWriter::new();
    w.add_tensor("x", GgmlType::F32, &[2], vec![1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    w.write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor("x").unwrap().data, &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(f.tensor("y").is_err());
    let e = GgufFile::open(dir.join("missing.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing.gguf"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn arb_array(depth: u32) -> BoxedStrategy<Array> {
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..5).prop_map(Array::U8),
        prop::collection::vec(any::<i64>(), 0..5).prop_map(Array::I64),
        prop::collection::vec(
            any::<f32>().prop_filter("NaN != NaN", |x| !x.is_nan()),
            0..5
        )
        .prop_map(Array::F32),
        prop::collection::vec(".{0,6}", 0..5).prop_map(Array::String),
        prop::collection::vec(any::<bool>(), 0..5).prop_map(Array::Bool),
    ];
    if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![
            3 => leaf,
            1 => prop::collection::vec(arb_array(depth - 1), 0..3).prop_map(Array::Array),
        ]
        .boxed()
    }
}

fn arb_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u16>().prop_map(Value::U16),
        any::<i32>().prop_map(Value::I32),
        any::<f64>()
            .prop_filter("NaN != NaN", |x| !x.is_nan())
            .prop_map(Value::F64),
        ".{0,20}".prop_map(Value::String),
        arb_array(3).prop_map(Value::Array),
    ]
}

proptest! {
    #[test]
    fn random_metadata_round_trips(kvs in prop::collection::btree_map("[a-z.]{1,12}", arb_value(), 0..8)) {
        let mut w = GgufWriter::new();
        for (k, v) in &kvs {
            w.set(k.clone(), v.clone());
        }
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        for (k, v) in &kvs {
            prop_assert_eq!(f.metadata().get(k), Some(v));
        }
    }
}

/// `release` lets a mapped tensor's pages go; reading them again gives the same bytes. Slices
/// from elsewhere, and files held in memory, are left alone.
#[test]
fn released_pages_read_back_the_same_bytes() {
    let data: Vec<u8> = (0..64 * 1024 + 100)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    let mut w = GgufWriter::new();
    w.add_tensor("t", GgmlType::I8, &[data.len() as u64], &data[..])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    w.write_file(&path).unwrap();
    for f in [
        GgufFile::open(&path).unwrap(),
        GgufFile::open_populated(&path).unwrap(),
    ] {
        let t = f.tensor("t").unwrap().data;
        assert_eq!(t, &data[..]);
        f.release(t);
        f.release(&t[1000..5000]);
        assert_eq!(t, &data[..], "read back after release");
        // Not the file's bytes: nothing happens.
        f.release(&data);
        f.release(&[]);
    }
    let bytes = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let t = bytes.tensor("t").unwrap().data;
    bytes.release(t);
    assert_eq!(t, &data[..]);
}
