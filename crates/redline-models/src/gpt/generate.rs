//! Autoregressive generation with a key/value cache, as nanoGPT's
//! `generate` draws tokens and transformers' `generate` caches: the prompt
//! runs once through the model, then each new token alone, attending to
//! the keys and values kept from before. When the context fills
//! `block_size`, it is cropped to its last `block_size` tokens and run
//! afresh (the learned positions shift), as nanoGPT crops `idx_cond`.

use candle_core::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Gpt;
use crate::error::{Error, Result};

/// How the next token is drawn from the logits.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Logits are divided by it; 0 takes the most likely token (greedy).
    pub temperature: f64,
    /// Only the `k` most likely tokens are drawn from (ties at the k-th
    /// value kept, as nanoGPT's `logits < v[:, [-1]]`).
    pub top_k: Option<usize>,
    /// Seed of the draws.
    pub seed: u64,
}

impl Sampling {
    /// Refuses a temperature that is negative or not a number, and
    /// `top_k = 0`.
    pub fn check(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::Config(format!(
                "temperature {}: give 0 (greedy) or a positive number (1 samples the model's \
                 distribution)",
                self.temperature
            )));
        }
        if self.top_k == Some(0) {
            return Err(Error::Config(
                "top-k 0 leaves no token to draw\nHINT: give at least 1, or leave it out to draw \
                 from all tokens"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The keys and values of the tokens run so far, per block.
pub struct KvCache {
    kv: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Gpt {
    /// An empty cache for this model.
    pub fn cache(&self) -> KvCache {
        KvCache {
            kv: vec![None; self.blocks.len()],
            len: 0,
        }
    }

    /// Runs `ids` (one sequence) after the tokens `cache` holds, adding
    /// theirs to it: the logits `(vocab,)` (fp32) of the next token after
    /// the last id.
    pub fn forward_cached(&self, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let (start, t, c) = (cache.len, ids.len(), self.cfg.n_embd);
        if t == 0 {
            return Err(Error::Config("generation needs at least one token".into()));
        }
        if start + t > self.cfg.block_size {
            return Err(Error::Config(format!(
                "gpt: {start} cached and {t} new tokens are more than block_size {}",
                self.cfg.block_size
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(Error::Config(format!(
                "token id {bad} is outside the model's vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let ids = Tensor::new(ids, self.wte.as_tensor().device())?;
        let mut h = self.embed(&ids, (1, t), start)?;
        for (blk, kv) in self.blocks.iter().zip(cache.kv.iter_mut()) {
            h = self.block(blk, h, false, Some(kv))?;
        }
        cache.len += t;
        // Only the last position's logits are needed.
        let last = h.narrow(1, t - 1, 1)?.reshape((1, c))?;
        Ok(self.head(&last)?.reshape(self.cfg.vocab_size)?)
    }

    /// Draws `tokens` tokens after `prompt` (at most its last `block_size`
    /// ids are seen), calling `each` with every one as it is drawn; the
    /// drawn ids.
    pub fn generate(
        &self,
        prompt: &[u32],
        tokens: usize,
        sampling: &Sampling,
        mut each: impl FnMut(u32) -> Result<()>,
    ) -> Result<Vec<u32>> {
        sampling.check()?;
        if prompt.is_empty() {
            return Err(Error::Config(
                "generation needs a prompt of at least one token".into(),
            ));
        }
        let block = self.cfg.block_size;
        let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
        let mut all = prompt.to_vec();
        let mut cache = self.cache();
        let mut logits =
            self.forward_cached(&all[all.len().saturating_sub(block)..], &mut cache)?;
        let mut out = Vec::with_capacity(tokens);
        while out.len() < tokens {
            let next = pick(&logits.to_vec1::<f32>()?, sampling, &mut rng);
            out.push(next);
            all.push(next);
            each(next)?;
            if out.len() == tokens {
                break;
            }
            logits = match cache.len < block {
                true => self.forward_cached(&[next], &mut cache)?,
                false => {
                    // Full: the last block_size tokens, run afresh.
                    cache = self.cache();
                    self.forward_cached(&all[all.len() - block..], &mut cache)?
                }
            };
        }
        Ok(out)
    }
}

/// The next token from `logits`: the argmax at temperature 0 (the first of
/// equal maxima, as `torch.argmax`), else a draw from the softmax of
/// `logits / temperature` over the top `k`.
pub fn pick(logits: &[f32], sampling: &Sampling, rng: &mut impl Rng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &v)| match v > best.1 {
                true => (i, v),
                false => best,
            })
            .0 as u32
    };
    if sampling.temperature == 0.0 {
        return argmax();
    }
    let floor = match sampling.top_k {
        Some(k) if k < logits.len() => {
            let mut sorted: Vec<f32> = logits.to_vec();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            sorted[k - 1]
        }
        _ => f32::NEG_INFINITY,
    };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logits
        .iter()
        .map(|&v| match v >= floor {
            true => ((f64::from(v) - f64::from(max)) / sampling.temperature).exp(),
            false => 0.0,
        })
        .collect();
    let total: f64 = weights.iter().sum();
    if !(total > 0.0 && total.is_finite()) {
        return argmax();
    }
    let mut u = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    // Rounding left u at the end: the last token with weight.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::gpt::GptConfig;
    use crate::init::Initializer;
    use crate::Model;

    fn tiny(block: usize) -> Gpt {
        let cfg = GptConfig {
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            block_size: block,
            vocab_size: 11,
            dropout: 0.0,
            bias: true,
        };
        let dev = redline_core::Device::cpu();
        let mut init = Initializer::new(3, &dev, redline_core::Precision::default());
        Gpt::new(&cfg, &mut init).unwrap()
    }

    /// The full forward's logits of the last position of `ids`.
    fn full(m: &Gpt, ids: &[u32]) -> Vec<f32> {
        let x = Tensor::new(ids, &candle_core::Device::Cpu)
            .unwrap()
            .reshape((1, ids.len()))
            .unwrap();
        let y = m.forward(&x).unwrap();
        y.get(0)
            .unwrap()
            .get(ids.len() - 1)
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }

    #[test]
    fn cached_logits_match_the_full_forward() {
        let m = tiny(8);
        let ids = [1u32, 5, 2, 9, 0, 3];
        let mut cache = m.cache();
        let first = m.forward_cached(&ids[..3], &mut cache).unwrap();
        close(&first.to_vec1().unwrap(), &full(&m, &ids[..3]));
        // One at a time after the prompt, and two at once.
        let one = m.forward_cached(&ids[3..4], &mut cache).unwrap();
        close(&one.to_vec1().unwrap(), &full(&m, &ids[..4]));
        let two = m.forward_cached(&ids[4..6], &mut cache).unwrap();
        close(&two.to_vec1().unwrap(), &full(&m, &ids));
        assert_eq!(cache.len(), 6);
        assert!(m.forward_cached(&[1, 2, 3], &mut cache).is_err());
        assert!(m.forward_cached(&[11], &mut m.cache()).is_err());
    }

    #[test]
    fn greedy_generation_matches_argmax_of_the_cropped_full_forward() {
        // Past block_size: the context is cropped as nanoGPT crops it.
        let m = tiny(5);
        let greedy = Sampling {
            temperature: 0.0,
            top_k: None,
            seed: 0,
        };
        let prompt = [4u32, 7, 1];
        let mut seen = Vec::new();
        let got = m
            .generate(&prompt, 9, &greedy, |t| {
                seen.push(t);
                Ok(())
            })
            .unwrap();
        assert_eq!(got, seen);
        let mut all = prompt.to_vec();
        for _ in 0..9 {
            let logits = full(&m, &all[all.len().saturating_sub(5)..]);
            all.push(pick(&logits, &greedy, &mut ChaCha8Rng::seed_from_u64(0)));
        }
        assert_eq!(got, all[3..]);
    }

    #[test]
    fn draws_follow_temperature_top_k_and_seed() {
        let logits = [0.0f32, 3.0, 1.0, 2.9, -5.0];
        let s = |t: f64, k: Option<usize>, seed| Sampling {
            temperature: t,
            top_k: k,
            seed,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(pick(&logits, &s(0.0, None, 0), &mut rng), 1);
        // Top 2: only ids 1 and 3, both drawn.
        let mut counts = [0usize; 5];
        for _ in 0..2000 {
            counts[pick(&logits, &s(1.0, Some(2), 0), &mut rng) as usize] += 1;
        }
        assert_eq!(counts[0] + counts[2] + counts[4], 0, "{counts:?}");
        // exp(0.1) : 1 is about 52.5% : 47.5%.
        assert!((900..1200).contains(&counts[1]), "{counts:?}");
        // A very low temperature is all but greedy; a high one spreads.
        let mut hot = [0usize; 5];
        for _ in 0..2000 {
            assert_ne!(pick(&logits, &s(1e-4, None, 0), &mut rng), 0);
            hot[pick(&logits, &s(100.0, None, 0), &mut rng) as usize] += 1;
        }
        assert!(hot.iter().all(|&c| c > 250), "{hot:?}");
        // The same seed draws the same tokens.
        let m = tiny(6);
        let run = |seed| m.generate(&[1, 2], 12, &s(1.0, Some(5), seed), |_| Ok(()));
        assert_eq!(run(7).unwrap(), run(7).unwrap());
        assert_ne!(run(7).unwrap(), run(8).unwrap());
    }

    #[test]
    fn bad_settings_are_refused() {
        let m = tiny(6);
        for (t, k) in [(f64::NAN, None), (-1.0, None), (1.0, Some(0))] {
            let s = Sampling {
                temperature: t,
                top_k: k,
                seed: 0,
            };
            assert!(m.generate(&[1], 3, &s, |_| Ok(())).is_err(), "{t} {k:?}");
        }
        let s = Sampling {
            temperature: 1.0,
            top_k: None,
            seed: 0,
        };
        assert!(m.generate(&[], 3, &s, |_| Ok(())).is_err());
    }
}
