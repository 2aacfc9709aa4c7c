//! The architectures synapse loads, by `general.architecture`.

use synapse_gguf::GgufFile;

use super::{
    gemma3, gptoss, granite, llama, mistral3, olmo2, phi3, qwen2, qwen3, qwen35, qwen3moe, smollm3,
    Model,
};
use crate::ModelError;

/// Loads one architecture from a file, borrowing its weights.
type Loader = for<'a> fn(&'a GgufFile) -> Result<Box<dyn Model + 'a>, ModelError>;

/// The architectures synapse runs, and how to load each: a new architecture is a file in this
/// directory and a line here.
const REGISTRY: &[(&str, Loader)] = &[
    ("llama", |f| Ok(Box::new(llama::load(f)?))),
    ("gemma2", |f| {
        Ok(Box::new(gemma3::Gemma3::load(f, "gemma2")?))
    }),
    ("gemma3", |f| {
        Ok(Box::new(gemma3::Gemma3::load(f, "gemma3")?))
    }),
    ("gpt-oss", |f| Ok(Box::new(gptoss::load(f)?))),
    ("granite", |f| Ok(Box::new(granite::load(f)?))),
    ("mistral3", |f| Ok(Box::new(mistral3::load(f)?))),
    ("olmo2", |f| Ok(Box::new(olmo2::Olmo2::load(f)?))),
    ("phi3", |f| Ok(Box::new(phi3::load(f)?))),
    ("qwen2", |f| Ok(Box::new(qwen2::load(f)?))),
    ("qwen3", |f| Ok(Box::new(qwen3::load(f)?))),
    ("qwen3moe", |f| Ok(Box::new(qwen3moe::load(f)?))),
    ("qwen35", |f| {
        Ok(Box::new(qwen35::Qwen35::load(f, "qwen35")?))
    }),
    ("qwen35moe", |f| {
        Ok(Box::new(qwen35::Qwen35::load(f, "qwen35moe")?))
    }),
    ("smollm3", |f| Ok(Box::new(smollm3::load(f)?))),
];

/// Names of the supported architectures.
pub fn supported_architectures() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// Load the model a GGUF file holds, reading its weights in place. A tensor its loader did not
/// read is an error: llama.cpp refuses a file with a tensor it does not create, and uses every
/// one it creates (a bias, say), so a tensor passed over would give other logits than its.
pub fn load(file: &GgufFile) -> Result<Box<dyn Model + '_>, ModelError> {
    let arch = file.metadata().str("general.architecture")?;
    let (_, load) = REGISTRY
        .iter()
        .find(|(name, _)| *name == arch)
        .ok_or_else(|| ModelError::UnsupportedArchitecture {
            arch: arch.to_string(),
            supported: supported_architectures().join(", "),
        })?;
    let model = load(file)?;
    let unread = file.unasked_tensors();
    if let Some(first) = unread.first() {
        return Err(ModelError::UnreadTensor {
            tensor: first.to_string(),
            arch: arch.to_string(),
            more: match unread.len() - 1 {
                0 => String::new(),
                n => format!(" (and {n} more)"),
            },
        });
    }
    Ok(model)
}
