//! The KV cache: each layer's keys and values for every position so far, in F16 as llama.cpp
//! keeps them, in room that grows with the positions (below) up to the context.
//!
//! Laid out KV head by KV head: one KV head's rows of every position are consecutive, so that
//! attention, which reads one KV head's rows for a query head, streams them (a decode step at a
//! few thousand positions reads them from memory) instead of picking `head_dim` values out of
//! every `n_head_kv * head_dim`.
//!
//! Each of the two arrays lies in transparent huge pages where the system gives them
//! ([`synapse_quant::pages`], as the packed weights): a decode step at depth streams every
//! layer's rows, and 4 KiB pages cost a page walk each and stop the hardware's prefetchers.
//!
//! The arrays hold room for [`INITIAL_POSITIONS`] at first and double, rows copied, when a
//! position past them is stored, up to the context. Allocated whole for the context, the
//! first token's rows touched every KV head's pages, and with huge pages that is the whole
//! cache: on a VM whose hypervisor makes the first touch of memory slow, a short prompt then
//! took several times as long at a large context (measurements: docs/perf-log.md, "The KV
//! cache and attention").

use half::f16;
use half::slice::HalfFloatSliceExt;
use synapse_quant::pages::Pages;

pub struct KvCache {
    n_ctx: usize,
    /// Positions the arrays have room for (at most `n_ctx`).
    cap: usize,
    n_layer: usize,
    n_head_kv: usize,
    head_dim: usize,
    /// `(n_layer, n_head_kv, cap, head_dim)` each.
    k: Halves,
    v: Halves,
}

/// Positions a new cache has room for (fewer if its context is smaller).
pub const INITIAL_POSITIONS: usize = 256;

/// One of the cache's two arrays of F16: in huge pages, or a plain allocation where the system
/// would not map them.
enum Halves {
    Pages(Pages),
    Vec(Vec<f16>),
}

impl Halves {
    fn zeroed(len: usize) -> Halves {
        Self::try_zeroed(len).expect("a KV cache's first room (reserved with its state)")
    }

    /// `len` zeros, or `None` where the system will not give the memory.
    fn try_zeroed(len: usize) -> Option<Halves> {
        if let Ok(p) = Pages::zeroed(len.checked_mul(size_of::<f16>())?) {
            return Some(Halves::Pages(p));
        }
        let mut v = Vec::new();
        v.try_reserve_exact(len).ok()?;
        v.resize(len, f16::ZERO);
        Some(Halves::Vec(v))
    }
}

impl std::ops::Deref for Halves {
    type Target = [f16];
    fn deref(&self) -> &[f16] {
        match self {
            Halves::Pages(p) => bytemuck::cast_slice(p.as_slice()),
            Halves::Vec(v) => v,
        }
    }
}

impl std::ops::DerefMut for Halves {
    fn deref_mut(&mut self) -> &mut [f16] {
        match self {
            Halves::Pages(p) => bytemuck::cast_slice_mut(p.as_mut_slice()),
            Halves::Vec(v) => v,
        }
    }
}

/// Keys and values of the positions `first..first + n_pos` of one layer: KV head `g`'s row of
/// position `first + j` at `g * head + j * head_dim` of each slice.
#[derive(Clone, Copy)]
pub struct LayerRows<'a> {
    pub keys: &'a [f16],
    pub values: &'a [f16],
    /// Values from one KV head's rows to the next's.
    pub head: usize,
    pub n_pos: usize,
}

impl<'a> LayerRows<'a> {
    /// The rows of KV head `g` (`(n_pos, head_dim)`): keys, then values.
    pub fn head_rows(&self, g: usize, head_dim: usize) -> (&'a [f16], &'a [f16]) {
        let (at, len) = (g * self.head, self.n_pos * head_dim);
        (&self.keys[at..][..len], &self.values[at..][..len])
    }
}

impl KvCache {
    pub fn new(n_layer: usize, n_ctx: usize, n_head_kv: usize, head_dim: usize) -> KvCache {
        Self::with_room(n_layer, n_ctx, n_head_kv, head_dim, INITIAL_POSITIONS)
    }

    /// Positions a new cache for a context of `n_ctx` has room for.
    pub fn initial_room(n_ctx: usize) -> usize {
        INITIAL_POSITIONS.clamp(1, n_ctx.max(1))
    }

    /// The bytes of the keys and values of `positions` positions, or `None` where that
    /// overflows a `usize`: what a state checks before it makes a cache (whose own arithmetic,
    /// up to the context, is then known not to overflow).
    pub fn bytes(
        n_layer: usize,
        positions: usize,
        n_head_kv: usize,
        head_dim: usize,
    ) -> Option<usize> {
        [n_layer, positions, n_head_kv, head_dim]
            .into_iter()
            .try_fold(2 * size_of::<f16>(), |a, d| a.checked_mul(d))
    }

    /// [`KvCache::new`] with room for `room` positions at first.
    fn with_room(
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        head_dim: usize,
        room: usize,
    ) -> KvCache {
        let cap = room.clamp(1, n_ctx.max(1));
        let len = n_layer * n_head_kv * cap * head_dim;
        KvCache {
            n_ctx,
            cap,
            n_layer,
            n_head_kv,
            head_dim,
            k: Halves::zeroed(len),
            v: Halves::zeroed(len),
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Where KV head `g`'s row of position `pos` of a layer starts.
    fn at(&self, layer: usize, g: usize, pos: usize) -> usize {
        ((layer * self.n_head_kv + g) * self.cap + pos) * self.head_dim
    }

    /// Room for positions `..end` (at most the context), made before a pass stores them: the
    /// arrays at least doubled, every KV head's rows copied to their new place (the same bits;
    /// only where they lie changes). `Err` with the bytes asked for where the system will not
    /// give them; the cache is then as it was.
    pub fn make_room(&mut self, end: usize) -> Result<(), usize> {
        if end <= self.cap {
            return Ok(());
        }
        let cap = (2 * self.cap).max(end).min(self.n_ctx);
        let (old, hd) = (self.cap, self.head_dim);
        let len = self.n_layer * self.n_head_kv * cap * hd;
        let (Some(mut k), Some(mut v)) = (Halves::try_zeroed(len), Halves::try_zeroed(len)) else {
            return Err(2 * len * size_of::<f16>());
        };
        for (new, half) in [(&mut k, &self.k), (&mut v, &self.v)] {
            for (to, from) in new
                .chunks_exact_mut(cap * hd)
                .zip(half.chunks_exact(old * hd))
            {
                to[..old * hd].copy_from_slice(from);
            }
        }
        (self.k, self.v) = (k, v);
        self.cap = cap;
        Ok(())
    }

    /// Take `other`'s keys and values of positions `..n` (a prefix two sequences share): the
    /// same bits the positions' tokens would store. `Err` as [`KvCache::make_room`]'s.
    pub fn copy_prefix(&mut self, other: &KvCache, n: usize) -> Result<(), usize> {
        assert!(
            (self.n_layer, self.n_head_kv, self.head_dim)
                == (other.n_layer, other.n_head_kv, other.head_dim)
                && n <= other.cap.min(self.n_ctx),
            "a KV prefix between caches of other shapes"
        );
        self.make_room(n)?;
        let hd = self.head_dim;
        for layer in 0..self.n_layer {
            for g in 0..self.n_head_kv {
                let (to, from) = (self.at(layer, g, 0), other.at(layer, g, 0));
                self.k[to..to + n * hd].copy_from_slice(&other.k[from..from + n * hd]);
                self.v[to..to + n * hd].copy_from_slice(&other.v[from..from + n * hd]);
            }
        }
        Ok(())
    }

    /// Store one position's keys and values (`n_head_kv * head_dim` each, rounded to F16).
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        assert!(
            pos < self.n_ctx,
            "position {pos} past the context of {}",
            self.n_ctx
        );
        assert!(pos < self.cap, "position {pos}: no room made for it");
        let hd = self.head_dim;
        for g in 0..self.n_head_kv {
            let i = self.at(layer, g, pos);
            self.k[i..i + hd].convert_from_f32_slice(&k[g * hd..][..hd]);
            self.v[i..i + hd].convert_from_f32_slice(&v[g * hd..][..hd]);
        }
    }

    /// Keys of KV head `g` of a layer at positions `0..n`: `(n, head_dim)`.
    pub fn keys(&self, layer: usize, g: usize, n: usize) -> &[f16] {
        assert!(n <= self.cap, "{n} positions of {}", self.cap);
        let i = self.at(layer, g, 0);
        &self.k[i..i + n * self.head_dim]
    }

    /// Values of KV head `g` of a layer at positions `0..n`: `(n, head_dim)`.
    pub fn values(&self, layer: usize, g: usize, n: usize) -> &[f16] {
        assert!(n <= self.cap, "{n} positions of {}", self.cap);
        let i = self.at(layer, g, 0);
        &self.v[i..i + n * self.head_dim]
    }

    /// Every KV head's keys and values of a layer at positions `first..n` (`n` at most the
    /// positions stored so far, or the room there is).
    pub fn layer_rows(&self, layer: usize, first: usize, n: usize) -> LayerRows<'_> {
        assert!(
            first <= n && n <= self.cap,
            "positions {first}..{n} of {}",
            self.cap
        );
        let (i, head) = (self.at(layer, 0, first), self.cap * self.head_dim);
        let len = (self.n_head_kv.max(1) - 1) * head + (n - first) * self.head_dim;
        LayerRows {
            keys: &self.k[i..i + len],
            values: &self.v[i..i + len],
            head,
            n_pos: n - first,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each KV head's values land in its own rows, and every accessor reads them back, with
    /// room for every position from the start and with the arrays grown as positions come
    /// (room for one, then 2, 4, 5).
    #[test]
    fn rows_are_kept_head_by_head() {
        for room in [INITIAL_POSITIONS, 1] {
            rows_are_kept_with_room(room);
        }
    }

    fn rows_are_kept_with_room(room: usize) {
        let (n_layer, n_ctx, n_head_kv, hd) = (2, 5, 3, 4);
        let mut kv = KvCache::with_room(n_layer, n_ctx, n_head_kv, hd, room);
        // Value `e` of KV head `g` at position `p` of layer `l`, exact in F16.
        let val = |l: usize, p: usize, g: usize, e: usize, v: bool| {
            (((l * 8 + p) * 4 + g) * 4 + e) as f32 * if v { -1.0 } else { 1.0 }
        };
        for p in 0..n_ctx {
            kv.make_room(p + 1).unwrap();
            for l in 0..n_layer {
                let row = |v| -> Vec<f32> {
                    (0..n_head_kv * hd)
                        .map(|i| val(l, p, i / hd, i % hd, v))
                        .collect()
                };
                kv.store(l, p, &row(false), &row(true));
            }
        }
        assert_eq!(kv.cap, n_ctx, "room {room}");
        for l in 0..n_layer {
            let rows = kv.layer_rows(l, 1, 4);
            assert_eq!(rows.n_pos, 3);
            for g in 0..n_head_kv {
                let (k, v) = (kv.keys(l, g, 4), kv.values(l, g, 4));
                let (rk, rv) = rows.head_rows(g, hd);
                for p in 0..4 {
                    for e in 0..hd {
                        assert_eq!(k[p * hd + e].to_f32(), val(l, p, g, e, false));
                        assert_eq!(v[p * hd + e].to_f32(), val(l, p, g, e, true));
                        if p >= 1 {
                            assert_eq!(rk[(p - 1) * hd + e].to_f32(), val(l, p, g, e, false));
                            assert_eq!(rv[(p - 1) * hd + e].to_f32(), val(l, p, g, e, true));
                        }
                    }
                }
            }
        }
    }
}
