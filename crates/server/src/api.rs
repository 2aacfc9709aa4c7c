//! The OpenAI-shaped request bodies, checked into what the scheduler runs, and the errors.
//!
//! Unknown fields are ignored (clients send many); a field of the wrong type, or a value out
//! of its range, is a 400 that names it.

use std::collections::HashMap;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use synapse_engine::sampler::SamplerConfig;

/// An error in OpenAI's shape: `{"error": {"message", "type", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub code: &'static str,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            code: "invalid_request",
            retry_after: None,
        }
    }

    pub fn with(status: StatusCode, kind: &'static str, code: &'static str, m: String) -> Self {
        ApiError {
            status,
            message: m,
            kind,
            code,
            retry_after: None,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        r
    }
}

/// A body as JSON, or a 400 that says where it is not.
pub fn json(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

/// The fields of type `T` in a body's JSON, or a 400 that names the field whose value has the
/// wrong type (unknown fields are ignored).
pub fn fields<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        if at == "." {
            ApiError::bad(format!("the request body: {inner}"))
        } else {
            ApiError::bad(format!("`{at}`: {inner}"))
        }
    })
}

/// [`json()`], then [`fields`].
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    fields(&json(body)?)
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields chat and completions share, read from the same body as theirs.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub logit_bias: Option<HashMap<String, f32>>,
    #[serde(default)]
    pub ignore_eos: bool,
}

/// A chat message's content: text, or a list of parts of which the text ones are read.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
}

/// A completion's prompt: text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`: one, or a list (each its own choices, `n` of them, one prompt after another).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompts {
    One(Prompt),
    Many(Vec<Prompt>),
}

impl Prompts {
    pub fn into_vec(self) -> Vec<Prompt> {
        match self {
            Prompts::One(p) => vec![p],
            Prompts::Many(v) => v,
        }
    }
}

/// Prompts a completion request may hold.
pub const MAX_PROMPTS: usize = 16;

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompts,
    /// The number of most likely alternatives to return with each token's logprob (0-5 in
    /// OpenAI's API; up to 20 here).
    pub logprobs: Option<u32>,
}

/// Choices a request may ask for, and alternatives per logprob.
pub const MAX_N: u32 = 16;
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// What the checked common fields ask of each choice.
#[derive(Debug)]
pub struct Asked {
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// The first choice's sampling (choice `i` draws with seed `seed + i`).
    pub sampling: SamplerConfig,
    pub n: u32,
    pub stream: bool,
    pub include_usage: bool,
}

impl Common {
    /// Check every value; `eog`: the model's end-of-generation tokens (banned by
    /// `ignore_eos`), `n_vocab` for `logit_bias`'s keys. A request without a seed gets a fresh
    /// random one (returned in the response, so that it can be asked for again).
    pub fn check(&self, n_vocab: usize, eog: &[u32]) -> Result<Asked, ApiError> {
        let d = SamplerConfig::default();
        let range = |name: &str, v: Option<f32>, lo: f32, hi: f32, def: f32| match v {
            None => Ok(def),
            Some(v) if v.is_finite() && (lo..=hi).contains(&v) => Ok(v),
            Some(v) => Err(ApiError::bad(format!(
                "`{name}` is {v}: it must be between {lo} and {hi}"
            ))),
        };
        let temp = range("temperature", self.temperature, 0.0, 100.0, d.temp)?;
        let top_p = range("top_p", self.top_p, 0.0, 1.0, d.top_p)?;
        let min_p = range("min_p", self.min_p, 0.0, 1.0, d.min_p)?;
        let presence = range("presence_penalty", self.presence_penalty, -2.0, 2.0, 0.0)?;
        let frequency = range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, 0.0)?;
        let repeat = range("repeat_penalty", self.repeat_penalty, 0.0, 100.0, 1.0)?;
        if repeat == 0.0 {
            return Err(ApiError::bad("`repeat_penalty` must be positive (1: off)"));
        }
        let top_k = match self.top_k {
            None => d.top_k,
            Some(k) if k <= 0 => 0,
            Some(k) => k as usize,
        };
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::bad(format!(
                "`n` is {n}: between 1 and {MAX_N} choices"
            )));
        }
        let mut logit_bias = Vec::new();
        for (k, &b) in self.logit_bias.iter().flatten() {
            let id: u32 = k
                .parse()
                .ok()
                .filter(|&id: &u32| (id as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "`logit_bias` key {k:?}: not a token id below {n_vocab}"
                    ))
                })?;
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::bad(format!(
                    "`logit_bias` of {id} is {b}: it must be between -100 and 100"
                )));
            }
            // -100 bans the token, as OpenAI documents.
            logit_bias.push((id, if b <= -100.0 { f32::NEG_INFINITY } else { b }));
        }
        if self.ignore_eos {
            logit_bias.extend(eog.iter().map(|&t| (t, f32::NEG_INFINITY)));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
        if stop.len() > 16 {
            return Err(ApiError::bad("`stop`: at most 16 strings"));
        }
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .map_or(usize::MAX, |m| m.min(usize::MAX as u64) as usize);
        Ok(Asked {
            max_tokens,
            stop,
            sampling: SamplerConfig {
                temp,
                top_k,
                top_p,
                min_p,
                repeat_penalty: repeat,
                repeat_last_n: self.repeat_last_n.map_or(d.repeat_last_n, |n| n as usize),
                presence_penalty: presence,
                frequency_penalty: frequency,
                logit_bias,
                // Below 2^53: a fresh seed reads back exactly in JavaScript's numbers.
                seed: self.seed.unwrap_or_else(|| rand::random::<u64>() >> 11),
            },
            n,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
        })
    }
}

impl ChatMessage {
    /// The message's text (the text parts of a list, one after another).
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::bad(format!(
                                "a message part of type {kind:?}: only text is supported"
                            )))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_and_unknown_ones_ignored() {
        let body = br#"{"messages":[{"role":"user","content":"hi"}],"temperature":0,
                "seed":7,"stop":"x","n":2,"whatever":{"a":1},"logit_bias":{"5":-100}}"#;
        let _: ChatRequest = parse(body).unwrap();
        let a = parse::<Common>(body).unwrap().check(10, &[9]).unwrap();
        assert_eq!(a.sampling.temp, 0.0);
        assert_eq!(a.sampling.seed, 7);
        assert_eq!(a.stop, ["x"]);
        assert_eq!(a.n, 2);
        assert_eq!(a.sampling.logit_bias, [(5, f32::NEG_INFINITY)]);
        assert_eq!(a.max_tokens, usize::MAX);

        let e = parse::<ChatRequest>(br#"{"messages":"hi"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("`messages`"), "{}", e.message);
        let e = parse::<Common>(br#"{"messages":[], "temperature":"hot"}"#).unwrap_err();
        assert!(e.message.contains("`temperature`"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"messages":[{"role":"user","content":5}]}"#).unwrap_err();
        assert!(e.message.contains("`messages[0].content`"), "{}", e.message);
        assert!(parse::<ChatRequest>(b"{not json")
            .unwrap_err()
            .message
            .contains("JSON"));
        let bad = |body: &[u8]| {
            parse::<Common>(body)
                .unwrap()
                .check(10, &[])
                .unwrap_err()
                .message
        };
        assert!(bad(br#"{"prompt":"a","temperature":-1}"#).contains("temperature"));
        assert!(bad(br#"{"prompt":"a","n":0}"#).contains("`n`"));
        assert!(bad(br#"{"prompt":"a","logit_bias":{"10":1}}"#).contains("below 10"));
        assert!(bad(br#"{"prompt":"a","top_p":1.5}"#).contains("top_p"));
        let body = br#"{"prompt":[1,2,3],"max_tokens":4}"#;
        let ids: CompletionRequest = parse(body).unwrap();
        assert!(matches!(ids.prompt, Prompts::One(Prompt::Ids(ref v)) if v == &[1, 2, 3]));
        let many: CompletionRequest = parse(br#"{"prompt":["a",[4,5]]}"#).unwrap();
        assert!(matches!(&many.prompt, Prompts::Many(v) if v.len() == 2));
        assert_eq!(
            parse::<Common>(body)
                .unwrap()
                .check(10, &[])
                .unwrap()
                .max_tokens,
            4
        );
    }
}
