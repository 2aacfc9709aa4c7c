//! `synapse chat`: an interactive conversation through the model's chat template.
//!
//! Each turn renders the whole conversation, keeps the cached prefix it shares with what the
//! cache holds, and feeds only the rest.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use clap::Args;
use synapse_engine::chat::{ChatTemplate, Message};
use synapse_engine::sampler::Sampler;
use synapse_engine::tokenizer::StreamDecoder;
use synapse_engine::Logits;

use super::common::{self, ModelArgs};
use super::run::SamplingArgs;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let batch = args.model.batch()?;
    let file = common::open_model(&path)?;
    let model = synapse_engine::load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tok.token_to_piece(i)).into_owned())
            .unwrap_or_default()
    };
    let template =
        ChatTemplate::from_metadata(file.metadata(), &piece(tok.bos()), &piece(tok.eos()))
            .with_context(|| path.display().to_string())?;
    let n_ctx = args.model.ctx(model.info().n_ctx_train)?;
    let mut state = model.new_state(n_ctx, batch)?;
    let mut sampler = Sampler::new(args.sampling.config()?, model.info().n_vocab);
    let mut messages: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s))
        .collect();
    let mut cached: Vec<u32> = Vec::new();

    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    loop {
        write!(stdout, "> ")?;
        stdout.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(stdout)?;
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            continue;
        }
        messages.push(Message::new("user", line));
        let prompt = template.render(&messages, true)?;
        // Templates write the BOS themselves; special tokens in them must be parsed.
        let tokens = tok.encode(&prompt, false, true);
        let keep = cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        state.pos = keep;
        cached.truncate(keep);
        let mut logits =
            model.prefill(&mut state, &tokens[keep..], batch, Logits::Last, &threads)?;
        cached.extend_from_slice(&tokens[keep..]);

        let mut stream = StreamDecoder::new(&tok);
        let mut reply_ids = Vec::new();
        for _ in 0..args.n_predict {
            let next = sampler.sample(&logits);
            sampler.accept(next);
            if tok.is_eog(next) || state.pos >= state.n_ctx() {
                break;
            }
            write!(stdout, "{}", stream.push(next))?;
            stdout.flush()?;
            reply_ids.push(next);
            model.forward(&mut state, &[next], Logits::Last, &mut logits, &threads)?;
            cached.push(next);
        }
        writeln!(stdout, "{}", stream.finish())?;
        messages.push(Message::new("assistant", &tok.decode(&reply_ids)));
    }
}
