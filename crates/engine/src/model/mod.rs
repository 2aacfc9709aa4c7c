//! Architectures, one file each, behind one trait ([`Model`]), with the state, scratch and
//! checks every forward pass shares. The registry that picks an architecture from a file's
//! `general.architecture` is `registry.rs`; the blocks the architectures are built from are
//! `common.rs`, `blocks.rs`, `ffn.rs`, `decoder.rs` and `moe.rs`. Of its children this module
//! uses only the two at the bottom (`hparams.rs`, `common.rs`), so that the others can all use
//! it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::attention::AttnShape;
use crate::delta_net::{DeltaNetBuffers, RecurrentState};
use crate::kv::KvCache;
use crate::matmul::{Acts, Matrix, Threads};
use crate::ops::Rope;
use crate::ModelError;
use hparams::MoeParams;

pub(crate) use common::{attn_shape, bytes, mm, mm_many, pass_over_blocks, vector};
pub use registry::{load, supported_architectures};
pub use view::{
    AttentionView, DecoderView, DeltaNetView, GateView, LayerView, MixerView, WeightView,
};

mod batch;
mod blocks;
mod common;
mod decoder;
mod ffn;
pub mod gemma3;
pub mod gptoss;
pub mod granite;
mod hparams;
pub mod llama;
pub mod mistral3;
mod moe;
pub mod olmo2;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod qwen35;
pub mod qwen3moe;
mod registry;
pub mod smollm3;
mod view;

/// What every architecture tells about itself.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub arch: String,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// The loaded model's own number, which its states carry: a state is refused by any other
    /// model ([`ModelError::ForeignState`]), even one loaded from the same file.
    pub(crate) id: u64,
}

impl ModelInfo {
    /// The information of a model being loaded, with a number no other model of the process
    /// has.
    pub fn new(
        arch: &str,
        n_vocab: usize,
        n_ctx_train: usize,
        n_embd: usize,
        n_layer: usize,
    ) -> ModelInfo {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        ModelInfo {
            arch: arch.into(),
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None: only fill the cache (all but the last batch of a prompt).
    None,
    /// The last token's: generation.
    Last,
    /// Every token's: evaluation, perplexity.
    All,
}

impl Logits {
    pub fn rows(self, n_tokens: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => n_tokens,
        }
    }
}

pub trait Model: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// A fresh sequence state: its KV cache for `n_ctx` positions and scratch for batches of up
    /// to `n_batch` tokens. All memory the forward pass needs is allocated here, once (the KV
    /// cache grows as positions come, up to `n_ctx`). A state whose buffers cannot be
    /// addressed or allocated is an error ([`ModelError::StateSize`]). The state belongs to this
    /// model: any other refuses it ([`ModelError::ForeignState`]).
    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError>;

    /// Run `tokens` at positions `state.pos..`, appending them to the cache, and write the
    /// requested logits (`(logits.rows(n), n_vocab)`) into `out`.
    fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        logits: Logits,
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError>;

    /// The scratch of batched passes ([`Model::forward_batch`]) of up to `n_tokens` tokens in
    /// all, allocated once.
    fn new_batch(&self, n_tokens: usize) -> Result<Batch, ModelError>;

    /// One pass over several sequences: each [`Seq`]'s tokens fed to its own state, the logits
    /// each asks for written into `out` one sequence after another. Each sequence gets the
    /// bits it gets run alone ([`Model::forward`]), whatever else the batch holds.
    fn forward_batch(
        &self,
        batch: &mut Batch,
        seqs: &mut [Seq<'_>],
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError>;

    /// The memory a decode step reads its weights from, in the order it reads it: each
    /// matrix's packed copy or file bytes (see [`crate::matmul::Matrix::resident`]). The read
    /// probe's passes over it measure the bandwidth of the very pages decode streams
    /// (`synapse bench --probe-each-token --probe-weights`).
    fn weight_memory(&self) -> Vec<&[u8]>;

    /// The model described for another backend ([`DecoderView`]): every dense architecture
    /// describes itself; `None` for the mixtures of experts (for now).
    fn view(&self) -> Option<DecoderView<'_>> {
        None
    }

    /// Take `state` back to its first `keep` positions, dropping tokens fed on trial
    /// (speculation's rejected guesses). `fed` are the tokens fed since `cp` was taken. The KV
    /// cache rewinds; a recurrent state, which cannot, returns to `cp` and takes the kept
    /// tokens of `fed` again: the bits it had after them. A checkpoint that is not of this
    /// state before `fed` is an error ([`ModelError::StaleCheckpoint`]), nothing changed.
    fn take_back(
        &self,
        state: &mut State,
        cp: &Checkpoint,
        fed: &[u32],
        keep: usize,
        threads: &Threads,
    ) -> Result<(), ModelError> {
        if keep >= state.pos || state.rewind(keep) {
            return Ok(());
        }
        if keep < cp.pos || cp.pos + fed.len() != state.pos || !state.restore(cp) {
            return Err(ModelError::StaleCheckpoint);
        }
        self.forward(state, &fed[..keep - cp.pos], Logits::None, &mut [], threads)
    }

    /// Feed a whole prompt in batches of `n_batch` and return the logits asked for:
    /// every position's (`All`) or the last one's (`Last`).
    fn prefill(
        &self,
        state: &mut State,
        tokens: &[u32],
        n_batch: usize,
        logits: Logits,
        threads: &Threads,
    ) -> Result<Vec<f32>, ModelError> {
        let n_vocab = self.info().n_vocab;
        // Before the logits are sized by the prompt: one past the context is refused anyway.
        if state
            .pos
            .checked_add(tokens.len())
            .is_none_or(|end| end > state.n_ctx())
        {
            return Err(ModelError::ContextFull {
                pos: state.pos,
                n: tokens.len(),
                n_ctx: state.n_ctx(),
            });
        }
        let mut out = vec![0.0; logits.rows(tokens.len()) * n_vocab];
        let n_batch = n_batch.clamp(1, state.n_batch);
        let chunks: Vec<&[u32]> = tokens.chunks(n_batch).collect();
        let mut written = 0;
        for (i, chunk) in chunks.iter().enumerate() {
            let want = match logits {
                Logits::All => Logits::All,
                Logits::Last if i + 1 == chunks.len() => Logits::Last,
                _ => Logits::None,
            };
            let rows = want.rows(chunk.len());
            self.forward(
                state,
                chunk,
                want,
                &mut out[written..written + rows * n_vocab],
                threads,
            )?;
            written += rows * n_vocab;
        }
        Ok(out)
    }
}

/// The state of one sequence: its position, its KV cache, the recurrent state of recurrent
/// layers (if any) and the scratch of the forward pass.
pub struct State {
    /// Tokens in the cache so far: the position of the next token.
    pub pos: usize,
    /// The [`ModelInfo::id`] of the model that made it.
    pub(crate) model: u64,
    pub(crate) n_batch: usize,
    pub(crate) kv: KvCache,
    pub(crate) rs: RecurrentState,
    pub(crate) s: Scratch,
    /// What another backend keeps for the sequence (its KV cache on a GPU): see
    /// [`State::external`].
    pub(crate) ext: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Whether `ext` holds a recurrent state, which cannot go back (see [`State::rewind`]).
    ext_recurrent: bool,
}

impl State {
    /// The state of a decoder whose layers all share one attention shape: a KV cache for every
    /// layer and the scratch of the forward pass, allocated once.
    pub(crate) fn for_decoder(
        info: &ModelInfo,
        a: &AttnShape,
        n_ff: usize,
        moe: Option<MoeParams>,
        n_ctx: usize,
        n_batch: usize,
    ) -> Result<State, ModelError> {
        let d = ScratchDims {
            moe,
            ..ScratchDims::for_decoder(info, a, n_ff, scratch_rows(n_ctx, n_batch))
        };
        let mut bytes = StateBytes::new(n_ctx, n_batch)?;
        d.count(&mut bytes)?;
        bytes.kv_cache(info.n_layer, a)?;
        bytes.reserve()?;
        Ok(State {
            pos: 0,
            model: info.id,
            n_batch,
            kv: KvCache::new(info.n_layer, n_ctx, a.n_head_kv, a.head_dim),
            rs: RecurrentState::default(),
            s: Scratch::new(&d),
            ext: None,
            ext_recurrent: false,
        })
    }

    /// The state of a model another backend runs (`info`'s, `n_ctx` positions, batches of up to
    /// `n_batch`): the engine keeps its position and checks; `ext`, which the engine never
    /// looks into, holds the rest ([`State::external_mut`]). Its prefix cannot be copied to
    /// another state ([`State::copy_prefix`] refuses). `recurrent`: `ext` holds a recurrent
    /// state, which cannot go back ([`State::rewind`] and [`State::restore`] refuse); the
    /// backend starts it afresh whenever a pass starts at position 0 ([`State::reset`]).
    pub fn external(
        info: &ModelInfo,
        n_ctx: usize,
        n_batch: usize,
        ext: Box<dyn std::any::Any + Send + Sync>,
        recurrent: bool,
    ) -> Result<State, ModelError> {
        StateBytes::new(n_ctx, n_batch)?;
        let none = ScratchDims {
            n_batch: 0,
            n_embd: 0,
            q_dim: 0,
            kv_dim: 0,
            n_ff: 0,
            head_dim: 0,
            moe: None,
        };
        Ok(State {
            pos: 0,
            model: info.id,
            n_batch,
            kv: KvCache::new(0, n_ctx, 0, 0),
            rs: RecurrentState::default(),
            s: Scratch::new(&none),
            ext: Some(ext),
            ext_recurrent: recurrent,
        })
    }

    /// What the backend that made this state keeps in it, if it is a `T`.
    pub fn external_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.ext.as_mut()?.downcast_mut()
    }

    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// The most tokens one pass over this state takes.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Go back to position `pos`, keeping the first `pos` tokens (a prefix the next tokens
    /// share with the cached ones). A recurrent state holds every token fed and cannot go
    /// back: there only `pos == self.pos` succeeds. `false`: nothing changed (then
    /// [`State::reset`] and feed from the start).
    pub fn rewind(&mut self, pos: usize) -> bool {
        if pos > self.pos || (pos < self.pos && self.is_recurrent()) {
            return false;
        }
        self.pos = pos;
        true
    }

    /// Hold the first `n` tokens `other` holds instead of what this state held (their keys and
    /// values copied: a prefix cached in one sequence's state given to another). `false`, and
    /// nothing changed, where that cannot be: states of two models or shapes, `n` past what
    /// `other` holds or this context, a recurrent state (its one state is of all its tokens),
    /// or no memory for the cache.
    pub fn copy_prefix(&mut self, other: &State, n: usize) -> bool {
        if self.model != other.model
            || n > other.pos
            || n > self.n_ctx()
            || self.rs.is_recurrent()
            || other.rs.is_recurrent()
            || self.ext.is_some()
            || other.ext.is_some()
        {
            return false;
        }
        if self.kv.copy_prefix(&other.kv, n).is_err() {
            return false;
        }
        self.pos = n;
        true
    }

    /// Remember where the sequence is, to come back with [`State::restore`] after tokens fed
    /// on trial (speculation's drafts). The KV cache needs only the position; a recurrent
    /// state's arrays are copied into `cp` (allocated once, reused).
    pub fn checkpoint(&self, cp: &mut Checkpoint) {
        cp.model = self.model;
        cp.pos = self.pos;
        if self.rs.is_recurrent() {
            self.rs.save(&mut cp.recurrent);
        } else {
            cp.recurrent.clear();
        }
    }

    /// Back to the position of `cp`, taken of this state when it held the tokens it still
    /// holds up to there (the caller's promise: tokens fed since may be dropped, not those
    /// before). `false`, and nothing changed, for a checkpoint of another model or past the
    /// current position.
    pub fn restore(&mut self, cp: &Checkpoint) -> bool {
        if cp.model != self.model || cp.pos > self.pos || (self.ext_recurrent && cp.pos < self.pos)
        {
            return false;
        }
        if self.rs.is_recurrent() && !self.rs.restore(&cp.recurrent) {
            return false;
        }
        self.pos = cp.pos;
        true
    }

    /// Whether the state carries a recurrent state, which [`State::rewind`] cannot take back.
    pub fn is_recurrent(&self) -> bool {
        self.rs.is_recurrent() || self.ext_recurrent
    }

    /// Room in the KV cache for positions `..end`, asked for before a pass stores them: a size
    /// the system refuses is an error, not an abort in the middle of a layer.
    pub(crate) fn make_room(&mut self, end: usize) -> Result<(), ModelError> {
        self.kv
            .make_room(end)
            .map_err(|bytes| ModelError::StateSize {
                n_ctx: self.n_ctx(),
                n_batch: self.n_batch,
                why: format!(
                    "the system would not give the KV cache's {bytes} bytes for {end} positions"
                ),
            })
    }

    /// Forget the sequence (keep the memory). The KV cache is overwritten as the next one fills
    /// it; a recurrent state is carried from token to token, so it is cleared.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.rs.reset();
    }
}

/// How many tokens `held` (what a state holds) and `tokens` share from their start: the
/// prefix a state keeps when it is given `tokens` next.
pub fn shared_prefix(held: &[u32], tokens: &[u32]) -> usize {
    held.iter().zip(tokens).take_while(|(a, b)| a == b).count()
}

/// A position of a [`State`] to come back to ([`State::checkpoint`]).
#[derive(Default)]
pub struct Checkpoint {
    model: u64,
    pos: usize,
    recurrent: Vec<f32>,
}

impl Checkpoint {
    /// The position it holds.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

/// The rows a state's scratch needs for batches of up to `n_batch` tokens in a context of
/// `n_ctx`: no batch that fits in the context is larger than it.
pub(crate) fn scratch_rows(n_ctx: usize, n_batch: usize) -> usize {
    n_batch.min(n_ctx)
}

/// The bytes of a state's buffers, added up with checked arithmetic before any is allocated,
/// then asked of the system at once: a state too large to address, or one the system will not
/// give, is an error ([`ModelError::StateSize`]) rather than an abort on an allocation.
pub(crate) struct StateBytes {
    n_ctx: usize,
    n_batch: usize,
    total: usize,
}

impl StateBytes {
    /// The count for a state of `n_ctx` positions and batches of `n_batch`: an error if either
    /// is 0 (no token could ever be run).
    pub fn new(n_ctx: usize, n_batch: usize) -> Result<StateBytes, ModelError> {
        let b = StateBytes {
            n_ctx,
            n_batch,
            total: 0,
        };
        if n_ctx == 0 || n_batch == 0 {
            return Err(b.error("a state needs room for at least one token".into()));
        }
        Ok(b)
    }

    fn error(&self, why: String) -> ModelError {
        ModelError::StateSize {
            n_ctx: self.n_ctx,
            n_batch: self.n_batch,
            why,
        }
    }

    /// `b` (from [`bytes`]) within what an allocation may hold.
    fn addressable(&self, what: &str, b: Option<usize>) -> Result<usize, ModelError> {
        b.filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| self.error(format!("its {what} would not fit in the address space")))
    }

    /// A buffer of `b` bytes (from [`bytes`]), allocated with the state.
    pub fn add(&mut self, what: &str, b: Option<usize>) -> Result<(), ModelError> {
        let b = self.addressable(what, b)?;
        let total = self.total.checked_add(b);
        self.total = self.addressable("buffers", total)?;
        Ok(())
    }

    /// The KV cache of `n_layer` layers: the room it starts with, and the context it may grow
    /// to, which must be addressable (it is allocated as positions come).
    pub fn kv_cache(&mut self, n_layer: usize, a: &AttnShape) -> Result<(), ModelError> {
        let (kv, hd) = (a.n_head_kv, a.head_dim);
        let full = KvCache::bytes(n_layer, self.n_ctx, kv, hd);
        self.addressable("KV cache for the whole context", full)?;
        let room = KvCache::bytes(n_layer, KvCache::initial_room(self.n_ctx), kv, hd);
        self.add("KV cache", room)
    }

    /// Ask the system for the total once, and give it back: a size it refuses is an error here
    /// instead of an abort in the middle of the allocations.
    pub fn reserve(&self) -> Result<(), ModelError> {
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(self.total).map_err(|_| {
            self.error(format!(
                "the system would not allocate its {} bytes",
                self.total
            ))
        })
    }
}

/// Per-batch buffers, sized once for the largest batch. Shapes in comments use `n = n_batch`.
pub(crate) struct Scratch {
    pub x: Vec<f32>,      // (n, n_embd) residual stream
    pub h: Vec<f32>,      // (n, n_embd) normed input of a block
    pub q: Vec<f32>,      // (n, n_head * head_dim)
    pub k: Vec<f32>,      // (n, n_head_kv * head_dim)
    pub v: Vec<f32>,      // (n, n_head_kv * head_dim)
    pub att: Vec<f32>,    // (n, n_head * head_dim)
    pub o: Vec<f32>,      // (n, n_embd) a block's output before the residual add
    pub gate: Vec<f32>,   // (n, n_ff)
    pub up: Vec<f32>,     // (n, n_ff)
    pub rope: RopeAngles, // (n, head_dim / 2) the batch's positions' angles
    pub acts: Acts,       // quantized input of the current matmul
    /// `(n, 2 * n_head * head_dim)` a gated attention's joint query and gate projection (Qwen
    /// 3.5); empty for other architectures.
    pub q_full: Vec<f32>,
    /// The buffers of gated delta-net layers; empty for architectures without them.
    pub dn: DeltaNetBuffers,
    /// The buffers of a mixture of experts' layers; empty for architectures without them.
    pub moe: MoeBuffers,
}

/// The sizes a [`Scratch`] is allocated for.
pub(crate) struct ScratchDims {
    pub n_batch: usize,
    pub n_embd: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub n_ff: usize,
    pub head_dim: usize,
    /// The experts of a mixture's layers, where it has them.
    pub moe: Option<MoeParams>,
}

impl ScratchDims {
    /// The scratch of `n_batch` rows of a decoder whose layers share one attention shape.
    pub fn for_decoder(info: &ModelInfo, a: &AttnShape, n_ff: usize, n_batch: usize) -> Self {
        ScratchDims {
            n_batch,
            n_embd: info.n_embd,
            q_dim: a.n_head * a.head_dim,
            kv_dim: a.n_head_kv * a.head_dim,
            n_ff,
            head_dim: a.head_dim,
            moe: None,
        }
    }

    /// The widest input a matmul quantizes.
    fn widest(&self) -> usize {
        self.n_embd.max(self.q_dim).max(self.n_ff)
    }

    /// Count the bytes of [`Scratch::new`]'s buffers.
    pub fn count(&self, b: &mut StateBytes) -> Result<(), ModelError> {
        let n = self.n_batch;
        let f32s = |w: usize, copies: usize| bytes(4 * copies, &[n, w]);
        b.add("residual and norm rows", f32s(self.n_embd, 3))?;
        b.add("query rows", f32s(self.q_dim, 2))?;
        b.add("key and value rows", f32s(self.kv_dim, 2))?;
        b.add("feed-forward rows", f32s(self.n_ff, 2))?;
        b.add("RoPE angles", bytes(8, &[n.max(1), self.head_dim / 2]))?;
        if let Some(p) = &self.moe {
            b.add("expert rows", MoeBuffers::bytes(n, self.n_embd, p))?;
        }
        // The quantized activations: a batch and, at most, two spare ones.
        b.add("quantized activations", f32s(self.widest(), 3))
    }
}

impl Scratch {
    pub fn new(d: &ScratchDims) -> Scratch {
        let n = d.n_batch;
        let widest = d.widest();
        Scratch {
            x: vec![0.0; n * d.n_embd],
            h: vec![0.0; n * d.n_embd],
            q: vec![0.0; n * d.q_dim],
            k: vec![0.0; n * d.kv_dim],
            v: vec![0.0; n * d.kv_dim],
            att: vec![0.0; n * d.q_dim],
            o: vec![0.0; n * d.n_embd],
            gate: vec![0.0; n * d.n_ff],
            up: vec![0.0; n * d.n_ff],
            rope: RopeAngles::new(n, d.head_dim),
            acts: Acts::with_capacity(n, widest),
            q_full: Vec::new(),
            dn: DeltaNetBuffers::default(),
            moe: match &d.moe {
                Some(p) => MoeBuffers::new(n, d.n_embd, p),
                None => MoeBuffers::default(),
            },
        }
    }
}

/// The scratch of a mixture's pass of up to `n` tokens.
#[derive(Default)]
pub(crate) struct MoeBuffers {
    /// `(n, n_expert)`: the router's logits.
    logits: Vec<f32>,
    /// `(n_expert)`: one token's probabilities.
    probs: Vec<f32>,
    /// `(n, n_used)`: each token's experts, most probable first, and their weights.
    chosen: Vec<(u32, f32)>,
    /// Where each expert's rows start among the gathered rows (`n_expert + 1` entries).
    starts: Vec<usize>,
    /// `(n * n_used)`: the token of each gathered row.
    src: Vec<usize>,
    /// `(n, n_used)`: the gathered row of each token's expert of each rank.
    slot: Vec<usize>,
    /// `(n * n_used, n_ff_exp)`: the experts' gate (then GLU) and up rows.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// `(n * n_used, n_embd)`: the experts' outputs.
    down: Vec<f32>,
    /// The gathered rows, quantized.
    acts: Acts,
    /// `(n, n_embd)`, `(n)`: the shared expert's output and its gate's logits, where the
    /// mixture has one.
    shared: Vec<f32>,
    shared_gate: Vec<f32>,
}

impl MoeBuffers {
    pub fn new(n: usize, n_embd: usize, p: &MoeParams) -> MoeBuffers {
        let rows = n * p.n_used;
        MoeBuffers {
            logits: vec![0.0; n * p.n_expert],
            probs: vec![0.0; p.n_expert],
            chosen: vec![(0, 0.0); rows],
            starts: vec![0; p.n_expert + 1],
            src: vec![0; rows],
            slot: vec![0; rows],
            gate: vec![0.0; rows * p.n_ff_exp],
            up: vec![0.0; rows * p.n_ff_exp],
            down: vec![0.0; rows * n_embd],
            acts: Acts::with_capacity(rows, n_embd.max(p.n_ff_exp)),
            shared: vec![
                0.0;
                if p.n_ff_shared.is_some() {
                    n * n_embd
                } else {
                    0
                }
            ],
            shared_gate: vec![0.0; if p.n_ff_shared.is_some() { n } else { 0 }],
        }
    }

    /// The bytes [`MoeBuffers::new`] allocates, or `None` where that overflows.
    pub fn bytes(n: usize, n_embd: usize, p: &MoeParams) -> Option<usize> {
        let rows = n.checked_mul(p.n_used)?;
        let widest = n_embd.max(p.n_ff_exp);
        [
            bytes(4, &[n, p.n_expert]),
            bytes(24, &[rows]),
            bytes(4 * 2, &[rows, p.n_ff_exp]),
            bytes(4, &[rows, n_embd]),
            // Acts: the rows and at most three spare ones, four bytes a value at most.
            bytes(4, &[rows.checked_add(6)?, widest]),
            bytes(4, &[n, n_embd.checked_add(1)?]),
        ]
        .into_iter()
        .try_fold(0usize, |a, b| a.checked_add(b?))
    }

    /// Lay out the `n * k` rows the tokens' choices make, expert by expert and, within an
    /// expert, token by token: `starts`, `src` and `slot`. Returns the number of rows.
    fn group(&mut self, n: usize, k: usize, n_expert: usize) -> usize {
        let rows = n * k;
        self.starts.fill(0);
        for &(e, _) in &self.chosen[..rows] {
            self.starts[e as usize + 1] += 1;
        }
        for e in 0..n_expert {
            self.starts[e + 1] += self.starts[e];
        }
        // `slot` holds each expert's next free row while it is filled; the starts stay.
        let mut next = self.starts.clone();
        for (i, &(e, _)) in self.chosen[..rows].iter().enumerate() {
            let r = next[e as usize];
            next[e as usize] += 1;
            self.src[r] = i / k;
            self.slot[i] = r;
        }
        rows
    }
}

/// One sequence's part of a batched pass: feed `tokens` at `state.pos..` and write the logits
/// `logits` asks for.
pub struct Seq<'s> {
    pub state: &'s mut State,
    pub tokens: &'s [u32],
    pub logits: Logits,
}

/// The scratch of batched passes of up to [`Batch::n_tokens`] tokens in all, allocated once.
pub struct Batch {
    pub(crate) n_tokens: usize,
    /// `None` where the architecture runs a batch's sequences one after another, each in its
    /// own state's scratch.
    pub(crate) s: Option<Scratch>,
}

impl Batch {
    /// Tokens a pass may hold, all sequences together.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Whether the sequences of a pass run together (their products over all their rows at
    /// once); `false`: one after another, each in batches its state's scratch holds, so states
    /// need scratch for the chunks they are given.
    pub fn is_joint(&self) -> bool {
        self.s.is_some()
    }
}

/// The RoPE angles of the positions a forward pass rotates, kept from layer to layer: every
/// layer of a pass rotates the same positions, with the same RoPE (Gemma 3 alternates two),
/// and the angles (a `powf`, then a cosine and a sine a pair) depend on nothing else. Worked
/// out again only when the RoPE or the positions change: once a pass, not once a layer.
pub(crate) struct RopeAngles {
    /// The RoPE and the runs of positions (first, count) the table holds.
    key: Option<(Rope, Vec<(usize, usize)>)>,
    /// The pairs of the table's `t`-th position at `t * width..`.
    cs: Vec<(f32, f32)>,
    width: usize,
}

impl RopeAngles {
    fn new(n_batch: usize, head_dim: usize) -> RopeAngles {
        let width = head_dim / 2;
        RopeAngles {
            key: None,
            cs: vec![(0.0, 0.0); n_batch.max(1) * width],
            width,
        }
    }

    /// Position `pos0 + t`'s angles under `rope` for `t < n`: the `n` tables of
    /// `self.width()` pairs (the first `n_rot / 2` of them set).
    pub fn positions(&mut self, rope: &Rope, pos0: usize, n: usize) -> &[(f32, f32)] {
        self.runs(rope, &[(pos0, n)])
    }

    /// The angles of several runs of positions (`(first, count)`, one per sequence of a
    /// batched pass), one table after another.
    pub fn runs(&mut self, rope: &Rope, runs: &[(usize, usize)]) -> &[(f32, f32)] {
        let w = self.width;
        assert!(
            rope.n_rot / 2 <= w,
            "RoPE of {} dimensions in heads of {}",
            rope.n_rot,
            2 * w
        );
        let n: usize = runs.iter().map(|r| r.1).sum();
        let held = matches!(&self.key, Some((r, k)) if r == rope && k == runs);
        if !held {
            if self.cs.len() < n * w {
                self.cs.resize(n * w, (0.0, 0.0));
            }
            let positions = runs.iter().flat_map(|&(p, m)| p..p + m);
            for (pos, cs) in positions.zip(self.cs.chunks_exact_mut(w)) {
                rope.angles(pos, cs);
            }
            let mut key = self.key.take().map(|(_, k)| k).unwrap_or_default();
            key.clear();
            key.extend_from_slice(runs);
            self.key = Some((rope.clone(), key));
        }
        &self.cs[..n * w]
    }

    /// Pairs a position's table holds.
    pub fn width(&self) -> usize {
        self.width
    }
}

/// An architecture's forward pass, for [`forward`]: the body is written once, and compiled
/// twice (baseline and x86-64-v3) by [`forward`]'s dispatch.
pub(crate) trait ForwardBody {
    fn info(&self) -> &ModelInfo;

    /// See [`Model::new_state`].
    fn new_state(&self, n_ctx: usize, n_batch: usize) -> Result<State, ModelError>;

    /// The matrices one decode step multiplies, in the order it does (not the token
    /// embedding, of which it reads one row, unless it is also the output).
    fn matrices(&self) -> Vec<&Matrix<'_>>;

    /// See [`Model::view`].
    fn view(&self) -> Option<DecoderView<'_>> {
        None
    }

    /// The pass itself, after [`check_forward`]; mark implementations `#[inline(always)]`
    /// so that the x86-64-v3 copy really is compiled with those features.
    fn forward_body(
        &self,
        st: &mut State,
        tokens: &[u32],
        logits: Logits,
        out: &mut [f32],
        threads: &Threads,
    ) -> Result<(), ModelError>;

    /// The scratch of a joint pass over several sequences of `n_tokens` tokens in all, for an
    /// architecture whose pass runs them together ([`ForwardBody::forward_runs_body`]); `None`:
    /// a batch's sequences run one after another.
    fn batch_dims(&self, _n_tokens: usize) -> Option<ScratchDims> {
        None
    }

    /// The joint pass, after [`batch::forward_batch`]'s checks, in the batch's scratch; only
    /// called where [`ForwardBody::batch_dims`] is `Some`.
    fn forward_runs_body(
        &self,
        _seqs: &mut [Seq<'_>],
        _s: &mut Scratch,
        _out: &mut [f32],
        _threads: &Threads,
    ) -> Result<(), ModelError> {
        unreachable!("a joint pass of an architecture without batch_dims")
    }
}

/// Check the request, then run the forward pass compiled for x86-64-v3 when the CPU has AVX2,
/// FMA and F16C: the same source and the same float operations in the same order (so the same
/// bits), with hardware fused multiply-adds and vector instructions instead of library calls.
pub(crate) fn forward<M: ForwardBody>(
    m: &M,
    st: &mut State,
    tokens: &[u32],
    logits: Logits,
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    crate::model::check_forward(m.info(), st, tokens, logits, out)?;
    // The cache's room for this pass, asked for before any work: a size the system refuses
    // is an error here, not an abort in the middle of a layer.
    st.make_room(st.pos + tokens.len())?;
    crate::profile::begin();
    let r = dispatch(m, st, tokens, logits, out, threads);
    crate::profile::mark("other");
    r
}

/// [`forward`]'s pass compiled for the best of the CPU's feature levels.
fn dispatch<M: ForwardBody>(
    m: &M,
    st: &mut State,
    tokens: &[u32],
    logits: Logits,
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx512f() {
        // SAFETY: the CPU has AVX-512 F besides AVX2, FMA and F16C (just checked).
        return unsafe { forward_v4(m, st, tokens, logits, out, threads) };
    }
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (just checked).
        return unsafe { forward_v3(m, st, tokens, logits, out, threads) };
    }
    m.forward_body(st, tokens, logits, out, threads)
}

/// [`forward_v3`] with AVX-512 F as well: the element-wise steps (norms, SwiGLU's
/// exponentials, residual adds) in sixteen lanes. Each step is element by element or a sum
/// in a fixed order, which the compiler may not reassociate: the same bits at either width.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn forward_v4<M: ForwardBody>(
    m: &M,
    st: &mut State,
    tokens: &[u32],
    logits: Logits,
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    m.forward_body(st, tokens, logits, out, threads)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn forward_v3<M: ForwardBody>(
    m: &M,
    st: &mut State,
    tokens: &[u32],
    logits: Logits,
    out: &mut [f32],
    threads: &Threads,
) -> Result<(), ModelError> {
    m.forward_body(st, tokens, logits, out, threads)
}

/// The checks every architecture's forward pass makes before it touches anything.
pub fn check_forward(
    info: &ModelInfo,
    st: &State,
    tokens: &[u32],
    logits: Logits,
    out: &[f32],
) -> Result<(), ModelError> {
    if st.model != info.id {
        return Err(ModelError::ForeignState);
    }
    let n = tokens.len();
    if n == 0 && logits == Logits::Last {
        return Err(ModelError::NoTokens);
    }
    if n > st.n_batch {
        return Err(ModelError::BatchTooLarge {
            n,
            n_batch: st.n_batch,
        });
    }
    // `pos` is public: a value past the context must not wrap around here.
    if st.pos.checked_add(n).is_none_or(|end| end > st.n_ctx()) {
        return Err(ModelError::ContextFull {
            pos: st.pos,
            n,
            n_ctx: st.n_ctx(),
        });
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= info.n_vocab) {
        return Err(ModelError::BadToken {
            id,
            n_vocab: info.n_vocab,
        });
    }
    let need = logits.rows(n) * info.n_vocab;
    if out.len() < need {
        return Err(ModelError::LogitsBuffer {
            have: out.len(),
            need,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::RopeStyle;

    #[test]
    fn rope_angles_are_each_positions_own_whatever_came_before() {
        let rope = |base: f32, n_rot: usize| Rope {
            style: RopeStyle::Neox,
            n_rot,
            base,
            freq_factors: None,
            scaling: crate::ops::RopeScaling::NONE,
        };
        // Gemma 3's two RoPEs in turn, Llama 3's factors, a RoPE over part of a head, batches
        // and single positions: every table must be what `angles` gives for its position.
        let mut llama3 = rope(500_000.0, 64);
        llama3.freq_factors = Some((0..32).map(|i| 1.0 + i as f32 / 8.0).collect());
        let ropes = [
            rope(10_000.0, 64),
            rope(1_000_000.0, 64),
            llama3,
            rope(10_000.0, 32),
        ];
        let mut table = RopeAngles::new(4, 64);
        for (step, (r, pos0, n)) in [
            (0, 0, 4),
            (0, 0, 4),
            (1, 0, 4),
            (0, 0, 4),
            (0, 4, 1),
            (2, 4, 1),
            (3, 4, 1),
            (3, 5, 3),
            (3, 5, 3),
            (0, 9, 7),
        ]
        .into_iter()
        .enumerate()
        {
            let got = table.positions(&ropes[r], pos0, n).to_vec();
            assert_eq!(got.len(), n * 32);
            for (t, cs) in got.chunks_exact(32).enumerate() {
                let mut want = vec![(0.0, 0.0); 32];
                ropes[r].angles(pos0 + t, &mut want);
                let k = ropes[r].n_rot / 2;
                assert!(cs[..k] == want[..k], "step {step}, position {}", pos0 + t);
            }
        }
    }
}
