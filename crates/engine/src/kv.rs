//! The KV cache: each layer's keys and values for every position so far, in F16 as llama.cpp
//! keeps them. Allocated once for the whole context.

use half::f16;
use half::slice::HalfFloatSliceExt;

pub struct KvCache {
    n_ctx: usize,
    /// Width of one position's keys (or values) in one layer: `n_head_kv * head_dim`.
    kv_dim: usize,
    /// `(n_layer, n_ctx, kv_dim)` each.
    k: Vec<f16>,
    v: Vec<f16>,
}

impl KvCache {
    pub fn new(n_layer: usize, n_ctx: usize, kv_dim: usize) -> KvCache {
        KvCache {
            n_ctx,
            kv_dim,
            k: vec![f16::ZERO; n_layer * n_ctx * kv_dim],
            v: vec![f16::ZERO; n_layer * n_ctx * kv_dim],
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn at(&self, layer: usize, pos: usize) -> usize {
        (layer * self.n_ctx + pos) * self.kv_dim
    }

    /// Store one position's keys and values (rounded to F16).
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let i = self.at(layer, pos);
        self.k[i..i + self.kv_dim].convert_from_f32_slice(&k[..self.kv_dim]);
        self.v[i..i + self.kv_dim].convert_from_f32_slice(&v[..self.kv_dim]);
    }

    /// Keys of positions `0..n` of a layer: `(n, kv_dim)`.
    pub fn keys(&self, layer: usize, n: usize) -> &[f16] {
        let i = self.at(layer, 0);
        &self.k[i..i + n * self.kv_dim]
    }

    /// Values of positions `0..n` of a layer: `(n, kv_dim)`.
    pub fn values(&self, layer: usize, n: usize) -> &[f16] {
        let i = self.at(layer, 0);
        &self.v[i..i + n * self.kv_dim]
    }
}
