//! What the model-running commands share: finding and loading the model, and every option
//! they take (threads, batch, context, sampling, token counts), checked here in one place.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use synapse_engine::sampler::SamplerConfig;
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::{Model, Threads};
use synapse_gguf::GgufFile;

/// The model `scripts/fetch-models.sh` brings, used when `-m` is not given.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file [default: models/SmolLM2-135M-Instruct.Q4_1.gguf].
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Threads for the matrix products, by default one per physical core (results do not
    /// depend on it).
    #[arg(short = 't', long = "threads", default_value_t = synapse_engine::pool::default_threads())]
    pub threads: usize,
    /// Tokens per batch when feeding a prompt (results do not depend on it).
    #[arg(short = 'b', long = "batch-size", default_value_t = 64)]
    pub batch: usize,
    /// Context size in tokens [default: the model's training context, at most 4096].
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Where the model runs.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Run the model on the CPU (the default) or the GPU (Vulkan, Metal or DX12 through wgpu;
    /// llama-family architectures for now).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// The same as --device gpu.
    #[arg(long, conflicts_with = "device")]
    pub gpu: bool,
    /// The GPU adapter to open, by a part of its name [default: a discrete GPU, else any].
    #[arg(long, value_name = "NAME")]
    pub gpu_adapter: Option<String>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

impl Default for DeviceArgs {
    fn default() -> DeviceArgs {
        DeviceArgs {
            device: Device::Cpu,
            gpu: false,
            gpu_adapter: None,
        }
    }
}

impl DeviceArgs {
    pub fn gpu(&self) -> bool {
        self.gpu || self.device == Device::Gpu
    }

    /// The model of `file` on the device asked for. On the GPU the engine's model is loaded
    /// for its description and dropped once the weights are uploaded.
    pub fn load<'f>(&self, file: &'f GgufFile) -> Result<Box<dyn Model + 'f>> {
        Ok(self.load_on(file)?.0)
    }

    /// [`DeviceArgs::load`], with what the GPU is where the model runs on one.
    pub fn load_on<'f>(
        &self,
        file: &'f GgufFile,
    ) -> Result<(Box<dyn Model + 'f>, Option<synapse_gpu::GpuInfo>)> {
        if !self.gpu() {
            return Ok((synapse_engine::load(file)?, None));
        }
        let gpu = synapse_gpu::Gpu::new(&synapse_gpu::GpuOptions {
            adapter: self.gpu_adapter.clone(),
        })?;
        eprintln!("synapse: GPU: {}", gpu.info());
        let info = gpu.info().clone();
        let described = synapse_engine::load(file)?;
        let model = synapse_gpu::GpuDecoder::load(Arc::new(gpu), file, described.as_ref())?;
        Ok((Box::new(model), Some(info)))
    }
}

impl ModelArgs {
    pub fn path(&self) -> Result<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => {
                let p = PathBuf::from(DEFAULT_MODEL);
                if !p.exists() {
                    bail!("no model given (-m) and the default {DEFAULT_MODEL} is missing: run scripts/fetch-models.sh");
                }
                Ok(p)
            }
        }
    }

    pub fn threads(&self) -> Result<Threads> {
        if self.threads == 0 || self.threads > 1024 {
            bail!(
                "-t {}: the thread count must be between 1 and 1024",
                self.threads
            );
        }
        Ok(Threads::new(self.threads))
    }

    pub fn batch(&self) -> Result<usize> {
        if self.batch == 0 || self.batch > 65536 {
            bail!(
                "-b {}: the batch size must be between 1 and 65536",
                self.batch
            );
        }
        Ok(self.batch)
    }

    /// The context size: as asked, else the model's training context capped at 4096.
    pub fn ctx(&self, n_ctx_train: usize) -> Result<usize> {
        self.ctx_or(n_ctx_train.clamp(1, 4096))
    }

    /// The context size: as asked (checked), else `default`.
    pub fn ctx_or(&self, default: usize) -> Result<usize> {
        match self.ctx {
            Some(0) => bail!("-c 0: the context must hold at least one token"),
            Some(c) if c > MAX_CTX => {
                bail!("-c {c}: the context can hold at most {MAX_CTX} tokens")
            }
            Some(c) => Ok(c),
            None => Ok(default),
        }
    }
}

/// The largest context `-c` takes: far beyond any model's training context, and small enough
/// that sizes computed from it cannot overflow (the memory itself is checked when allocated).
pub const MAX_CTX: usize = 1 << 24;

/// The prompt must fit the context, checked before any work, with both numbers in the error.
pub fn check_fits(n_prompt: usize, n_ctx: usize) -> Result<()> {
    if n_prompt > n_ctx {
        bail!(
            "the prompt is {n_prompt} tokens, more than the context of {n_ctx} \
             (use a larger context, -c, or a shorter prompt)"
        );
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 (or less) is greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep the K most likely tokens (0 or less: all).
    #[arg(long, default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i64,
    /// Nucleus sampling threshold (1: off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the most likely one's probability (0: off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty on recently seen tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty considers (0: off, -1: the whole context).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub repeat_last_n: i64,
    /// Subtracted from the logit of each token seen in the last-n window (0: off)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was seen in that window (0: off)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// RNG seed [default, or -1: random, printed to stderr].
    #[arg(short = 's', long, allow_negative_numbers = true)]
    pub seed: Option<i64>,
}

/// `-n`: a count of tokens, or -1 for no limit but the context.
pub fn n_predict(n: i64) -> Result<usize> {
    match n {
        -1 => Ok(usize::MAX),
        n if n >= 0 => Ok(n as usize),
        n => bail!("-n {n}: give a number of tokens, or -1 for until the end of the text"),
    }
}

impl SamplingArgs {
    /// The sampler's settings, every value checked: finite, in its documented range.
    pub fn config(&self, n_ctx: usize) -> Result<SamplerConfig> {
        if !self.temp.is_finite() {
            bail!(
                "--temp {}: the temperature must be a finite number",
                self.temp
            );
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            bail!("--top-p {}: must be between 0 and 1", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("--min-p {}: must be between 0 and 1", self.min_p);
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            bail!(
                "--repeat-penalty {}: must be a positive finite number (1: off)",
                self.repeat_penalty
            );
        }
        for (name, v) in [
            ("--presence-penalty", self.presence_penalty),
            ("--frequency-penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                bail!("{name} {v}: must be between -2 and 2 (0: off)");
            }
        }
        let repeat_last_n = match self.repeat_last_n {
            -1 => n_ctx,
            n if n >= 0 => (n as u64).min(n_ctx as u64) as usize,
            n => bail!(
                "--repeat-last-n {n}: give a number of tokens, 0 for off or -1 for the context"
            ),
        };
        let seed = match self.seed {
            Some(s) if s >= 0 => s as u64,
            Some(-1) | None => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let s = t.as_nanos() as u64 ^ (std::process::id() as u64) << 32;
                if self.temp > 0.0 {
                    eprintln!("seed: {s}");
                }
                s
            }
            Some(s) => bail!("--seed {s}: give a non-negative seed, or -1 for a random one"),
        };
        Ok(SamplerConfig {
            temp: self.temp,
            top_k: self.top_k.max(0).try_into().unwrap_or(usize::MAX),
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: Vec::new(),
            seed,
        })
    }
}

pub fn open(path: &Path) -> Result<GgufFile> {
    Ok(GgufFile::open(path)?)
}

/// [`open`] for running the model: every page mapped in up front ([`GgufFile::open_populated`]).
pub fn open_model(path: &Path) -> Result<GgufFile> {
    Ok(GgufFile::open_populated(path)?)
}

pub fn tokenizer(file: &GgufFile, path: &Path) -> Result<Tokenizer> {
    Tokenizer::from_metadata(file.metadata())
        .with_context(|| format!("{}: tokenizer", path.display()))
}

/// Prompt text from `-p` or `-f`.
pub fn prompt_text(prompt: &Option<String>, file: &Option<PathBuf>) -> Result<String> {
    match (prompt, file) {
        (Some(p), None) => Ok(p.clone()),
        (None, Some(f)) => read_text(f),
        (Some(_), Some(_)) => bail!("give the prompt as -p TEXT or -f FILE, not both"),
        (None, None) => bail!("no prompt: give -p TEXT or -f FILE"),
    }
}

/// `s` with control characters (escape sequences, carriage returns, ...) written as escapes,
/// for text from a file that is printed to a terminal. Newlines and tabs are kept.
pub fn printable(s: &str) -> Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if bad(c) {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// The most text `-f` and `--ids` read: far more than any context holds, and a bound on the
/// memory a file such as `/dev/zero` could take.
pub const MAX_TEXT_BYTES: u64 = 256 << 20;

/// A text file (a prompt, a list of ids), refused past [`MAX_TEXT_BYTES`] or if not UTF-8.
pub fn read_text(path: &Path) -> Result<String> {
    use std::io::Read;
    let at = || path.display().to_string();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .with_context(at)?
        .take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(at)?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        bail!("{}: longer than {} MiB", at(), MAX_TEXT_BYTES >> 20);
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (byte {} is not valid)",
            at(),
            e.utf8_error().valid_up_to()
        )
    })
}
