//! `synapse chat`: an interactive conversation through the model's chat template.
//!
//! Each turn renders the whole conversation, keeps the cached prefix it shares with what the
//! cache holds, and feeds only the rest. When the conversation outgrows the context, the oldest
//! turns are dropped (the system prompt is kept), and the user is told.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use clap::Args;
use synapse_engine::chat::{ChatTemplate, Message};
use synapse_engine::generate::{Request, StopReason};

use super::common::{self, n_predict, ModelArgs, SamplingArgs};
use super::speculate::SpecArgs;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply; -1: until the end of the reply or a full context.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let path = args.model.path()?;
    let threads = args.model.threads()?;
    let batch = args.model.batch()?;
    let n_predict = n_predict(args.n_predict)?;
    let file = common::open_model(&path)?;
    let model = args.model.device.load(&file)?;
    let tok = common::tokenizer(&file, &path)?;
    let template = ChatTemplate::for_model(file.metadata(), &tok)
        .with_context(|| path.display().to_string())?;
    let n_ctx = args.model.ctx(model.info().n_ctx_train)?;
    let sampling = args.sampling.config(n_ctx)?;
    let threads = &threads;
    let tok = &tok;
    args.spec
        .generator(model.as_ref(), tok, n_ctx, batch, |gen| {
            let system: Vec<Message> = args
                .system
                .iter()
                .map(|s| Message::new("system", s))
                .collect();
            let mut messages = system.clone();

            let mut stdin = std::io::stdin().lock();
            let mut stdout = std::io::stdout();
            for turn in 0u64.. {
                write!(stdout, "> ")?;
                stdout.flush()?;
                let mut bytes = Vec::new();
                if stdin.read_until(b'\n', &mut bytes)? == 0 {
                    writeln!(stdout)?;
                    return Ok(());
                }
                let Ok(line) = String::from_utf8(bytes) else {
                    eprintln!("[that line is not UTF-8 text: ignored]");
                    continue;
                };
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    continue;
                }
                messages.push(Message::new("user", line));
                // The conversation as the model sees it, with room to answer: the oldest turns go
                // first when it does not fit; a message that alone does not fit is refused.
                let tokens = loop {
                    let prompt = template.render(&messages, true)?;
                    // Templates write the BOS themselves; special tokens in them must be parsed.
                    let tokens = tok.encode(&prompt, false, true);
                    if tokens.len() < n_ctx {
                        break Some(tokens);
                    }
                    let first = system.len();
                    if messages.len() - first <= 1 {
                        eprintln!(
                    "[this message makes a prompt of {} tokens, and the context holds {n_ctx} \
                     (-c): not sent]",
                    tokens.len()
                );
                        messages.pop();
                        break None;
                    }
                    // Drop the oldest exchange (a user turn and the reply to it).
                    let n = if messages.len() - first >= 3 { 2 } else { 1 };
                    messages.drain(first..first + n);
                    eprintln!(
                        "[the context ({n_ctx} tokens, -c) is full: the oldest turn is dropped]"
                    );
                };
                let Some(tokens) = tokens else { continue };
                // Each turn draws from its own stream: the seed, moved on by the turn's number.
                let mut sampling = sampling.clone();
                sampling.seed = sampling.seed.wrapping_add(turn);
                let req = Request {
                    prompt: &tokens,
                    max_tokens: n_predict,
                    stop: &[],
                    sampling,
                };
                let mut g = gen.start(&req, threads)?;
                while let Some(text) = g.next_piece()? {
                    write!(stdout, "{text}")?;
                    stdout.flush()?;
                }
                let outcome = g.finish();
                writeln!(stdout)?;
                if outcome.stop == StopReason::ContextFull {
                    eprintln!(
                "[the context ({n_ctx} tokens, -c) is full: the reply was cut off; the next \
                 turn drops the oldest turns to make room]"
            );
                }
                messages.push(Message::new("assistant", &tok.decode(&outcome.tokens)));
            }
            Ok(())
        })
}
