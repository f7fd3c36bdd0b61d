//! Choosing each next token from the logits, in the graph: MaxText's `decode_sampling_strategy`
//! (`sampling` in `src/maxtext/inference/inference_utils.py`, MaxText main at e591f30) with its
//! parameters `decode_sampling_temperature`, `decode_sampling_nucleus_p`, `decode_sampling_top_k`:
//!
//! - `greedy`: the most likely token (`argmax`; the first of equal ones).
//! - `weighted`: a sample of `softmax(logits / temperature)`.
//! - `nucleus`: logits below the `p`-nucleus's smallest one are set to `-1e7`, then `weighted`.
//!   The nucleus is the most likely tokens up to and including the first whose cumulative
//!   probability (of the untempered softmax, in decreasing order) reaches `p`.
//! - `topk`: a sample of the `k` largest logits over `temperature`.
//! - `composite`: the `k` largest logits, of those the `p`-nucleus (cumulative probabilities of
//!   the softmax over the `k`), then a sample at `max(temperature, 1e-6)`.
//!
//! Samples are JAX's `jax.random.categorical`: `argmax(logits + gumbel)`, the Gumbel noise
//! `-log(-log(u))` from `u` uniform in `[tiny, 1)` drawn by threefry from the step's key
//! (`tensor::random`), so a seed gives the same samples on every backend and sharding.

use crate::config::{Config, SamplingStrategy};
use crate::ir::DType;
use crate::tensor::{random, where_, Tensor};

/// MaxText's mask value for logits outside the nucleus (`NEG_INF` in `inference_utils.py`).
const NEG_INF: f64 = -1.0e7;

/// A sampling strategy with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    Greedy,
    Weighted { temperature: f64 },
    Nucleus { p: f64, temperature: f64 },
    TopK { k: i64, temperature: f64 },
    Composite { k: i64, p: f64, temperature: f64 },
}

impl Sampling {
    /// The strategy the decode keys ask for (checked by `config::validate_decode`).
    pub fn from_config(c: &Config) -> Sampling {
        let (temperature, p, k) = (c.decode_sampling_temperature, c.decode_sampling_nucleus_p, c.decode_sampling_top_k);
        match c.decode_sampling_strategy {
            SamplingStrategy::Greedy => Sampling::Greedy,
            SamplingStrategy::Weighted => Sampling::Weighted { temperature },
            SamplingStrategy::Nucleus => Sampling::Nucleus { p, temperature },
            SamplingStrategy::Topk => Sampling::TopK { k, temperature },
            SamplingStrategy::Composite => Sampling::Composite { k, p, temperature },
        }
    }

    /// The next token of each row, `s32[batch]`, from f32 `logits: [batch, vocab]`, drawing
    /// from `key` (`u32[2]`) when the strategy samples.
    pub fn sample(&self, logits: &Tensor, key: &Tensor) -> Tensor {
        match *self {
            Sampling::Greedy => logits.argmax(-1),
            Sampling::Weighted { temperature } => categorical(key, &(logits / temperature)),
            Sampling::Nucleus { p, temperature } => {
                let sorted = crate::tensor::sort(&[logits], -1, true).remove(0);
                let cutoff = nucleus_size(&sorted, p) - 1;
                let cutoff_logit = select_along_last(&sorted, &cutoff);
                let kept = where_(&logits.lt(cutoff_logit.expand_dims(-1)), NEG_INF, logits);
                categorical(key, &(kept / temperature))
            }
            Sampling::TopK { k, temperature } => {
                let (values, indices) = logits.top_k(k);
                let chosen = categorical(key, &(values / temperature));
                select_along_last(&indices, &chosen)
            }
            Sampling::Composite { k, p, temperature } => {
                let (values, indices) = logits.top_k(k);
                let size = nucleus_size(&values, p);
                let rank = logits.trace().iota(DType::S32, values.shape(), values.rank() - 1);
                let kept = where_(&rank.lt(size.expand_dims(-1)), &values, NEG_INF);
                let chosen = categorical(key, &(kept / temperature.max(1e-6)));
                select_along_last(&indices, &chosen)
            }
        }
    }
}

/// How many of the logits `sorted` (decreasing along the last axis) the `p`-nucleus keeps:
/// one more than the number whose cumulative softmax probability is below `p`, i.e. up to and
/// including the first that reaches `p` (MaxText's `cutoff_index + 1`), at most all of them.
fn nucleus_size(sorted: &Tensor, p: f64) -> Tensor {
    let n = sorted.shape()[sorted.rank() - 1];
    let below = sorted.softmax(-1).cumsum(-1).lt(p).astype(DType::S32).sum(&[-1]);
    (below + 1).minimum(n as f64)
}

/// `x[..., index[...]]` for `x: [..., n]` and an s32 `index: [...]`.
fn select_along_last(x: &Tensor, index: &Tensor) -> Tensor {
    let positions = x.trace().iota(DType::S32, x.shape(), x.rank() - 1);
    let hit = positions.eq(index.expand_dims(-1));
    let zero = x.zeros_like();
    where_(&hit, x, &zero).sum(&[-1])
}

/// `jax.random.categorical(key, logits)` along the last axis: `argmax(logits + gumbel)`.
fn categorical(key: &Tensor, logits: &Tensor) -> Tensor {
    let tiny = f32::MIN_POSITIVE as f64;
    let u = random::uniform(key, logits.shape(), DType::F32, tiny, 1.0);
    let gumbel = -(-u.log()).log();
    (gumbel + &logits.astype(DType::F32)).argmax(-1)
}
