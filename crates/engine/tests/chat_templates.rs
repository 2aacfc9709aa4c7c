//! The chat templates of real models, from llama.cpp's collection (`models/templates/*.jinja`
//! in the llama-cpp-python sdist, fetched by `scripts/fetch-models.sh vocabs`): every one
//! renders a conversation, with the text of each user turn in it, as Hugging Face's
//! `apply_chat_template` and llama.cpp render them (`strftime_now`, `tools` none, the
//! `{% generation %}` block). gpt-oss's harmony format is checked to the byte.

use std::path::PathBuf;

use synapse_engine::chat::{ChatTemplate, Message};

/// Templates that cannot render a plain conversation, and why: each must still fail, with this
/// reason, so that a change in them is noticed.
const NEED_MORE: &[(&str, &str)] = &[
    // A function-calling template that adds its own `functions` and `datetime` inputs.
    (
        "fireworks-ai-llama-3-firefunction-v2.jinja",
        "string and undefined",
    ),
];

/// Templates that refuse a system turn (their own `raise_exception`): rendered without one.
const NO_SYSTEM: &[&str] = &["google-gemma-2-2b-it.jinja"];

fn templates() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/templates");
    assert!(
        dir.join("openai-gpt-oss-120b.jinja").exists(),
        "{} is missing: run scripts/fetch-models.sh vocabs",
        dir.display()
    );
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    paths.sort();
    paths
}

fn conversation(system: bool) -> Vec<Message> {
    let mut m = vec![
        Message::new("user", "Hello there"),
        Message::new("assistant", "Hi!"),
        Message::new("user", "Name a prime."),
    ];
    if system {
        m.insert(0, Message::new("system", "You are terse."));
    }
    m
}

#[test]
fn every_template_in_llama_cpps_collection_renders() {
    let paths = templates();
    assert!(paths.len() >= 60, "only {} templates", paths.len());
    let mut rendered = 0;
    for p in &paths {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let source = std::fs::read_to_string(p).unwrap();
        let t = ChatTemplate::new(&source, "<s>", "</s>")
            .unwrap_or_else(|e| panic!("{name} does not parse: {e}"));
        let out = t.render(&conversation(!NO_SYSTEM.contains(&name.as_str())), true);
        if let Some((_, why)) = NEED_MORE.iter().find(|(n, _)| *n == name) {
            let e = out.expect_err(&name).to_string();
            assert!(e.contains(why), "{name}: {e}");
            continue;
        }
        let out = out.unwrap_or_else(|e| panic!("{name}: {e}"));
        for text in ["Hello there", "Name a prime."] {
            assert!(out.contains(text), "{name} lost {text:?}:\n{out}");
        }
        rendered += 1;
    }
    assert_eq!(rendered, paths.len() - NEED_MORE.len());
}

/// gpt-oss's harmony format: the system turn it writes itself (today's date, reasoning effort),
/// the system message as developer instructions, the assistant's reply on the final channel.
#[test]
fn gpt_oss_renders_harmony() {
    let path = templates()
        .into_iter()
        .find(|p| p.ends_with("openai-gpt-oss-120b.jinja"))
        .unwrap();
    let t = ChatTemplate::new(&std::fs::read_to_string(path).unwrap(), "", "").unwrap();
    let out = t.render(&conversation(true), true).unwrap();
    let today = chrono::Local::now().format("%Y-%m-%d");
    let want = format!(
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
         Knowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: medium\n\n\
         # Valid channels: analysis, commentary, final. Channel must be included for every \
         message.<|end|><|start|>developer<|message|># Instructions\n\nYou are terse.\n\n\
         <|end|><|start|>user<|message|>Hello there<|end|><|start|>assistant<|channel|>final\
         <|message|>Hi!<|end|><|start|>user<|message|>Name a prime.<|end|><|start|>assistant"
    );
    assert_eq!(out, want);
}
