//! Choosing the next token from logits: greedy, or llama.cpp's default chain
//! (repetition penalty, top-k, top-p, min-p, temperature, then a draw from a seeded RNG).

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// 0 (or less) means greedy: always the most likely token.
    pub temp: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens; 1 is off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted from the logit of each token seen in that window (OpenAI's
    /// `presence_penalty`); 0 is off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it is seen in that window; 0 is off.
    pub frequency_penalty: f32,
    /// Added to these tokens' logits before anything else (`-inf`: never drawn).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplerConfig {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig {
            temp: 0.0,
            ..Self::default()
        }
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: StdRng,
    recent: VecDeque<u32>,
    /// (token, logit) candidates and their probabilities, allocated once for the vocabulary.
    cand: Vec<(u32, f32)>,
    probs: Vec<f64>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig, n_vocab: usize) -> Sampler {
        Sampler {
            rng: StdRng::seed_from_u64(cfg.seed),
            // A hint only: the window grows as tokens come, whatever `repeat_last_n` asks.
            recent: VecDeque::with_capacity(cfg.repeat_last_n.min(1 << 12) + 1),
            cand: Vec::with_capacity(n_vocab),
            probs: Vec::with_capacity(n_vocab),
            cfg,
        }
    }

    /// A copy that draws what this one would draw next, and after, from the same logits (its
    /// configuration, random stream and penalty window; not its buffers): a draft model's
    /// sampler, run ahead of the target's.
    pub fn fork(&self) -> Sampler {
        Sampler {
            cfg: self.cfg.clone(),
            rng: self.rng.clone(),
            recent: self.recent.clone(),
            cand: Vec::with_capacity(self.cand.capacity()),
            probs: Vec::with_capacity(self.probs.capacity()),
        }
    }

    /// Record a token of the sequence (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.cfg.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Pick the next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let c = &self.cfg;
        let plain = c.repeat_penalty == 1.0
            && c.presence_penalty == 0.0
            && c.frequency_penalty == 0.0
            && c.logit_bias.is_empty();
        if c.temp <= 0.0 && plain {
            // The logits themselves, without the candidates' copy of the vocabulary (a
            // megabyte a token for Llama 3's).
            return argmax(logits.iter().copied()) as u32;
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        for &(t, b) in &self.cfg.logit_bias {
            if let Some(c) = self.cand.get_mut(t as usize) {
                c.1 += b;
            }
        }
        let c = &self.cfg;
        if c.repeat_penalty != 1.0 || c.presence_penalty != 0.0 || c.frequency_penalty != 0.0 {
            for (i, &t) in self.recent.iter().enumerate() {
                // Each distinct token once, with the times it was seen.
                if self.recent.iter().take(i).any(|&u| u == t) {
                    continue;
                }
                let seen = self.recent.iter().skip(i).filter(|&&u| u == t).count() as f32;
                if let Some(l) = self.cand.get_mut(t as usize).map(|c| &mut c.1) {
                    *l = if *l > 0.0 {
                        *l / c.repeat_penalty
                    } else {
                        *l * c.repeat_penalty
                    };
                    *l -= seen * c.frequency_penalty + c.presence_penalty;
                }
            }
        }
        if self.cfg.temp <= 0.0 {
            // The candidates are the whole vocabulary in id order here.
            return argmax(self.cand.iter().map(|c| c.1)) as u32;
        }
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if self.cfg.top_k > 0 && self.cfg.top_k < self.cand.len() {
            self.cand
                .select_nth_unstable_by(self.cfg.top_k - 1, by_logit);
            self.cand.truncate(self.cfg.top_k);
        }
        self.cand.sort_unstable_by(by_logit);
        if self.cfg.top_p < 1.0 {
            softmax(&self.cand, &mut self.probs);
            let mut cum = 0.0;
            let mut keep = self.cand.len();
            for (i, p) in self.probs.iter().enumerate() {
                cum += p;
                if cum >= self.cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        if self.cfg.min_p > 0.0 {
            let floor = self.cand[0].1 + self.cfg.min_p.ln();
            let keep = self.cand.iter().take_while(|c| c.1 >= floor).count();
            self.cand.truncate(keep.max(1));
        }
        for c in &mut self.cand {
            c.1 /= self.cfg.temp;
        }
        softmax(&self.cand, &mut self.probs);
        let r: f64 = self.rng.gen();
        let mut cum = 0.0;
        for (c, p) in self.cand.iter().zip(&self.probs) {
            cum += p;
            if r < cum {
                return c.0;
            }
        }
        self.cand.last().map_or(0, |c| c.0)
    }
}

/// The index of the largest value (the first of equals; 0 for none).
fn argmax(values: impl Iterator<Item = f32>) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if i == 0 || v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

/// Probabilities of the candidates, into `probs` (reused: no allocation per token).
fn softmax(cand: &[(u32, f32)], probs: &mut Vec<f64>) {
    let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
    probs.clear();
    probs.extend(cand.iter().map(|c| ((c.1 - max) as f64).exp()));
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, -1.0, 2.5, 0.0]
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy(), 6);
        assert_eq!(s.sample(&logits()), 1);
    }

    #[test]
    fn repeat_penalty_can_move_the_argmax() {
        let mut s = Sampler::new(
            SamplerConfig {
                repeat_penalty: 2.0,
                ..SamplerConfig::greedy()
            },
            6,
        );
        s.accept(1);
        s.accept(1);
        assert_eq!(s.sample(&logits()), 4); // 3.0 / 2 = 1.5 < 2.5
    }

    #[test]
    fn top_k_1_is_greedy_and_seeds_reproduce() {
        let cfg = SamplerConfig {
            top_k: 1,
            temp: 1.0,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg, 6);
        for _ in 0..20 {
            assert_eq!(s.sample(&logits()), 1);
        }
        let cfg = SamplerConfig {
            temp: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let draw = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone(), 6);
            (0..50).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        let a = draw(&cfg);
        assert_eq!(a, draw(&cfg));
        assert!(
            a.iter().collect::<std::collections::HashSet<_>>().len() > 2,
            "{a:?}"
        );
        assert_ne!(a, draw(&SamplerConfig { seed: 8, ..cfg }));
    }

    #[test]
    fn presence_frequency_and_bias_move_the_argmax() {
        let greedy = |cfg: SamplerConfig, seen: &[u32]| {
            let mut s = Sampler::new(cfg, 6);
            seen.iter().for_each(|&t| s.accept(t));
            s.sample(&logits())
        };
        let g = SamplerConfig::greedy;
        // Token 1 (3.0) seen twice: frequency 0.3 takes 0.6 (2.4 < 2.5), presence 0.4 once.
        let freq = |f| SamplerConfig {
            frequency_penalty: f,
            ..g()
        };
        assert_eq!(greedy(freq(0.3), &[1, 1]), 4);
        assert_eq!(greedy(freq(0.3), &[1]), 1);
        let pres = SamplerConfig {
            presence_penalty: 0.6,
            ..g()
        };
        assert_eq!(greedy(pres, &[1, 1, 1]), 4);
        let bias = SamplerConfig {
            logit_bias: vec![(1, f32::NEG_INFINITY), (99, 5.0)],
            ..g()
        };
        assert_eq!(greedy(bias, &[]), 4);
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // min_p 0.5: only tokens with p >= p_max / 2, i.e. logit >= 3 - ln 2: tokens 1 and 4.
        let cfg = SamplerConfig {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            temp: 1.0,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg, 6);
        for _ in 0..100 {
            assert!([1, 4].contains(&s.sample(&logits())));
        }
        // top_p tiny: only the most likely token.
        let cfg = SamplerConfig {
            top_k: 0,
            top_p: 0.01,
            min_p: 0.0,
            temp: 1.0,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg, 6);
        for _ in 0..100 {
            assert_eq!(s.sample(&logits()), 1);
        }
    }
}
