//! Chat templates: a hostile template (the GGUF's `tokenizer.chat_template` is file data) must
//! give a template error or a prompt, never a panic, a hang or an unbounded allocation
//! (libFuzzer's -timeout and -rss_limit_mb catch the last two).
//!
//! Input: lossy UTF-8, split at NUL. The first part is the template source; each further part
//! (at most 16) is a message, `role\x01content` or plain content (roles then alternate user,
//! assistant). Rendered with and without the generation prompt.

use synapse_engine::chat::{ChatTemplate, Message};

pub const MAX_MESSAGES: usize = 16;

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default();
    let messages: Vec<Message> = parts
        .take(MAX_MESSAGES)
        .enumerate()
        .map(|(i, p)| match p.split_once('\u{1}') {
            Some((role, content)) => Message::new(role, content),
            None => Message::new(["user", "assistant"][i % 2], p),
        })
        .collect();
    let Ok(t) = ChatTemplate::new(source, "<s>", "</s>") else {
        return;
    };
    for add_generation_prompt in [false, true] {
        let _ = t.render(&messages, add_generation_prompt);
    }
}
