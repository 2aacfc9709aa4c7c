//! Chat prompts: the GGUF's `tokenizer.chat_template` (Jinja) rendered with minijinja.
//!
//! Templates are written for Python's Jinja2 as Hugging Face's `apply_chat_template` runs
//! them, and llama.cpp runs them the same way. So the render gives them what those give:
//! Python's string methods (`.strip()`, `.startswith()`, from minijinja-contrib's pycompat
//! layer), `strftime_now(format)` (today's date, local time, as llama.cpp's), `tools` and
//! `documents` set to none (and none not `iterable`, as in Python), and the `{% generation %}`
//! block (which marks the assistant's text for training) as a plain block.

use minijinja::{context, Environment, Error, ErrorKind, Value};
use synapse_gguf::Metadata;

use crate::tokenizer::Tokenizer;

pub const TEMPLATE_KEY: &str = "tokenizer.chat_template";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the model has no chat template (`{TEMPLATE_KEY}`)")]
    NoTemplate,
    #[error("the chat template (`{TEMPLATE_KEY}`): {0:#}")]
    Template(#[from] Error),
    #[error(
        "the chat template (`{TEMPLATE_KEY}`) ran past its budget of {FUEL_BASE} steps \
         and {FUEL_PER_MESSAGE} a message"
    )]
    OutOfFuel,
    #[error("the chat template (`{TEMPLATE_KEY}`) wrote more than {limit} bytes")]
    TooLong { limit: usize },
    #[error("the chat template (`{TEMPLATE_KEY}`) rendered nothing for {n} messages")]
    Empty { n: usize },
}

/// A render's instruction budget (minijinja's fuel): what a template may spend, plus as much
/// again per message. Real templates take a few hundred steps a message; a loop of loops
/// meant to hang stops here in well under a second.
pub const FUEL_BASE: u64 = 2_000_000;
pub const FUEL_PER_MESSAGE: u64 = 20_000;

/// The most a render may write: this, plus eight times the messages' own text.
pub const OUTPUT_BASE: usize = 1 << 20;

pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// The model's template; `bos` and `eos` are the text of its BOS and EOS tokens, which
    /// templates insert themselves.
    pub fn from_metadata(md: &Metadata, bos: &str, eos: &str) -> Result<ChatTemplate, ChatError> {
        let source = md.str(TEMPLATE_KEY).map_err(|_| ChatError::NoTemplate)?;
        Self::new(source, bos, eos)
    }

    /// The template of a model whose metadata is `md`, with its tokenizer's BOS and EOS text.
    pub fn for_model(md: &Metadata, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let text = |id: Option<u32>| id.map(|i| tok.piece_text(i)).unwrap_or_default();
        Self::from_metadata(md, &text(tok.bos()), &text(tok.eos()))
    }

    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        // Python's sense: none is not iterable (minijinja's test says it is), so that
        // `tools is iterable and tools | length > 0` holds no surprise for `tools` none.
        env.add_test("iterable", |v: Value| {
            !(v.is_none() || v.is_undefined()) && v.try_iter().is_ok()
        });
        env.add_template_owned("chat", plain_generation_blocks(source))?;
        Ok(ChatTemplate {
            env,
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// The prompt text for a conversation; with `add_generation_prompt`, ending where the
    /// assistant's reply begins. The template runs within a budget of steps and of output
    /// (both grow with the conversation), and must write something.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let n = messages.len() as u64;
        let mut env = self.env.clone();
        env.set_fuel(Some(
            FUEL_BASE.saturating_add(FUEL_PER_MESSAGE.saturating_mul(n)),
        ));
        let text: usize = messages
            .iter()
            .map(|m| m.role.len() + m.content.len())
            .sum();
        let mut out = Capped {
            buf: Vec::new(),
            limit: OUTPUT_BASE.saturating_add(text.saturating_mul(8)),
        };
        let t = env.get_template("chat")?;
        let rendered = t.render_captured_to(
            context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
                tools => (),
                documents => (),
            },
            &mut out,
        );
        match rendered {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::OutOfFuel => return Err(ChatError::OutOfFuel),
            Err(_) if out.buf.len() > out.limit => {
                return Err(ChatError::TooLong { limit: out.limit })
            }
            Err(e) => return Err(e.into()),
        }
        // The template wrote `str`s, so the bytes are UTF-8.
        let text = String::from_utf8(out.buf)
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "output is not UTF-8"))?;
        if text.is_empty() {
            return Err(ChatError::Empty { n: messages.len() });
        }
        Ok(text)
    }
}

/// Now, local time, in a C `strftime` format (`%Y-%m-%d`, `%d %b %Y`): what llama.cpp's
/// templates are given as `strftime_now`. A format chrono cannot read is an error.
fn strftime_now(format: String) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    use std::fmt::Write;
    let bad = || {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: `{format}` is not a strftime format"),
        )
    };
    if StrftimeItems::new(&format).any(|i| i == Item::Error) {
        return Err(bad());
    }
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| bad())?;
    Ok(out)
}

/// `source` with each `{% generation %}` .. `{% endgeneration %}` (Hugging Face's mark of the
/// assistant's text, for training masks) as `{% if true %}` .. `{% endif %}`: the same text, the
/// same whitespace control.
fn plain_generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(close) = tag[2..].find("%}").map(|c| c + 2) else {
            // A tag cut short: left as it is (the template's parser names the error).
            rest = tag;
            break;
        };
        let end = close + 2;
        match tag[2..close].trim_matches(['-', '+']).trim() {
            "generation" => out.push_str(&tag[..end].replacen("generation", "if true", 1)),
            "endgeneration" => out.push_str(&tag[..end].replacen("endgeneration", "endif", 1)),
            _ => out.push_str(&tag[..end]),
        }
        rest = &tag[end..];
    }
    out.push_str(rest);
    out
}

/// A render's output, refused past `limit` bytes.
struct Capped {
    buf: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.limit {
            // Marks the overflow for `render`, which names it.
            self.buf.resize(self.limit + 1, 0);
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_chatml_template() {
        let src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let t = ChatTemplate::new(src, "", "<|im_end|>").unwrap();
        let out = t.render(&[Message::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception_work() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role not in ['user', 'model'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{{ m.content.strip() | upper }}{% endfor %}";
        let t = ChatTemplate::new(src, "<bos>", "").unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  hi ")], false).unwrap(),
            "<bos>HI"
        );
        let e = t
            .render(&[Message::new("tool", "x")], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad role tool"), "{e}");
    }

    /// Templates from a hostile file stop within their budgets with an error that names the
    /// template (each of these hung, grew without bound, or rendered nothing before).
    #[test]
    fn generation_blocks_render_their_text_with_their_whitespace_control() {
        let src =
            "A\n{%- generation -%}\n B {{ x }}\n{%- endgeneration %}\nC{% if true %}.{% endif %}";
        assert_eq!(
            plain_generation_blocks(src),
            "A\n{%- if true -%}\n B {{ x }}\n{%- endif %}\nC{% if true %}.{% endif %}"
        );
        // A tag cut short is left as it is (the template's parser names the error).
        for cut in ["x {% generation", "{% 日", "{%", "{%}", "{%}}"] {
            assert_eq!(plain_generation_blocks(cut), cut);
        }
        let t = ChatTemplate::new(
            "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration -%}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let out = t.render(&[Message::new("user", "hi")], false).unwrap();
        assert_eq!(out, "[hi]");
    }

    #[test]
    fn strftime_now_is_todays_date_and_bad_formats_are_errors() {
        let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", "", "").unwrap();
        let out = t.render(&[Message::new("user", "hi")], false).unwrap();
        assert_eq!(out, chrono::Local::now().format("%Y-%m-%d").to_string());
        let t = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "").unwrap();
        let e = t.render(&[Message::new("user", "hi")], false).unwrap_err();
        assert!(e.to_string().contains("%Q"), "{e}");
    }

    #[test]
    fn hostile_templates_stop_with_a_named_error() {
        let msgs: Vec<Message> = (0..3).map(|_| Message::new("user", "hi")).collect();
        for (src, says) in [
            (
                "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                "budget",
            ),
            (
                "{% for m in messages * 100000000 %}{{ m.content }}{% endfor %}",
                "budget",
            ),
            (
                "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}",
                "wrote more than",
            ),
            ("{# nothing #}", "rendered nothing"),
            ("{{ raise_exception('no') }}", "no"),
        ] {
            let t = ChatTemplate::new(src, "", "").unwrap();
            let start = std::time::Instant::now();
            let e = t.render(&msgs, true).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(TEMPLATE_KEY), "{src}: {e}");
            // A bound on the budget's size, not a timing claim: unbudgeted, these run for hours.
            assert!(start.elapsed().as_secs() < 60, "{src}");
        }
    }
}
