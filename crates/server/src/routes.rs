//! The HTTP routes: the OpenAI endpoints, tokenize and detokenize, health, metrics and the chat
//! page, and the shaping of the scheduler's events into responses and server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use synapse_engine::chat::Message;
use synapse_engine::generate::StopReason;
use synapse_engine::tokenizer::Tokenizer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::{
    self, ApiError, ChatRequest, CompletionRequest, Prompt, MAX_PROMPTS, MAX_TOP_LOGPROBS,
};
use crate::scheduler::{Event, Finish, Job, Logprob, Refused};
use crate::state::{App, Ready};

const PAGE: &str = include_str!("page.html");

pub(crate) fn router(app: Arc<App>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(app.clone(), auth));
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/health", get(health))
        .merge(api)
        .layer(DefaultBodyLimit::max(app.cfg.max_body))
        .with_state(app)
}

/// `Authorization: Bearer KEY` where the server has a key.
async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.cfg.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            let why = if given.is_none() {
                "no API key given"
            } else {
                "a wrong API key"
            };
            return ApiError::with(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
                format!("{why}: send `Authorization: Bearer KEY`"),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// The loaded model's state, or 503 while it loads (500 if it failed to).
fn ready(app: &App) -> Result<&Ready, ApiError> {
    if let Some(r) = app.ready.get() {
        return Ok(r);
    }
    Err(match app.failed.get() {
        Some(why) => ApiError::with(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "model_failed",
            format!("the model failed to load: {why}"),
        ),
        None => ApiError::with(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "loading",
            "the model is loading".into(),
        ),
    })
}

/// A request's body, or 413 past the limit.
fn body(b: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    b.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::with(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "body_too_large",
                format!("the request body is larger than {limit} bytes"),
            )
        } else {
            ApiError::bad(format!("the request body: {e}"))
        }
    })
}

async fn health(State(app): State<Arc<App>>) -> Response {
    match ready(&app) {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => (
            e.status,
            Json(json!({"status": e.code, "error": e.message})),
        )
            .into_response(),
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

async fn models(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    let r = ready(&app)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": r.model_id, "object": "model", "created": r.created, "owned_by": "synapse",
            "meta": {"n_ctx": r.n_ctx, "n_vocab": r.n_vocab},
        }],
    })))
}

#[derive(Deserialize)]
struct TokenizeBody {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

async fn tokenize(
    State(app): State<Arc<App>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let r = ready(&app)?;
    let t: TokenizeBody = api::parse(&body(b, app.cfg.max_body)?)?;
    let ids = r.tok.tokenize(&t.content, t.add_special, true);
    if t.with_pieces {
        let pieces: Vec<Value> = ids
            .iter()
            .map(|&id| json!({"id": id, "piece": r.tok.piece_text(id)}))
            .collect();
        return Ok(Json(json!({ "tokens": pieces })));
    }
    Ok(Json(json!({ "tokens": ids })))
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

async fn detokenize(
    State(app): State<Arc<App>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let r = ready(&app)?;
    let t: DetokenizeBody = api::parse(&body(b, app.cfg.max_body)?)?;
    check_ids(&t.tokens, r.n_vocab)?;
    Ok(Json(json!({ "content": r.tok.decode(&t.tokens) })))
}

fn check_ids(ids: &[u32], n_vocab: usize) -> Result<(), ApiError> {
    match ids.iter().find(|&&t| t as usize >= n_vocab) {
        Some(t) => Err(ApiError::bad(format!(
            "token id {t} is not in the vocabulary of {n_vocab}"
        ))),
        None => Ok(()),
    }
}

/// Chat or text completion: how the events are shaped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

async fn chat(
    State(app): State<Arc<App>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let r = ready(&app)?;
    let v = api::json(&body(b, app.cfg.max_body)?)?;
    let (req, common): (ChatRequest, api::Common) = (api::fields(&v)?, api::fields(&v)?);
    let template = r
        .template
        .as_ref()
        .map_err(|e| ApiError::bad(format!("{e}: use /v1/completions")))?;
    let messages = req
        .messages
        .iter()
        .map(|m| Ok(Message::new(&m.role, &m.text()?)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    if messages.is_empty() {
        return Err(ApiError::bad("`messages` is empty"));
    }
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::bad(e.to_string()))?;
    // Templates write the BOS themselves; the special tokens in them must be parsed.
    let prompt = r.tok.encode(&text, false, true);
    let top = req.logprobs.then(|| req.top_logprobs.unwrap_or(0));
    generate(&app, r, Kind::Chat, vec![prompt], &common, top).await
}

async fn completions(
    State(app): State<Arc<App>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let r = ready(&app)?;
    let v = api::json(&body(b, app.cfg.max_body)?)?;
    let (req, common): (CompletionRequest, api::Common) = (api::fields(&v)?, api::fields(&v)?);
    let prompts = req.prompt.into_vec();
    if prompts.is_empty() || prompts.len() > MAX_PROMPTS {
        return Err(ApiError::bad(format!(
            "{} prompts: between 1 and {MAX_PROMPTS} a request",
            prompts.len()
        )));
    }
    let prompts = prompts
        .into_iter()
        .map(|p| match p {
            Prompt::Text(t) => Ok(r.tok.encode(&t, r.tok.add_bos_token(), true)),
            Prompt::Ids(ids) => check_ids(&ids, r.n_vocab).map(|()| ids),
        })
        .collect::<Result<Vec<_>, _>>()?;
    generate(&app, r, Kind::Text, prompts, &common, req.logprobs).await
}

/// Queue the request's choices and answer with their events: a stream, or one body.
async fn generate(
    app: &App,
    r: &Ready,
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    common: &api::Common,
    top_logprobs: Option<u32>,
) -> Result<Response, ApiError> {
    for prompt in &prompts {
        if prompt.is_empty() {
            return Err(ApiError::bad("the prompt is empty"));
        }
        if prompt.len() >= r.n_ctx {
            return Err(ApiError::with(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "context_length_exceeded",
                format!(
                    "the prompt is {} tokens and the context holds {} (with room for one more)",
                    prompt.len(),
                    r.n_ctx
                ),
            ));
        }
    }
    if let Some(k) = top_logprobs.filter(|&k| k > MAX_TOP_LOGPROBS) {
        return Err(ApiError::bad(format!(
            "{k} top logprobs asked: at most {MAX_TOP_LOGPROBS}"
        )));
    }
    let asked = common.check(r.n_vocab, r.tok.eog_ids())?;
    let choices = prompts.len() * asked.n as usize;
    if choices > r.queue.capacity() {
        // It could never be queued whole: a 503 would ask for a retry in vain.
        return Err(ApiError::bad(format!(
            "{choices} choices (prompts times n): more than the {} the server queues",
            r.queue.capacity()
        )));
    }
    let arrived = Instant::now();
    let mut receivers = Vec::new();
    // Choice `p * n + i`: prompt `p`'s `i`-th, drawn with seed `seed + i`.
    let n = asked.n as usize;
    let jobs = (0..prompts.len() * n)
        .map(|c| {
            let (tx, rx) = mpsc::unbounded_channel();
            receivers.push(rx);
            let mut sampling = asked.sampling.clone();
            sampling.seed = sampling.seed.wrapping_add((c % n) as u64);
            Job {
                prompt: prompts[c / n].clone(),
                max_tokens: asked.max_tokens,
                stop: asked.stop.clone(),
                sampling,
                logprobs: top_logprobs.map(|k| k as usize),
                events: tx,
                arrived,
            }
        })
        .collect();
    match r.queue.submit(jobs) {
        Ok(()) => {}
        Err(Refused::Full) => {
            app.metrics.rejected.inc();
            let mut e = ApiError::with(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "queue_full",
                format!(
                    "{} requests are waiting for a slot: try again shortly",
                    r.queue.depth()
                ),
            );
            e.retry_after = Some(1);
            return Err(e);
        }
        Err(Refused::Stopped) => {
            return Err(ApiError::with(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "stopped",
                "the engine has stopped".into(),
            ))
        }
    }
    let shape = Shape {
        kind,
        id: format!(
            "{}-{:016x}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            rand::random::<u64>()
        ),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: r.model_id.clone(),
        seed: asked.sampling.seed,
        tok: r.tok.clone(),
    };
    // Each choice's events, tagged with its index, as they come.
    let merged = stream::select_all(
        receivers
            .into_iter()
            .enumerate()
            .map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |e| (i, e))),
    );
    if asked.stream {
        Ok(stream_response(shape, merged, choices, n, asked.include_usage).into_response())
    } else {
        whole_response(shape, merged, choices, n).await
    }
}

/// What every chunk or body of a response repeats.
struct Shape {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    seed: u64,
    tok: Arc<Tokenizer>,
}

impl Shape {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Text, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id, "object": self.object(chunk), "created": self.created,
            "model": self.model, "system_fingerprint": concat!("synapse-", env!("CARGO_PKG_VERSION")),
            "seed": self.seed, "choices": choices,
        })
    }

    /// One token's logprobs: chat's `{token, logprob, bytes, top_logprobs}`.
    fn chat_logprob(&self, lp: &Logprob) -> Value {
        let entry = |t: u32, l: f32| {
            let bytes = self.tok.token_to_piece(t);
            json!({"token": String::from_utf8_lossy(bytes), "logprob": l, "bytes": bytes})
        };
        let mut v = entry(lp.token, lp.logprob);
        v["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
        v
    }

    /// Completions' logprobs for some tokens: parallel lists.
    fn text_logprobs(&self, lps: &[Logprob], offset0: usize) -> Value {
        let mut offset = offset0;
        let (mut tokens, mut lp, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
        for l in lps {
            let p = self.tok.piece_text(l.token);
            offsets.push(offset);
            offset += p.len();
            tokens.push(p);
            lp.push(l.logprob);
            let m: serde_json::Map<String, Value> = l
                .top
                .iter()
                .map(|&(t, v)| (self.tok.piece_text(t), json!(v)))
                .collect();
            top.push(m);
        }
        json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offsets})
    }

    fn choice(&self, i: usize, text: &str, logprobs: Option<Value>, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Chat => json!({
                "index": i, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": finish,
            }),
            Kind::Text => json!({
                "index": i, "text": text, "logprobs": logprobs, "finish_reason": finish,
            }),
        }
    }

    fn delta(
        &self,
        i: usize,
        text: Option<&str>,
        logprobs: Option<Value>,
        finish: Option<&str>,
    ) -> Value {
        match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!({"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Text => json!({
                "index": i, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish,
            }),
        }
    }
}

fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::EndOfGeneration(_) | StopReason::StopString => "stop",
        StopReason::Length | StopReason::ContextFull => "length",
    }
}

/// `usage` over the choices' ends (`n` a prompt): each prompt counted once, with its first
/// choice's cached tokens.
fn usage(done: &[Option<Finish>], n: usize) -> Value {
    let firsts = done.iter().step_by(n.max(1)).flatten();
    let prompt: usize = firsts.clone().map(|f| f.prompt_tokens).sum();
    let cached: usize = firsts.map(|f| f.cached_tokens).sum();
    let completion: usize = done.iter().flatten().map(|f| f.completion_tokens).sum();
    let drafted: usize = done.iter().flatten().map(|f| f.drafted).sum();
    let accepted: usize = done.iter().flatten().map(|f| f.accepted).sum();
    json!({
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        // Prompt lookup's guesses (`serve --lookup`), in OpenAI's fields for predictions.
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        },
    })
}

async fn whole_response(
    shape: Shape,
    mut events: impl futures_util::Stream<Item = (usize, Event)> + Unpin,
    n: usize,
    per_prompt: usize,
) -> Result<Response, ApiError> {
    let mut text = vec![String::new(); n];
    let mut lps: Vec<Vec<Logprob>> = vec![Vec::new(); n];
    let mut done: Vec<Option<Finish>> = vec![None; n];
    while let Some((i, e)) = events.next().await {
        match e {
            Event::Token(t) => {
                text[i].push_str(&t.text);
                lps[i].extend(t.logprob);
            }
            Event::Done(f) => done[i] = Some(f),
            Event::Error(m) => {
                return Err(ApiError::with(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "engine_error",
                    m,
                ))
            }
        }
    }
    let choices = (0..n)
        .map(|i| {
            let finish = done[i].as_ref().map(|f| finish_reason(f.reason));
            let logprobs = match shape.kind {
                Kind::Chat if !lps[i].is_empty() => Some(json!({
                    "content": lps[i].iter().map(|l| shape.chat_logprob(l)).collect::<Vec<_>>()
                })),
                Kind::Text if !lps[i].is_empty() => Some(shape.text_logprobs(&lps[i], 0)),
                _ => None,
            };
            shape.choice(i, &text[i], logprobs, finish)
        })
        .collect();
    let mut body = shape.envelope(false, choices);
    body["usage"] = usage(&done, per_prompt);
    Ok(Json(body).into_response())
}

/// Server-sent events: `data: {chunk}` as tokens come, the usage chunk when asked, then
/// `data: [DONE]`. An error after the stream began is sent as `data: {"error": ...}`.
fn stream_response(
    shape: Shape,
    events: impl futures_util::Stream<Item = (usize, Event)> + Unpin + Send + 'static,
    n: usize,
    per_prompt: usize,
    include_usage: bool,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    struct St<S> {
        shape: Shape,
        events: S,
        done: Vec<Option<Finish>>,
        offsets: Vec<usize>,
        started: bool,
        ended: bool,
    }
    let st = St {
        shape,
        events,
        done: vec![None; n],
        offsets: vec![0; n],
        started: false,
        ended: false,
    };
    let data = |v: Value| SseEvent::default().data(v.to_string());
    let s = stream::unfold(st, move |mut st| async move {
        if st.ended {
            return None;
        }
        let mut out: Vec<SseEvent> = Vec::new();
        if !st.started {
            st.started = true;
            if st.shape.kind == Kind::Chat {
                // The role first, at once, as OpenAI's streams begin (a queued request's
                // client then knows it is accepted).
                let choices = (0..n)
                    .map(|i| {
                        json!({"index": i, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null})
                    })
                    .collect();
                out.push(data(st.shape.envelope(true, choices)));
                return Some((stream::iter(out.into_iter().map(Ok)), st));
            }
        }
        match st.events.next().await {
            Some((i, Event::Token(t))) => {
                let lp = t.logprob.as_ref().map(|l| match st.shape.kind {
                    Kind::Chat => json!({"content": [st.shape.chat_logprob(l)]}),
                    Kind::Text => st
                        .shape
                        .text_logprobs(std::slice::from_ref(l), st.offsets[i]),
                });
                st.offsets[i] += t
                    .logprob
                    .as_ref()
                    .map_or(0, |l| st.shape.tok.piece_text(l.token).len());
                let d = st.shape.delta(i, Some(&t.text), lp, None);
                out.push(data(st.shape.envelope(true, vec![d])));
            }
            Some((i, Event::Done(f))) => {
                let d = st.shape.delta(i, None, None, Some(finish_reason(f.reason)));
                out.push(data(st.shape.envelope(true, vec![d])));
                st.done[i] = Some(f);
            }
            Some((_, Event::Error(m))) => {
                let e = ApiError::with(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "engine_error",
                    m,
                );
                out.push(data(e.body()));
                out.push(SseEvent::default().data("[DONE]"));
                st.ended = true;
            }
            None => {
                if include_usage {
                    let mut u = st.shape.envelope(true, vec![]);
                    u["usage"] = usage(&st.done, per_prompt);
                    out.push(data(u));
                }
                out.push(SseEvent::default().data("[DONE]"));
                st.ended = true;
            }
        }
        Some((stream::iter(out.into_iter().map(Ok)), st))
    })
    .flatten();
    // Comments while a request waits in the queue, so that proxies and clients with read
    // timeouts do not give up on a silent stream.
    Sse::new(s).keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(10)))
}
