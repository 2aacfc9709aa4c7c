//! Quantized matrix products, `out = W x` for a batch of tokens, with the weights read in place.
//!
//! Activations are quantized once per token to the weight format's activation type (Q8_0, Q8_1,
//! Q8_K, F16 or F32, as llama.cpp does); then every (row, token) pair is one dot product of a weight
//! row with a token's activation row. Every output element is computed by the same function on
//! the same bytes whatever the batch size (G1) and whatever thread computes it (D1): threads split
//! the output rows, never the reduction.

use std::ops::Range;
use std::sync::Arc;

use synapse_gguf::{GgmlType, TensorView};
use synapse_quant::PackedMatrix;

use crate::pool::ThreadPool;
use crate::ModelError;

/// A 2-D weight matrix of `rows` outputs by `cols` inputs, in its file format, and, where the
/// CPU has kernels for it ([`Matrix::pack`]), its whole groups of sixteen rows packed.
#[derive(Clone)]
pub struct Matrix<'a> {
    /// The tensor's name in the file (shared by a stack's experts and a fused matrix's parts).
    pub name: &'a str,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    data: &'a [u8],
    row_bytes: usize,
    act: GgmlType,
    gemv: synapse_quant::GemvFn,
    /// The tiled kernel for batches, where the CPU has one.
    gemm: Option<synapse_quant::GemmFn>,
    /// The tiled kernel for one token, where it beats `gemv`.
    gemm1: Option<synapse_quant::GemmFn>,
    /// In llama.cpp's repacked order.
    repacked: bool,
    /// Rows `0..packed.rows()` packed: those rows are multiplied from here, for every batch
    /// size; the file's bytes of them are read again only by a tied embedding's lookups.
    packed: Option<Arc<PackedMatrix>>,
}

impl<'a> Matrix<'a> {
    /// A matrix view of a tensor, checked to be 2-D with `cols` inputs and a dot product.
    pub fn new(
        t: TensorView<'a>,
        cols: usize,
        rows: Option<usize>,
    ) -> Result<Matrix<'a>, ModelError> {
        let info = t.info;
        let shape_ok = info.shape.len() == 2
            && info.shape[0] as usize == cols
            && rows.is_none_or(|r| info.shape[1] as usize == r);
        if !shape_ok {
            return Err(ModelError::Shape {
                tensor: info.name.clone(),
                shape: info.shape.clone(),
                expected: format!("[{cols}, {}]", rows.map_or("n".into(), |r| r.to_string())),
            });
        }
        Self::from_bytes(
            &info.name,
            info.ggml_type,
            info.shape[1] as usize,
            cols,
            t.data,
        )
    }

    /// A 1-D tensor of `cols` values as a matrix of one row (a gate with one output).
    pub fn one_row(t: TensorView<'a>, cols: usize) -> Result<Matrix<'a>, ModelError> {
        let info = t.info;
        if info.shape != [cols as u64] {
            return Err(ModelError::Shape {
                tensor: info.name.clone(),
                shape: info.shape.clone(),
                expected: format!("[{cols}]"),
            });
        }
        Self::from_bytes(&info.name, info.ggml_type, 1, cols, t.data)
    }

    /// The `n` matrices of `rows` outputs by `cols` inputs a 3-D tensor stacks (`[cols, rows,
    /// n]`: a mixture's experts), each a view of its own bytes, checked like [`Matrix::new`].
    pub fn stacked(
        t: TensorView<'a>,
        cols: usize,
        rows: usize,
        n: usize,
    ) -> Result<Vec<Matrix<'a>>, ModelError> {
        let info = t.info;
        if info.shape != [cols as u64, rows as u64, n as u64] {
            return Err(ModelError::Shape {
                tensor: info.name.clone(),
                shape: info.shape.clone(),
                expected: format!("[{cols}, {rows}, {n}]"),
            });
        }
        let each = t.data.len() / n.max(1);
        t.data
            .chunks_exact(each.max(1))
            .take(n)
            .map(|data| Self::from_bytes(&info.name, info.ggml_type, rows, cols, data))
            .collect()
    }

    /// This matrix's rows `ranges` as matrices of their own (a fused projection's parts: Phi-3's
    /// `attn_qkv`, its gate and up halves), each summed in the order of the whole (llama.cpp
    /// repacks a fused matrix by its whole row count).
    pub fn split_rows(&self, ranges: &[Range<usize>]) -> Vec<Matrix<'a>> {
        ranges
            .iter()
            .map(|r| {
                assert!(r.start <= r.end && r.end <= self.rows, "rows of the matrix");
                Matrix {
                    rows: r.len(),
                    data: &self.data[r.start * self.row_bytes..r.end * self.row_bytes],
                    packed: None,
                    ..self.clone()
                }
            })
            .collect()
    }

    /// A matrix of `rows` rows of `cols` values of type `ty` in `data`.
    fn from_bytes(
        name: &'a str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Matrix<'a>, ModelError> {
        // llama.cpp may repack a weight matrix, which changes its summation order: follow it,
        // to keep its logits' bits. That holds for the token embedding too: its lookups read
        // the plain rows whatever the order, and where it serves as a tied output llama.cpp
        // multiplies a second copy of it, repacked like any matrix of that type and row count
        // (a one-layer Q4_0 or IQ4_NL file with a tied output matched llama.cpp's logits on
        // 13-14% of the values when the embedding was taken as never repacked). It repacks an
        // expert by the rows of one expert.
        let repacked = synapse_quant::llama_cpp_repacks(ty, rows);
        let vd = synapse_quant::matrix_kernel(ty, repacked).map_err(|e| ModelError::Tensor {
            tensor: name.into(),
            source: e,
        })?;
        Ok(Matrix {
            name,
            ty,
            rows,
            cols,
            data,
            row_bytes: data.len() / rows.max(1),
            act: vd.act,
            gemv: vd.gemv,
            gemm: synapse_quant::gemm_kernel(ty, repacked),
            gemm1: synapse_quant::decode_tile_kernel(ty, repacked),
            repacked,
            packed: None,
        })
    }

    /// This matrix with its whole groups of sixteen rows packed, where the CPU has kernels
    /// for packed rows of its format (`synapse_quant::pack_matrix`); unchanged otherwise.
    /// The results are the same bits either way: packing changes the speed only. `release`
    /// is given the file's bytes of the rows packed, piece by piece, as they are.
    pub fn pack(
        mut self,
        name: &str,
        release: &(dyn Fn(&[u8]) + Sync),
    ) -> Result<Matrix<'a>, ModelError> {
        let packed =
            synapse_quant::pack_matrix(self.ty, self.repacked, self.data, self.row_bytes, release)
                .map_err(|e| ModelError::Tensor {
                    tensor: name.into(),
                    source: e,
                })?;
        self.packed = packed.map(Arc::new);
        Ok(self)
    }

    /// The file's bytes of the matrix, row after row (whether or not it is packed).
    pub fn data(&self) -> &'a [u8] {
        &self.data[..self.rows * self.row_bytes]
    }

    /// Bytes of the file's encoding of the whole matrix (what one token's product reads).
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// The memory one token's product reads the weights from: the packed copy of the rows
    /// packed, the file's bytes of the rest.
    pub fn resident(&self) -> Vec<&[u8]> {
        let packed_rows = self.packed.as_ref().map_or(0, |p| p.rows());
        let mut parts = Vec::with_capacity(2);
        if let Some(p) = &self.packed {
            parts.push(p.data());
        }
        if packed_rows < self.rows {
            parts.push(&self.data[packed_rows * self.row_bytes..self.rows * self.row_bytes]);
        }
        parts
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// The activation format this matrix's dot product takes.
    pub fn act_type(&self) -> GgmlType {
        self.act
    }

    /// Rows a call of the batch kernel takes. The float formats' kernels (BF16's without
    /// AVX512-BF16 too) widen the batch's tokens to f32 once a call and block the rows
    /// themselves: at 64 rows a call, widening the tokens was a tenth of an F16 file's
    /// prefill. A packed matrix says its own.
    fn tile_rows(&self) -> usize {
        match (&self.packed, self.ty) {
            (Some(p), _) => p.tile_rows(),
            (None, GgmlType::F16 | GgmlType::F32 | GgmlType::BF16) => 8 * ROW_TILE,
            _ => ROW_TILE,
        }
    }
}

/// Activations of a batch of tokens, quantized for one activation type.
///
/// A few tokens (decode) are quantized by the calling thread alone, into the two halves of a
/// spare region in turn: the other threads read the last call's activations, and writing over
/// lines another core holds costs a round trip between cores for each. Alternating, the lines
/// written were last read a whole product earlier, its stream of weights in between (Zen 5, two
/// threads: quantizing for the 1B-shaped file's 65 products a token took 231 us, now 81).
pub struct Acts {
    ty: GgmlType,
    row_bytes: usize,
    n: usize,
    buf: Vec<u8>,
    /// Where this call's rows start in `buf`.
    base: usize,
    /// Bytes of each half of the region after the batch's that small calls alternate over.
    spare: usize,
}

impl Default for Acts {
    /// Room for nothing: the activations of a block a model does not have.
    fn default() -> Acts {
        Acts::with_capacity(0, 0)
    }
}

/// Calls with fewer tokens than this are quantized by the calling thread alone.
const SPLIT_FROM: usize = 4;

impl Acts {
    /// Room for `max_tokens` rows of up to `max_cols` values in any activation type.
    pub fn with_capacity(max_tokens: usize, max_cols: usize) -> Acts {
        // F32 is the widest activation type (4 bytes a value; Q8_K is 292/256).
        let batch = max_tokens * max_cols * 4;
        let spare = max_tokens.min(SPLIT_FROM - 1) * max_cols * 4;
        Acts {
            ty: GgmlType::F32,
            row_bytes: 0,
            n: 0,
            buf: vec![0; batch + 2 * spare],
            base: 0,
            spare,
        }
    }

    /// Quantize `n` rows of `cols` values (`x` is `(n, cols)`) to `ty`, tokens spread over the
    /// threads (each row is quantized alone: the same bytes whatever the split).
    pub fn quantize(&mut self, ty: GgmlType, x: &[f32], cols: usize, threads: &Threads) {
        let n = x.len() / cols;
        let row_bytes = ty.bytes_for(cols as u64).expect("cols checked at load") as usize;
        self.ty = ty;
        self.row_bytes = row_bytes;
        self.n = n;
        let q = synapse_quant::act_quantizer(ty).expect("activation types encode");
        if n < SPLIT_FROM {
            let first = self.buf.len() - 2 * self.spare;
            self.base = if self.base == first {
                first + self.spare
            } else {
                first
            };
            let buf = &mut self.buf[self.base..self.base + n * row_bytes];
            for (xr, out) in x.chunks_exact(cols).zip(buf.chunks_exact_mut(row_bytes)) {
                q(xr, out).expect("sizes agree by construction");
            }
            return;
        }
        self.base = 0;
        let buf = &mut self.buf[..n * row_bytes];
        let shared = SharedBytes(buf.as_mut_ptr());
        threads.split(n, |tokens| {
            let shared = &shared;
            // SAFETY: rows `tokens` lie inside `buf` (end <= n), and the ranges `split` hands
            // out are disjoint, so no other call touches these bytes while the slice lives.
            let out = unsafe {
                std::slice::from_raw_parts_mut(
                    shared.0.add(tokens.start * row_bytes),
                    tokens.len() * row_bytes,
                )
            };
            let xs = &x[tokens.start * cols..tokens.end * cols];
            for (xr, out) in xs.chunks_exact(cols).zip(out.chunks_exact_mut(row_bytes)) {
                q(xr, out).expect("sizes agree by construction");
            }
        });
    }

    /// Rows `ts` of this call's tokens, as the kernels read them.
    fn view(&self, ts: Range<usize>) -> ActRows<'_> {
        let bytes = &self.buf[self.base + ts.start * self.row_bytes..][..ts.len() * self.row_bytes];
        ActRows {
            n: ts.len(),
            row_bytes: self.row_bytes,
            bytes,
        }
    }

    /// Make this call's rows those of `src` at the indices `rows`, in that order (each row
    /// copied as quantized: the same bytes as quantizing its values again): the tokens routed
    /// to each expert, one expert's after another's.
    pub fn gather(&mut self, src: &Acts, rows: &[usize]) {
        let rb = src.row_bytes;
        assert!(rows.len() * rb <= self.buf.len(), "gathered rows fit");
        self.ty = src.ty;
        self.row_bytes = rb;
        self.n = rows.len();
        self.base = 0;
        for (i, &r) in rows.iter().enumerate() {
            assert!(r < src.n, "a row of the source call");
            let from = src.base + r * rb;
            self.buf[i * rb..(i + 1) * rb].copy_from_slice(&src.buf[from..from + rb]);
        }
    }
}

/// Consecutive quantized activation rows: all of a call's tokens, or one expert's share.
struct ActRows<'a> {
    n: usize,
    row_bytes: usize,
    bytes: &'a [u8],
}

impl ActRows<'_> {
    fn row(&self, t: usize) -> &[u8] {
        self.rows(t..t + 1)
    }

    /// Tokens `ts`, one after another.
    fn rows(&self, ts: Range<usize>) -> &[u8] {
        &self.bytes[ts.start * self.row_bytes..ts.end * self.row_bytes]
    }
}

/// The threads the forward pass runs on: a persistent pool, made once per session. Results do
/// not depend on how many there are (D1).
pub struct Threads {
    pool: ThreadPool,
}

impl Threads {
    /// `n` threads in all (the caller's included).
    pub fn new(n: usize) -> Threads {
        Threads {
            pool: ThreadPool::new(n.max(1)),
        }
    }

    pub fn n(&self) -> usize {
        self.pool.n_threads()
    }

    /// Run `f` over `0..n` split into contiguous ranges, range `i` on pool index `i`.
    fn split(&self, n: usize, f: impl Fn(Range<usize>) + Sync) {
        let t = self.n().min(n.max(1));
        if t == 1 {
            return f(0..n);
        }
        let chunk = n.div_ceil(t);
        self.pool.run(&|i| {
            let (start, end) = ((i * chunk).min(n), ((i + 1) * chunk).min(n));
            if start < end {
                f(start..end);
            }
        });
    }
}

/// A pointer to a byte buffer that threads write disjoint rows of.
struct SharedBytes(*mut u8);
// SAFETY: `Acts::quantize` hands each thread a disjoint set of rows, inside the buffer, which
// outlives the pool's job.
unsafe impl Sync for SharedBytes {}

/// A pointer to an output buffer that threads write disjoint elements of.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32, usize);
// SAFETY: `matmul` and `matmul_grouped` hand each thread a disjoint set of rows (of a matrix,
// or of a job whose output rows no other job writes); no element is written twice, and the
// buffer outlives the pool's job.
unsafe impl Sync for SharedOut {}

/// `out[t * rows + r] = dot(W row r, token t)` for every row and token: `out` is
/// `(n_tokens, rows)`, `acts` holds the tokens quantized to `w.act_type()`.
pub fn matmul(w: &Matrix, acts: &Acts, out: &mut [f32], threads: &Threads) {
    matmul_many(&[w], acts, &mut [out], threads)
}

/// [`matmul`] for several matrices that take the same input (Q, K and V; gate and up) in one
/// hand-off to the threads: the threads claim pieces of every matrix as they go (`Claims`),
/// or, for a small one-token product, take equal shares of each.
pub fn matmul_many(ws: &[&Matrix], acts: &Acts, outs: &mut [&mut [f32]], threads: &Threads) {
    assert!(ws.len() == outs.len() && ws.len() <= MAX_MANY);
    let n = acts.n;
    let mut shared = [SharedOut(std::ptr::null_mut(), 0); MAX_MANY];
    for ((w, out), sh) in ws.iter().zip(outs.iter_mut()).zip(&mut shared) {
        assert_eq!(acts.ty, w.act, "activations quantized for another type");
        assert!(out.len() >= n * w.rows);
        *sh = SharedOut(out.as_mut_ptr(), out.len());
    }
    let t = threads.n();
    let acts = &acts.view(0..n);
    let bytes: usize = ws.iter().map(|w| w.rows * w.row_bytes).sum();
    if t == 1 || (n == 1 && bytes < t * STATIC_BELOW) {
        // Equal shares of each matrix, a whole number of groups each (one thread: all of it,
        // on the caller).
        threads.pool.run(&|i| {
            for (w, out) in ws.iter().zip(&shared) {
                let chunk = w.rows.div_ceil(t).next_multiple_of(GROUP);
                let (lo, hi) = ((i * chunk).min(w.rows), ((i + 1) * chunk).min(w.rows));
                if lo < hi {
                    matmul_rows(w, acts, out, lo..hi);
                }
            }
        });
        return;
    }
    let work = Claims::new(ws, n, t);
    threads.pool.run(&|_| {
        while let Some((m, rows)) = work.claim() {
            matmul_rows(ws[m], acts, &shared[m], rows);
        }
    });
}

/// One product of a [`matmul_grouped`] call: matrix `w` times the call's activation rows
/// `tokens`, into the same rows of output `out` (which is `(rows, w.rows)`).
pub struct Job<'m, 'a> {
    pub w: &'m Matrix<'a>,
    pub tokens: Range<usize>,
    pub out: usize,
}

/// Products of different matrices with different consecutive rows of `acts` (each expert of a
/// mixture with the tokens routed to it) in one hand-off to the threads, which claim pieces of
/// whole groups of rows as they go. Each output element is the dot product [`matmul`] computes
/// for that row and token, whatever the other jobs hold (G1) and whichever thread takes it (D1).
pub fn matmul_grouped(jobs: &[Job], acts: &Acts, outs: &mut [&mut [f32]], threads: &Threads) {
    let shared: Vec<SharedOut> = outs
        .iter_mut()
        .map(|o| SharedOut(o.as_mut_ptr(), o.len()))
        .collect();
    // Each output's jobs in order of their rows, none overlapping: no element written twice.
    let mut ends = vec![0; outs.len()];
    for j in jobs {
        assert_eq!(acts.ty, j.w.act, "activations quantized for another type");
        assert!(j.tokens.end <= acts.n, "the job's rows are the call's");
        assert!(j.out < outs.len() && j.tokens.end * j.w.rows <= shared[j.out].1);
        assert!(
            ends[j.out] <= j.tokens.start,
            "jobs overlap in their output"
        );
        ends[j.out] = j.tokens.end;
    }
    // About four pieces a thread in all, each a whole number of the kernels' row tiles.
    let per_job = (4 * threads.n()).div_ceil(jobs.len().max(1));
    let mut pieces = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let unit = if j.tokens.len() == 1 {
            GROUP
        } else {
            j.w.tile_rows().next_multiple_of(GROUP)
        };
        let size = j.w.rows.div_ceil(per_job).next_multiple_of(unit).max(unit);
        for r0 in (0..j.w.rows).step_by(size) {
            pieces.push((i, r0..(r0 + size).min(j.w.rows)));
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    threads.pool.run(&|_| {
        use std::sync::atomic::Ordering::Relaxed;
        while let Some((i, rows)) = pieces.get(next.fetch_add(1, Relaxed)) {
            let j = &jobs[*i];
            let base = j.tokens.start * j.w.rows;
            let (ptr, len) = (shared[j.out].0, shared[j.out].1);
            // Rows `tokens` of the output: inside it (asserted above).
            let out = SharedOut(ptr.wrapping_add(base), len - base);
            matmul_rows(j.w, &acts.view(j.tokens.clone()), &out, rows.clone());
        }
    });
}

/// Below this many weight bytes a thread, a one-token product is split into equal shares
/// instead of [`Claims`]: it takes a few tens of microseconds, and the claims cost more than
/// the imbalance they remove. Each claim starts a new run of rows, whose first lines come
/// before the prefetchers have caught up, and a small product ends in many small claims: with
/// a share each, a small model's decode and a larger one's attention products ran faster
/// (measurements: docs/perf-log.md, "One-token products in equal shares"). Larger products
/// keep the claims, which let a thread the machine slows take fewer pieces.
const STATIC_BELOW: usize = 4 << 20;

/// The rows of a [`matmul_many`] call, handed to the threads in pieces as they ask
/// (guided self-scheduling): each claim takes a share of what is left of its matrix, large
/// at first (a long run of rows, which the prefetchers stream best) and smaller towards the
/// end, down to a floor. A thread slowed by the machine (an interrupt, a neighbour on the
/// memory bus) takes fewer pieces instead of leaving the others waiting at the end: a static
/// split of equal shares left two threads waiting for each other for about a tenth of a
/// decode step. Which thread computes a row changes nothing in its bits (D1): each row is one
/// dot product per token whatever range it falls in, and every piece starts on a whole group
/// of [`GROUP`] rows, as the packed matrices and the kernels' row tiles want.
struct Claims<'w> {
    ws: &'w [&'w Matrix<'w>],
    /// The next unclaimed group, counted through the matrices in order.
    next: std::sync::atomic::AtomicUsize,
    /// Where each matrix's groups start in that count, and (at `ws.len()`) where the last ends.
    starts: [usize; MAX_MANY + 1],
    /// The smallest claim of each matrix, in groups.
    floor: [usize; MAX_MANY],
    threads: usize,
}

const MAX_MANY: usize = 4;
const GROUP: usize = synapse_quant::PACK_GROUP_ROWS;

/// The least weight bytes a claim covers at one token, so that each piece is a stream the
/// prefetchers reach full speed on (about sixteen rows of an 8192-column Q4_K matrix).
const MIN_CLAIM_BYTES: usize = 64 << 10;

impl<'w> Claims<'w> {
    fn new(ws: &'w [&'w Matrix<'w>], n_tokens: usize, threads: usize) -> Claims<'w> {
        let mut starts = [0; MAX_MANY + 1];
        let mut floor = [1; MAX_MANY];
        for (m, w) in ws.iter().enumerate() {
            let groups = w.rows.div_ceil(GROUP);
            starts[m + 1] = starts[m] + groups;
            let least = if n_tokens == 1 {
                MIN_CLAIM_BYTES.div_ceil(GROUP * w.row_bytes.max(1))
            } else {
                w.tile_rows() / GROUP
            };
            // A small matrix still ends in pieces that the threads share evenly.
            floor[m] = least.min(groups.div_ceil(2 * threads)).max(1);
        }
        Claims {
            ws,
            next: std::sync::atomic::AtomicUsize::new(0),
            starts,
            floor,
            threads,
        }
    }

    /// The next piece: a matrix and a range of its rows; `None` once every row is taken.
    fn claim(&self) -> Option<(usize, Range<usize>)> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut cur = self.next.load(Relaxed);
        loop {
            let m = (0..self.ws.len()).find(|&m| cur < self.starts[m + 1])?;
            let left = self.starts[m + 1] - cur;
            let take = (left / (2 * self.threads)).max(self.floor[m]).min(left);
            match self
                .next
                .compare_exchange_weak(cur, cur + take, Relaxed, Relaxed)
            {
                Ok(_) => {
                    let first = (cur - self.starts[m]) * GROUP;
                    let end = ((cur + take - self.starts[m]) * GROUP).min(self.ws[m].rows);
                    return Some((m, first..end));
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// Rows dotted with a chunk of tokens while they are hot in cache (prefill reads each weight
/// row once per tile and chunk, not once per token). Only the loop order: no effect on any
/// value.
const ROW_TILE: usize = 64;
const TOKEN_CHUNK: usize = 64;

/// Rows `rows` of `w` times every token of `acts`, into `out` (`(n_tokens, w.rows)`), which
/// no other thread writes those rows of.
fn matmul_rows(w: &Matrix, acts: &ActRows, out: &SharedOut, rows: Range<usize>) {
    let n = acts.n;
    // Each slice of `out` this thread writes: rows of `rows` only.
    let out_slice = |start: usize, len: usize| {
        assert!(start + len <= out.1);
        // SAFETY: the range lies inside `out` (asserted), and the rows `rows` belong to this
        // thread only, so no other thread touches these elements while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(out.0.add(start), len) }
    };
    let w_rows = |r0: usize, r1: usize| &w.data[r0 * w.row_bytes..r1 * w.row_bytes];
    // Whole groups of packed rows first (a thread's share starts on a group), then the rest
    // from the file's layout.
    let rows = match &w.packed {
        Some(p) if rows.start < p.rows() => {
            let end = rows.end.min(p.rows());
            matmul_packed(p, acts, &out_slice, w.rows, rows.start..end);
            end..rows.end
        }
        _ => rows,
    };
    if rows.is_empty() {
        return;
    }
    let (w_gemm1, gemv, row_bytes) = (w.gemm1, w.gemv, w.row_bytes);
    match w.gemm {
        // One token: the thread's rows are contiguous in `out`.
        _ if n == 1 => {
            let o = out_slice(rows.start, rows.len());
            let (w, a) = (w_rows(rows.start, rows.end), acts.row(0));
            match w_gemm1 {
                Some(gemm) => gemm(w, row_bytes, a, 1, o),
                None => gemv(w, row_bytes, a, o),
            }
            .expect("sizes agree by construction");
        }
        Some(gemm) => in_tiles(
            acts,
            &out_slice,
            w.rows,
            rows,
            w.tile_rows(),
            |r0, r1, a, nt, tile| gemm(w_rows(r0, r1), w.row_bytes, a, nt, tile),
        ),
        None => {
            for r0 in rows.clone().step_by(ROW_TILE) {
                let r1 = (r0 + ROW_TILE).min(rows.end);
                for t in 0..n {
                    let o = out_slice(t * w.rows + r0, r1 - r0);
                    (w.gemv)(w_rows(r0, r1), w.row_bytes, acts.row(t), o)
                        .expect("sizes agree by construction");
                }
            }
        }
    }
}

/// Packed rows `rows` of a matrix of `n_rows` rows times every token, into `out_slice(start,
/// len)` (the elements of `out`, `(n_tokens, n_rows)`, this thread writes).
fn matmul_packed<'o>(
    p: &PackedMatrix,
    acts: &ActRows,
    out_slice: &impl Fn(usize, usize) -> &'o mut [f32],
    n_rows: usize,
    rows: Range<usize>,
) {
    if acts.n == 1 {
        let o = out_slice(rows.start, rows.len());
        p.gemm(rows, acts.row(0), 1, o)
            .expect("sizes agree by construction");
        return;
    }
    in_tiles(
        acts,
        out_slice,
        n_rows,
        rows,
        p.tile_rows(),
        |r0, r1, a, nt, tile| p.gemm(r0..r1, a, nt, tile),
    );
}

/// Rows `rows` (of `n_rows`) times every token, tile by tile: `gemm(r0, r1, tokens' activation
/// rows, their count, tile)` fills a `(tokens, r1 - r0)` tile of at most `tile_rows` rows by
/// [`TOKEN_CHUNK`] tokens, copied into `out_slice`.
fn in_tiles<'o>(
    acts: &ActRows,
    out_slice: &impl Fn(usize, usize) -> &'o mut [f32],
    n_rows: usize,
    rows: Range<usize>,
    tile_rows: usize,
    gemm: impl Fn(usize, usize, &[u8], usize, &mut [f32]) -> Result<(), synapse_quant::QuantError>,
) {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let n = acts.n;
    BUF.with_borrow_mut(|buf| {
        buf.resize(buf.len().max(tile_rows * TOKEN_CHUNK), 0.0);
        for t0 in (0..n).step_by(TOKEN_CHUNK) {
            let nt = TOKEN_CHUNK.min(n - t0);
            let a = acts.rows(t0..t0 + nt);
            for r0 in rows.clone().step_by(tile_rows) {
                let r1 = (r0 + tile_rows).min(rows.end);
                let tile = &mut buf[..nt * (r1 - r0)];
                gemm(r0, r1, a, nt, tile).expect("sizes agree by construction");
                for (t, o) in tile.chunks_exact(r1 - r0).enumerate() {
                    out_slice((t0 + t) * n_rows + r0, r1 - r0).copy_from_slice(o);
                }
            }
        }
    });
}

/// Split `0..n` over threads: for per-head attention and other independent rows.
pub fn parallel_for(threads: &Threads, n: usize, f: impl Fn(Range<usize>) + Sync) {
    threads.split(n, f)
}

/// The `k`-th piece of an order for [`parallel_piece_runs_mut`]: which piece, what it costs
/// (in any unit, the same for all), and a key: consecutive pieces of one key may share a call.
#[derive(Clone, Copy)]
pub struct Piece {
    pub index: usize,
    pub cost: usize,
    pub key: usize,
}

/// Split `out` into `chunk`-long pieces, taken in the order `order` (`order(k)`: the `k`-th
/// piece; a permutation of the pieces), and hand each thread one contiguous run of that order,
/// the runs of near-equal total cost. A thread computes its run in calls `f(pieces)` (`(index,
/// piece)` each) of up to `group` consecutive pieces of one key (scratch that outlives a call
/// is the caller's to keep, per thread: attention's is thread-local). For attention, where a
/// call's heads share the rows they read when they share a key (a KV head), and a thread's
/// run keeps its KV heads few. Each
/// piece is written by one call only, and `f` must compute each piece the same whatever the
/// others in its call, so that the result does not depend on the thread count (D1).
pub fn parallel_piece_runs_mut(
    threads: &Threads,
    out: &mut [f32],
    chunk: usize,
    group: usize,
    order: impl Fn(usize) -> Piece,
    f: impl Fn(&mut [(usize, &mut [f32])]) + Sync,
) {
    let n = out.len() / chunk.max(1);
    let t = threads.n().min(n.max(1));
    let group = group.max(1);
    // Every piece once (what makes the slices below disjoint), and where each run starts:
    // thread `i`'s at the first piece before which the cost reaches `i / t` of the total.
    let pieces: Vec<Piece> = (0..n).map(order).collect();
    let mut seen = vec![false; n];
    let mut before = Vec::with_capacity(n + 1);
    before.push(0usize);
    for (k, p) in pieces.iter().enumerate() {
        assert!(
            p.index < n && !seen[p.index],
            "`order` must be a permutation of the pieces"
        );
        seen[p.index] = true;
        before.push(before[k] + p.cost);
    }
    let total = before[n];
    let starts: Vec<usize> = (0..=t)
        .map(|i| match i {
            0 => 0,
            i if i == t => n,
            i => before.partition_point(|&c| c * t < i * total).min(n),
        })
        .collect();
    let shared = SharedOut(out.as_mut_ptr(), n * chunk);
    let thread = |i: usize| {
        // A pool larger than the piece count: threads `t..` have no run.
        let (Some(&first), Some(&end)) = (starts.get(i), starts.get(i + 1)) else {
            return;
        };
        let shared = &shared;
        let mut call = Vec::with_capacity(group);
        let mut key = None;
        for p in &pieces[first..end] {
            if call.len() == group || key.is_some_and(|key| key != p.key) {
                f(&mut call);
                call.clear();
            }
            key = Some(p.key);
            // SAFETY: piece `p.index < n` lies inside `out` (n * chunk <= out.len()); `order`
            // is a permutation (checked above) and the threads' runs are disjoint, so no other
            // slice covers it while this one lives.
            let piece =
                unsafe { std::slice::from_raw_parts_mut(shared.0.add(p.index * chunk), chunk) };
            call.push((p.index, piece));
        }
        if !call.is_empty() {
            f(&mut call);
        }
    };
    if t == 1 {
        thread(0);
    } else {
        threads.pool.run(&thread);
    }
}

/// Split `out` into `chunk`-long pieces and hand each thread a contiguous run of them:
/// `f(first, run)`, where `run` holds pieces `first..` back to back. Each piece is written by one
/// call only, so the result does not depend on the thread count (D1); per-run set-up (scratch
/// buffers) is paid once per thread, not once per piece.
pub fn parallel_chunks_mut(
    threads: &Threads,
    out: &mut [f32],
    chunk: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    let n = out.len() / chunk.max(1);
    let shared = SharedOut(out.as_mut_ptr(), n * chunk);
    threads.split(n, |pieces| {
        let shared = &shared;
        // SAFETY: pieces `pieces` lie inside `out` (end <= n, n * chunk <= out.len()), and the
        // ranges `split` hands out are disjoint, so no other call touches these elements while
        // the slice lives.
        let run = unsafe {
            std::slice::from_raw_parts_mut(shared.0.add(pieces.start * chunk), pieces.len() * chunk)
        };
        f(pieces.start, run);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use synapse_gguf::TensorInfo;

    /// `n` states of a 64-bit LCG after `seed` (its top bits are the random ones).
    fn lcg(n: usize, seed: u64) -> impl Iterator<Item = u64> {
        (0..n).scan(seed, |s, _| {
            *s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            Some(*s)
        })
    }

    /// Values in -1..1 from a fixed sequence.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        lcg(n, seed)
            .map(|s| (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    /// `n` values' worth of random blocks of `ty` whose f16 scales are finite and moderate
    /// (random bits would make some NaN).
    fn random_blocks(ty: GgmlType, n: usize, seed: u64) -> Vec<u8> {
        let scales: &[usize] = match ty {
            GgmlType::Q4_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            GgmlType::Q8_0 => &[0],
            _ => unreachable!("{ty}"),
        };
        let bytes = ty.bytes_for(n as u64).unwrap() as usize;
        let mut w: Vec<u8> = lcg(bytes, seed).map(|s| (s >> 56) as u8).collect();
        for (i, b) in w.chunks_exact_mut(ty.block_bytes()).enumerate() {
            for &at in scales {
                // Exponents 10..14: magnitudes 2^-5 to 2^-1.
                let bits = (((10 + i % 5) << 10) | ((i * 37) % 1024)) as u16;
                b[at..at + 2].copy_from_slice(&bits.to_le_bytes());
            }
        }
        w
    }

    /// `out` for `n` tokens of `x` through [`matmul_many`] on `threads` threads.
    fn product(ws: &[&Matrix], x: &[f32], n: usize, threads: usize) -> Vec<Vec<f32>> {
        let cols = ws[0].cols;
        let mut acts = Acts::with_capacity(n, cols);
        let threads = Threads::new(threads);
        acts.quantize(ws[0].act_type(), &x[..n * cols], cols, &threads);
        let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; n * w.rows]).collect();
        let mut views: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        matmul_many(ws, &acts, &mut views, &threads);
        outs
    }

    /// D1 and G1 through the thread hand-out: one token and batches give every row the same
    /// bits on 1 to 64 threads (far more than this machine's cores), whether the rows are
    /// claimed in pieces (a matrix large enough, a row count that is not a whole number of
    /// groups) or split in equal shares (a small matrix in the same call).
    #[test]
    fn every_thread_count_and_batch_gives_the_same_bits() {
        let cols = 1024;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
            // Enough rows that four threads' equal shares would pass `STATIC_BELOW`.
            let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
            let big = (4 * STATIC_BELOW).div_ceil(row_bytes).next_multiple_of(16) + 5;
            let shapes = [(big, 1), (16 * 3 + 7, 2)];
            let data: Vec<Vec<u8>> = shapes
                .iter()
                .map(|&(rows, seed)| random_blocks(ty, rows * cols / 256 * 256, seed))
                .collect();
            let infos: Vec<TensorInfo> = shapes
                .iter()
                .zip(&data)
                .map(|(&(rows, _), d)| TensorInfo {
                    name: "w".into(),
                    ggml_type: ty,
                    shape: vec![cols as u64, rows as u64],
                    offset: 0,
                    size: d.len() as u64,
                })
                .collect();
            let big_bytes = data[0].len();
            let matrices: Vec<Matrix> = infos
                .iter()
                .zip(&data)
                .map(|(info, d)| {
                    let view = TensorView { info, data: d };
                    Matrix::new(view, cols, None)
                        .unwrap()
                        .pack("w", &|_| {})
                        .unwrap()
                })
                .collect();
            // The large matrix is claimed in pieces at one token on every thread count.
            assert!(big_bytes + data[1].len() >= 4 * STATIC_BELOW);
            let ws: Vec<&Matrix> = matrices.iter().collect();
            let x = values(70 * cols, 3);
            let one: Vec<Vec<f32>> = (0..70)
                .map(|t| product(&ws, &x[t * cols..], 1, 1).concat())
                .collect();
            for threads in [1, 2, 3, 4, 5, 8, 13, 32, 64] {
                for t in [0, 69] {
                    let got = product(&ws, &x[t * cols..], 1, threads).concat();
                    assert!(got == one[t], "{ty:?}: token {t}, {threads} threads");
                }
                for n in [7, 70] {
                    let got = product(&ws, &x, n, threads);
                    for (t, want) in one.iter().take(n).enumerate() {
                        let row: Vec<f32> = got
                            .iter()
                            .zip(&ws)
                            .flat_map(|(o, w)| o[t * w.rows..(t + 1) * w.rows].to_vec())
                            .collect();
                        assert!(
                            row == *want,
                            "{ty:?}: batch {n}, token {t}, {threads} threads"
                        );
                    }
                }
            }
        }
    }

    /// [`parallel_piece_runs_mut`]: every piece once, in calls of at most `group` pieces of
    /// one key, each thread's pieces one run of the order, the runs' costs near equal.
    #[test]
    fn piece_runs_cover_every_piece_once_in_runs_of_equal_cost() {
        use std::sync::Mutex;
        // More threads than pieces too (a 9-head model on a 64-core machine), and no pieces.
        for (n, threads, group) in [
            (9, 1, 4),
            (9, 2, 4),
            (9, 3, 3),
            (64 * 9, 2, 4),
            (5, 4, 2),
            (9, 10, 1),
            (3, 64, 2),
            (0, 5, 1),
        ] {
            // Pieces in reverse (a permutation), costs 1..=n (as a causal batch's), keys of 3.
            let order = |k: usize| Piece {
                index: n - 1 - k,
                cost: k + 1,
                key: k / 3,
            };
            let mut out = vec![0.0f32; n * 2];
            // Each call's order positions, under the thread that made it.
            let calls = Mutex::new(Vec::new());
            let pool = Threads::new(threads);
            parallel_piece_runs_mut(&pool, &mut out, 2, group, order, |pieces| {
                for (u, piece) in pieces.iter_mut() {
                    piece.fill(*u as f32 + 1.0);
                }
                let ks: Vec<usize> = pieces.iter().map(|(u, _)| n - 1 - u).collect();
                calls
                    .lock()
                    .unwrap()
                    .push((std::thread::current().id(), ks));
            });
            // Every piece written, by its own index.
            for (u, piece) in out.chunks_exact(2).enumerate() {
                assert_eq!(piece, [u as f32 + 1.0; 2], "piece {u} of {n}");
            }
            let calls = calls.into_inner().unwrap();
            let mut ks: Vec<usize> = calls.iter().flat_map(|(_, c)| c).copied().collect();
            ks.sort();
            assert_eq!(ks, (0..n).collect::<Vec<_>>(), "each piece in one call");
            for (_, c) in &calls {
                assert!(!c.is_empty() && c.len() <= group, "{c:?}");
                assert!(c.windows(2).all(|w| w[1] == w[0] + 1), "consecutive {c:?}");
                assert!(c.iter().all(|&k| k / 3 == c[0] / 3), "one key {c:?}");
            }
            // Each thread's pieces are one run of the order, and the thread that got the most
            // carries within a piece of a fair share.
            let total: usize = (1..=n).sum();
            let mut most = 0;
            let mut ids = Vec::new();
            for (id, _) in &calls {
                if !ids.contains(id) {
                    ids.push(*id);
                }
            }
            for id in ids {
                let mut run: Vec<usize> = calls
                    .iter()
                    .filter(|(i, _)| *i == id)
                    .flat_map(|(_, c)| c)
                    .copied()
                    .collect();
                run.sort();
                assert!(run.windows(2).all(|w| w[1] == w[0] + 1), "one run {run:?}");
                most = most.max(run.iter().map(|k| k + 1).sum::<usize>());
            }
            if threads > 1 && n > threads {
                assert!(
                    most <= total / threads + n,
                    "{most} of {total} ({threads} threads)"
                );
            }
        }
    }
}
