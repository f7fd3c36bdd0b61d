//! The optimizer inside the train step: MaxText's gradient clipping and `optax.adamw`, traced.
//!
//! Per step, on the raw gradients `g` of the parameters `p`:
//! 1. `grad_norm = sqrt(sum of g^2 over every parameter)` (logged as `learning/grad_norm`);
//! 2. clip by global norm (`gradient_clipping_threshold` > 0): `g * threshold / grad_norm` when
//!    `grad_norm >= threshold`, as `optax.clip_by_global_norm`;
//! 3. Adam moments `mu = b1 mu + (1 - b1) g`, `nu = b2 nu + (1 - b2) g^2`, bias-corrected with
//!    the incremented count `t`: `u = (mu / (1 - b1^t)) / (sqrt(nu / (1 - b2^t) + eps_root) + eps)`;
//! 4. decoupled weight decay on every parameter: `u += weight_decay * p`;
//! 5. `p -= lr(count) * u`, the learning rate evaluated at the count *before* the increment
//!    (optax's `scale_by_schedule`), so step 0 uses `lr(0)`.
//!
//! The schedule is computed in-graph from the step counter (`opt_state.count`), with the
//! constants of [`LearningRateSchedule`] baked in: the host version is its reference.

use crate::config::Config;
use crate::ir::DType;
use crate::tensor::{where_, Tensor, Tree};
use crate::train_state::OptState;

use super::schedule::LearningRateSchedule;

/// AdamW with clipping and the learning-rate schedule, MaxText's config names.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    pub eps_root: f64,
    pub weight_decay: f64,
    /// `gradient_clipping_threshold`; 0 disables clipping.
    pub clip_threshold: f64,
    pub schedule: LearningRateSchedule,
}

impl AdamW {
    pub fn from_config(c: &Config) -> anyhow::Result<AdamW> {
        let schedule = LearningRateSchedule::from_config(c)?;
        Ok(AdamW {
            b1: c.adam_b1,
            b2: c.adam_b2,
            eps: c.adam_eps,
            eps_root: c.adam_eps_root,
            weight_decay: c.adam_weight_decay,
            clip_threshold: c.gradient_clipping_threshold,
            schedule,
        })
    }

    /// Zero moments (each like its parameter) and count (s32 scalar, the number of updates
    /// applied) for `params`.
    pub fn init(&self, params: &Tree) -> OptState {
        let ctx = params.values().next().expect("a model has parameters").trace();
        OptState {
            mu: params.map(|_, p| p.zeros_like()),
            nu: params.map(|_, p| p.zeros_like()),
            count: ctx.scalar(0.0, DType::S32),
        }
    }

    /// One update: returns the new parameters, the new state and the metrics `grad_norm` and
    /// `learning_rate` (f32 scalars).
    pub fn update(&self, params: &Tree, grads: &Tree, state: &OptState) -> (Tree, OptState, Tree) {
        self.update_with_norm(params, grads, state, &global_norm(grads))
    }

    /// [`AdamW::update`] of part of the parameters, given the global norm of every parameter's
    /// gradient (f32 scalar): a pipeline stage updates its own parameters, clipped by the norm
    /// over all stages.
    pub fn update_with_norm(
        &self,
        params: &Tree,
        grads: &Tree,
        state: &OptState,
        grad_norm: &Tensor,
    ) -> (Tree, OptState, Tree) {
        let grads = if self.clip_threshold > 0.0 {
            let scale = where_(&grad_norm.lt(self.clip_threshold), 1.0, &(self.clip_threshold / grad_norm));
            grads.map(|_, g| g * &scale.astype(g.dtype()))
        } else {
            grads.clone()
        };
        let count = &state.count;
        let lr = self.schedule.traced(count);
        let next_count = count + 1;
        let t = next_count.astype(DType::F32);
        // 1 - b^t, computed as 1 - exp(t ln b) in f32 like optax's `1 - decay**count`.
        let correction = |b: f64| 1.0 - (&t * b.ln()).exp();
        let (c1, c2) = (correction(self.b1), correction(self.b2));
        let mut new_params = Tree::new();
        let mut new_state = OptState { mu: Tree::new(), nu: Tree::new(), count: next_count.clone() };
        for (name, p) in params.iter() {
            let g = &grads[name];
            let mu = &state.mu[name] * self.b1 + g * (1.0 - self.b1);
            let nu = &state.nu[name] * self.b2 + g.square() * (1.0 - self.b2);
            let mu_hat = &mu / &c1.astype(mu.dtype());
            let nu_hat = &nu / &c2.astype(nu.dtype());
            let update = mu_hat / ((nu_hat + self.eps_root).sqrt() + self.eps) + p * self.weight_decay;
            new_params.insert(name, p - &(update * &lr.astype(p.dtype())));
            new_state.mu.insert(name, mu);
            new_state.nu.insert(name, nu);
        }
        let metrics = Tree::new().with("grad_norm", grad_norm.clone()).with("learning_rate", lr);
        (new_params, new_state, metrics)
    }
}

/// `sqrt(sum over the tree of sum(x^2))` in f32.
pub fn global_norm(tree: &Tree) -> Tensor {
    let squares: Vec<Tensor> = tree.values().map(|g| g.astype(DType::F32).square().sum_all()).collect();
    let mut total = squares[0].clone();
    for s in &squares[1..] {
        total = total + s;
    }
    total.sqrt()
}
