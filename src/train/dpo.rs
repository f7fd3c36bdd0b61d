//! The preference losses of MaxText's `use_dpo` (`dpo.algo`: `dpo` or `orpo`), traced: per-sequence
//! log-probabilities of the chosen and rejected responses, the loss, and the metrics Tunix logs.
//!
//! MaxText's `trainers/post_train/dpo/train_dpo.py` (e591f30) hands its `dpo:` keys to Tunix's
//! `DPOTrainer` (google/tunix `tunix/sft/dpo/dpo_trainer.py` at c7d8950): `algorithm`,
//! `beta` = `dpo_beta`, `label_smoothing` = `dpo_label_smoothing`, `lambda_orpo` =
//! `orpo_lambda`, Tunix's defaults for the rest (`enable_prompt_loss_orpo` and
//! `average_log_prob_orpo` both true). What is taken from there:
//!
//! - **Log-probabilities** (`compute_logps`): a response's is the sum over its tokens of
//!   `log p(token | everything before it)`, prompt tokens excluded; the chosen and rejected rows
//!   run through the model as one batch (chosen rows first).
//! - **DPO** (`dpo_loss_fn`; Rafailov et al. 2023, eq. 7, with cDPO's label smoothing):
//!   `d = (pi_c - ref_c) - (pi_r - ref_r)`, per pair
//!   `-(1 - s) log sigmoid(beta d) - s log sigmoid(-beta d)`, averaged over pairs. The
//!   reference log-probabilities carry no gradient.
//! - **ORPO** (Hong et al. 2024, eqs. 2-7, as Tunix and TRL compute it): the response
//!   log-probabilities averaged over their tokens and clipped to `<= -1e-7`;
//!   `log_odds = (c - r) - (log1p(-e^c) - log1p(-e^r))`; per pair the NLL of the chosen row's
//!   prompt and response averaged over its tokens, plus `lambda * -((1 - s) log sigmoid(log_odds)
//!   + s log sigmoid(-log_odds))`, averaged over pairs. No reference model.
//! - **Metrics** (Tunix's `_aux_metrics_to_log`, each a mean over pairs): `rewards/chosen`,
//!   `rewards/rejected` (DPO: `beta * (pi - ref)`; ORPO: `lambda *` the averaged
//!   log-probability), `rewards/margin` (their difference), `rewards/accuracy` (the share of
//!   pairs whose chosen reward is strictly larger), `log_probs/chosen`, `log_probs/rejected`
//!   (the policy's; ORPO: averaged and clipped), and for ORPO `odds_ratio` (`exp(log_odds)`).
//!   Here they are named with dots (`rewards.chosen`), as every program output is.
//!
//! Rows are laid out as `data::preference` builds them (prompt, then response, then padding,
//! unpacked), not left-padded prompts as MaxText's `DPODataFormatting`: each real token has the
//! same position and context either way. One difference follows: ORPO's NLL over
//! "prompt + response" in Tunix is over `full_mask[:, 1:]`, which counts the first prompt token
//! (predicted from padding) whenever the prompt is shorter than `max_prompt_length`; here it
//! counts every token that has a token before it, which is Tunix's sum when the prompt is not
//! padded.

use crate::config::Config;
use crate::ir::DType;
use crate::model::Model;
use crate::tensor::{concatenate, Tensor, Tree};

pub use crate::config::DpoAlgo as Algo;

/// Tunix's clip of averaged log-probabilities before `log1p(-exp(.))` (ORPO).
const ORPO_EPS: f64 = 1e-7;

/// The preference metrics of a step: their program names (`metrics.<name>`) and Tunix's names,
/// which are the metrics file's keys; `odds_ratio` is ORPO's only.
pub const METRICS: [(&str, &str); 7] = [
    ("rewards.chosen", "rewards/chosen"),
    ("rewards.rejected", "rewards/rejected"),
    ("rewards.margin", "rewards/margin"),
    ("rewards.accuracy", "rewards/accuracy"),
    ("log_probs.chosen", "log_probs/chosen"),
    ("log_probs.rejected", "log_probs/rejected"),
    ("odds_ratio", "odds_ratio"),
];

/// The preference settings (`dpo.*` keys).
#[derive(Clone, Debug, PartialEq)]
pub struct Dpo {
    pub algo: Algo,
    /// `dpo.dpo_beta`: DPO's inverse temperature.
    pub beta: f64,
    /// `dpo.dpo_label_smoothing`, in `[0, 1]`: the assumed share of flipped preferences.
    pub label_smoothing: f64,
    /// `dpo.orpo_lambda`: the weight of ORPO's odds-ratio term.
    pub orpo_lambda: f64,
}

/// Per row of a batch (`[rows]` f32): the response's summed log-probability and token count,
/// and for ORPO's NLL the same over every token of the row but the first.
pub struct RowLogps {
    pub response: Tensor,
    pub response_tokens: Tensor,
    pub full: Option<(Tensor, Tensor)>,
}

/// The log-probabilities of `batch`'s rows from their f32 `logits: [rows, seq, vocab]` (`full`:
/// the whole rows' too). The batch has `inputs`, `targets`, `targets_segmentation` (non-zero on
/// response targets: the tokens that count) and `inputs_segmentation` (non-zero on real
/// tokens), each s32 `[rows, seq]`; every real token but a row's first is the target of the
/// token before it.
pub fn row_logps(logits: &Tensor, batch: &Tree, full: bool) -> RowLogps {
    let (seq, vocab) = (logits.shape()[1], logits.shape()[2]);
    let log_z = logits.logsumexp(-1);
    let of = |targets: &Tensor| (logits * &targets.one_hot(vocab, DType::F32)).sum(&[-1]) - &log_z;
    let counted = |segmentation: &Tensor| segmentation.ne(0).astype(DType::F32);
    let response_mask = counted(&batch["targets_segmentation"]);
    let response = (of(&batch["targets"]) * &response_mask).sum(&[-1]);
    let full = full.then(|| {
        // The token after each position, and whether it is real: position t predicts inputs[t + 1].
        let next = |x: &Tensor| x.slice_axis(1, 1, seq).pad(0.0, &[0, 0], &[0, 1], &[0, 0]);
        let mask = counted(&next(&batch["inputs_segmentation"]));
        ((of(&next(&batch["inputs"])) * &mask).sum(&[-1]), mask.sum(&[-1]))
    });
    RowLogps { response, response_tokens: response_mask.sum(&[-1]), full }
}

/// `log sigmoid(x)`, stable for large `|x|`: `min(x, 0) - log1p(exp(-|x|))`.
fn log_sigmoid(x: &Tensor) -> Tensor {
    x.minimum(0.0) - (-x.abs()).exp().log1p()
}

/// Whether each pair of a batch is one (`[pairs]` f32, 1 or 0): an eval batch's last rows may be
/// padding, which has no token.
fn real_pairs(chosen: &Tree) -> Tensor {
    chosen["inputs_segmentation"].ne(0).astype(DType::F32).sum(&[-1]).gt(0.0).astype(DType::F32)
}

impl Dpo {
    /// The settings of a run with `use_dpo`; none without.
    pub fn from_config(c: &Config) -> Option<Dpo> {
        c.use_dpo.then_some(Dpo {
            algo: c.dpo_algo,
            beta: c.dpo_dpo_beta,
            label_smoothing: c.dpo_dpo_label_smoothing,
            orpo_lambda: c.dpo_orpo_lambda,
        })
    }

    /// Whether the run keeps a frozen copy of its starting weights as the reference model:
    /// DPO without LoRA (ORPO has no reference; under LoRA it is the base without adapters).
    pub fn keeps_reference_copy(&self, model: &Model) -> bool {
        self.algo == Algo::Dpo && model.config.lora.is_none()
    }

    /// The smoothed logistic loss of a preference score `z` (per pair).
    fn preference_loss(&self, z: &Tensor) -> Tensor {
        let s = self.label_smoothing;
        -(log_sigmoid(z) * (1.0 - s) + log_sigmoid(&-z) * s)
    }

    /// The loss (f32 scalar, the mean over pairs) of the policy `params` on the pairs
    /// `chosen[i]`, `rejected[i]` (batch trees as [`row_logps`] reads, `[pairs, seq]` each), and
    /// its sums: `total_loss`, the loss summed over the pairs, `pairs`, their number (rows of
    /// padding, which an eval batch's last rows may be, are no pair and count in neither),
    /// `total_weights`, the response tokens of both sides (MaxText's
    /// `DPOTrainingHooks.get_total_weights`), and `sums.<metric>`, each metric of the module docs
    /// summed over the pairs ([`means`] divides them by `pairs`). Sums, as Tunix's
    /// `WeightedMetric`s, so that micro-batches and eval batches add up before the one division.
    /// `reference`: the reference model's parameters (DPO; a frozen copy of the starting
    /// weights, or under LoRA the base weights without the adapters), none for ORPO.
    ///
    /// The layers' auxiliary losses (MoE load balancing) are not part of the loss: MaxText's
    /// Tunix adapter (`integration/tunix/tunix_adapter.py` at e591f30) returns the logits alone,
    /// and Tunix's `dpo_loss_fn` is the preference loss alone.
    pub fn loss(
        &self,
        model: &Model,
        params: &Tree,
        reference: Option<&Tree>,
        chosen: &Tree,
        rejected: &Tree,
    ) -> (Tensor, Tree) {
        let pairs = chosen["inputs"].shape()[0];
        let both: Tree = chosen.map(|name, c| concatenate(&[c, &rejected[name]], 0));
        let forward = model.forward(params, &both, false);
        let policy = row_logps(&forward.logits, &both, self.algo == Algo::Orpo);
        let halves = |x: &Tensor| (x.slice_axis(0, 0, pairs), x.slice_axis(0, pairs, 2 * pairs));
        let (pi_c, pi_r) = halves(&policy.response);
        let (len_c, len_r) = halves(&policy.response_tokens);
        let total_weights = (&len_c + &len_r).sum_all();
        let (losses, metrics) = match self.algo {
            Algo::Dpo => {
                let (ref_c, ref_r) = match reference {
                    Some(reference) => {
                        let logits = model.forward(reference, &both, false).logits.stop_gradient();
                        halves(&row_logps(&logits, &both, false).response)
                    }
                    None => (pi_c.zeros_like(), pi_r.zeros_like()),
                };
                let (ratio_c, ratio_r) = (&pi_c - &ref_c, &pi_r - &ref_r);
                let losses = self.preference_loss(&((&ratio_c - &ratio_r) * self.beta));
                let metrics = reward_metrics(&(ratio_c * self.beta), &(ratio_r * self.beta), &pi_c, &pi_r);
                (losses, metrics)
            }
            Algo::Orpo => {
                let clip = |sum: &Tensor, tokens: &Tensor| (sum / &tokens.maximum(1.0)).minimum(-ORPO_EPS);
                let (avg_c, avg_r) = (clip(&pi_c, &len_c), clip(&pi_r, &len_r));
                let (full, full_tokens) = policy.full.as_ref().expect("ORPO's rows have their whole log-probability");
                let ((full_c, _), (full_len_c, _)) = (halves(full), halves(full_tokens));
                let sft = -(full_c / &full_len_c.maximum(1.0));
                let odds = |avg: &Tensor| (-avg.exp()).log1p();
                let log_odds = (&avg_c - &avg_r) - (odds(&avg_c) - odds(&avg_r));
                let losses = sft + &(self.preference_loss(&log_odds) * self.orpo_lambda);
                let rewards = (&avg_c * self.orpo_lambda, &avg_r * self.orpo_lambda);
                let metrics = reward_metrics(&rewards.0, &rewards.1, &avg_c, &avg_r).with("odds_ratio", log_odds.exp());
                (losses, metrics)
            }
        };
        let real = real_pairs(chosen);
        let (total_loss, counted) = ((losses * &real).sum_all(), real.sum_all());
        let loss = &total_loss / &counted.maximum(1.0);
        let sums = metrics.map(|_, per_pair| (per_pair * &real).sum_all()).prefixed("sums");
        (loss, sums.with("total_loss", total_loss).with("pairs", counted).with("total_weights", total_weights))
    }
}

/// Tunix's reward metrics of per-pair rewards and log-probabilities, per pair (`[pairs]` f32).
fn reward_metrics(chosen: &Tensor, rejected: &Tensor, logp_c: &Tensor, logp_r: &Tensor) -> Tree {
    Tree::new()
        .with("rewards.chosen", chosen.clone())
        .with("rewards.rejected", rejected.clone())
        .with("rewards.margin", chosen - rejected)
        .with("rewards.accuracy", chosen.gt(rejected).astype(DType::F32))
        .with("log_probs.chosen", logp_c.clone())
        .with("log_probs.rejected", logp_r.clone())
}

/// The preference metrics (`rewards.chosen`, ...: means over pairs) of a loss's sums
/// (`sums.<metric>` and `pairs`, from [`Dpo::loss`] or added up over micro-batches).
pub fn means(sums: &Tree) -> Tree {
    let pairs = sums["pairs"].maximum(1.0);
    sums.subtree("sums").map(|_, sum| sum / &pairs)
}

/// The reference model of DPO under LoRA: the policy's parameters without the adapters, which
/// is the base model (MaxText clones the LoRA model as its reference, whose adapters start as
/// a zero update; here they stay off instead, so the reference needs no second copy).
pub fn without_adapters(model: &Model, params: &Tree) -> Tree {
    params.iter().filter(|(name, _)| !model.is_adapter(name)).map(|(n, v)| (n.to_string(), v.clone())).collect()
}
