//! The real models the fetch script brings: they open, every tensor decodes to finite floats, and
//! `synapse info` describes them. `scripts/test.sh` fetches them first; run alone, a missing
//! model fails the test with the command that fetches it.

use std::path::PathBuf;
use std::process::Command;

use synapse_gguf::{GgmlType, GgufFile};

fn model(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh (scripts/test.sh does)",
        path.display()
    );
    path
}

/// Opens the file, checks what it is made of, and decodes every tensor.
fn check(name: &str, arch: &str, n_tensors: usize, types: &[GgmlType]) {
    let path = model(name);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.metadata().str("general.architecture").unwrap(), arch);
    assert_eq!(f.tensor_infos().len(), n_tensors);
    let mut seen: Vec<GgmlType> = f.tensor_infos().iter().map(|t| t.ggml_type).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, types, "{name}");
    for t in f.tensors() {
        let x = synapse_quant::dequantize(t.info.ggml_type, t.data)
            .unwrap_or_else(|e| panic!("{name}: {}: {e}", t.info.name));
        assert_eq!(x.len() as u64, t.info.n_elements());
        assert!(
            x.iter().all(|v| v.is_finite() && v.abs() < 1e4),
            "{name}: {} has non-finite or absurd values",
            t.info.name
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_synapse"))
        .arg("info")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(&format!("architecture: {arch}")), "{text}");
}

#[test]
fn smollm2_135m_q4_1() {
    use GgmlType::*;
    check(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "llama",
        272,
        &[F32, Q4_1, Q8_0],
    );
}

#[test]
fn gemma3_270m_q4_k_m() {
    use GgmlType::*;
    check(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma3",
        236,
        &[F32, Q5_0, Q8_0, Q4_K, Q6_K],
    );
}
