//! Chat prompts: the GGUF's `tokenizer.chat_template` (Jinja) rendered with minijinja.
//!
//! Templates are written for Python's Jinja2 and call Python string methods (`.strip()`,
//! `.startswith()`); minijinja-contrib's pycompat layer provides those.

use minijinja::{context, Environment, Error, ErrorKind, Value};
use synapse_gguf::Metadata;

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
    #[error("chat template: {0:#}")]
    Template(#[from] Error),
}

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

    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string())?;
        Ok(ChatTemplate {
            env,
            bos: bos.into(),
            eos: eos.into(),
        })
    }

    /// The prompt text for a conversation; with `add_generation_prompt`, ending where the
    /// assistant's reply begins.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let t = self.env.get_template("chat")?;
        Ok(t.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })?)
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
}
