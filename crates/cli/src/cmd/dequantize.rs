//! `synapse dequantize IN OUT`: every tensor decoded to F32, metadata kept. For debugging and
//! for checking synapse's codecs against other implementations from the outside.

use std::path::Path;

use anyhow::{Context, Result};
use synapse_gguf::{GgmlType, GgufWriter, Value};

/// `general.file_type` for a file whose tensors are all F32 (`LLAMA_FTYPE_ALL_F32`).
const FILE_TYPE_ALL_F32: u32 = 0;

pub fn run(input: &Path, output: &Path) -> Result<()> {
    let file = super::common::open(input)?;
    let mut w = GgufWriter::new();
    w.set_all(file.metadata());
    if file.metadata().get("general.file_type").is_some() {
        w.set("general.file_type", Value::U32(FILE_TYPE_ALL_F32));
    }
    for t in file.tensors() {
        let floats = synapse_quant::dequantize(t.info.ggml_type, t.data).with_context(|| {
            format!(
                "tensor `{}` ({}, shape {:?})",
                t.info.name, t.info.ggml_type, t.info.shape
            )
        })?;
        let bytes: Vec<u8> = floats.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.add_tensor(t.info.name.clone(), GgmlType::F32, &t.info.shape, bytes)?;
    }
    let mut out = super::output::OutputFile::create(output)?;
    w.write(&mut out)
        .with_context(|| output.display().to_string())?;
    out.commit()?;
    eprintln!(
        "wrote {} ({} tensors as F32)",
        output.display(),
        file.tensor_infos().len()
    );
    Ok(())
}
