//! The two traced programs of decoding, MaxText's `prefill` and `generate` (`MaxEngine` in
//! `src/maxtext/inference/maxengine/maxengine.py`, main at e591f30), built on the model's
//! `Model::decode` (the same family layers as training):
//!
//! - `prefill`: `params.*`, `tokens: s32[batch, prefill_len]` (each row a prompt, right-padded),
//!   `lengths: s32[batch]` (each prompt's length, >= 1), `key: u32[2]` -> the key/value cache
//!   `cache.<i>.key` / `cache.<i>.value` (`[layers, batch, cache_len, kv_heads, head_dim]`,
//!   sharded by the `cache_*` logical rules; `cache.<stack>.<i>.key` for each stack of a model of
//!   several, `Model::decode`), the first generated token of each row `tokens:
//!   s32[batch]` (sampled from the logits at the prompt's last token), its position
//!   `positions: s32[batch]` (the prompt's length) and the next `key`.
//! - `generate` (`steps` tokens per call): `params.*`, the cache, `tokens`, `positions`, `key`,
//!   all but the parameters donated -> the same names updated (each step feeds the last token
//!   at its position, writes its keys and values into the cache in place, and samples the next
//!   one), plus `generated: s32[steps, batch]`, the tokens of every step.
//!
//! Each sample draws from its own key: `split(key)` gives the next key and the sample's.

use crate::ir::{DType, Program, Signature, Type};
use crate::model::attention::CACHE_AXES;
use crate::model::{CacheStep, Model};
use crate::sharding::{Mesh, PartitionSpec};
use crate::tensor::{einsum, random, scan, trace, Tensor, TraceError, Tree};
use crate::train_state::Group;

use super::sampling::Sampling;

/// What decides the decode programs.
#[derive(Clone, Debug)]
pub struct Engine {
    pub model: Model,
    /// Sequences decoded together (`int(devices x per_device_batch_size)`).
    pub batch: i64,
    /// Prompt positions in prefill (`max_prefill_predict_length`).
    pub prefill_len: i64,
    /// Cache positions (`max_target_length`).
    pub cache_len: i64,
    pub sampling: Sampling,
    /// The device mesh (none: one device).
    pub mesh: Option<Mesh>,
}

/// A cache array's name and type (`generate`'s inputs are `prefill`'s cache outputs).
pub type CacheSpec = (String, Type);

impl Engine {
    fn spec(&self, logical: &[&str]) -> Option<PartitionSpec> {
        self.mesh.as_ref().map(|m| self.model.config.rules.spec(logical, m))
    }

    /// The sharding of cache arrays.
    pub fn cache_sharding(&self) -> Option<PartitionSpec> {
        self.spec(CACHE_AXES)
    }

    /// Checks that the mesh axes the `cache_*` rules give each cache dimension divide it (e.g. the
    /// `autoregressive` and `tensor` axes of `cache_heads` divide the kv heads).
    pub fn check_cache_sharding(&self) -> anyhow::Result<()> {
        let (Some(mesh), Some(spec)) = (&self.mesh, self.cache_sharding()) else { return Ok(()) };
        let c = &self.model.config;
        let stacks = self.model.stacks().iter();
        let dims =
            stacks.flat_map(|s| [s.count, self.batch, self.cache_len, c.kv_heads, c.head_dim].into_iter().enumerate());
        for (d, size) in dims {
            let logical = CACHE_AXES[d];
            let axes = spec.dim(d);
            let shards: usize = axes.iter().map(|a| mesh.axis_size(a).unwrap_or(1)).product();
            if size % shards as i64 != 0 {
                return Err(anyhow::anyhow!(
                    "the key/value cache's {logical} dimension ({size}) does not split over the {shards} devices of mesh \
                     axes [{}] (the {logical} rule of logical_axis_rules); use parallelism that divides it",
                    axes.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// A signature with the parameters (sharded by the logical rules, not donated).
    fn signature(&self) -> Signature {
        let mut sig = Signature::new(self.mesh.clone());
        self.model.declare_params(&mut sig, Group::Params.prefix());
        sig
    }

    /// The prefill program (see the module docs).
    pub fn prefill(&self) -> Result<Program, TraceError> {
        let mut sig = self.signature();
        let tokens = sig.input("tokens", DType::S32, &[self.batch, self.prefill_len]);
        if let Some(spec) = self.spec(&["activation_batch", "activation_length"]) {
            tokens.sharded(spec);
        }
        sig.input("lengths", DType::S32, &[self.batch]);
        sig.input("key", DType::U32, &[2]);
        let cache_spec = self.cache_sharding();
        trace(&sig, |ctx, inp| {
            let params = Group::Params.subtree(inp);
            let (b, p) = (self.batch, self.prefill_len);
            let positions = ctx.iota(DType::S32, &[b, p], 1);
            let (y, cache) =
                self.model.decode(&params, &inp["tokens"], &positions, CacheStep::Prefill { len: self.cache_len });
            // The last layer's output at each prompt's last token: a one-hot sum over positions
            // (exact: one term is not zero).
            let last = (&inp["lengths"] - 1.0).one_hot(p, y.dtype());
            let y_last = einsum("bp,bpe->be", &[&last, &y]).reshape(&[b, 1, -1]);
            let logits = self.model.head(&params, &y_last).reshape(&[b, -1]);
            let (next_key, sample_key) = split(&inp["key"]);
            let mut out = Tree::new()
                .with("tokens", self.sampling.sample(&logits, &sample_key))
                .with("positions", inp["lengths"].clone())
                .with("key", next_key);
            out.extend(cache.prefixed("cache"));
            out
        })
        .map(|mut program| {
            for o in program.outputs.iter_mut().filter(|o| o.name.starts_with("cache.")) {
                o.sharding = cache_spec.clone();
            }
            program
        })
    }

    /// The cache arrays of a traced prefill program.
    pub fn cache_specs(prefill: &Program) -> Vec<CacheSpec> {
        prefill
            .outputs
            .iter()
            .filter(|o| o.name.starts_with("cache."))
            .map(|o| (o.name.clone(), o.ty.clone()))
            .collect()
    }

    /// The generate program making `steps` tokens per sequence per call (see the module docs);
    /// `cache` is what `cache_specs` gives for this engine's prefill.
    pub fn generate(&self, cache: &[CacheSpec], steps: i64) -> Result<Program, TraceError> {
        let mut sig = self.signature();
        let cache_spec = self.cache_sharding();
        for (name, ty) in cache {
            sig.input(name, ty.dtype, &ty.shape).donated();
            if let Some(spec) = &cache_spec {
                sig.inputs.last_mut().expect("just added").sharded(spec.clone());
                sig.output_sharding(name, spec.clone());
            }
        }
        sig.input("tokens", DType::S32, &[self.batch]).donated();
        sig.input("positions", DType::S32, &[self.batch]).donated();
        sig.input("key", DType::U32, &[2]).donated();
        trace(&sig, |ctx, inp| {
            let params = Group::Params.subtree(inp);
            let state = inp
                .subtree("cache")
                .prefixed("cache")
                .with("tokens", inp["tokens"].clone())
                .with("positions", inp["positions"].clone())
                .with("key", inp["key"].clone());
            let step_index = Tree::new().with("step", ctx.iota(DType::S32, &[steps], 0));
            let (state, ys) = scan(&state, &step_index, |state, _| {
                let next = self.step(&params, state);
                let token = next["tokens"].clone();
                (next, Tree::new().with("generated", token))
            });
            state.with("generated", ys["generated"].clone())
        })
    }

    /// One generate step on `state` (`cache.*`, `tokens`, `positions`, `key`): the state after it.
    fn step(&self, params: &Tree, state: &Tree) -> Tree {
        let b = self.batch;
        let tokens = state["tokens"].reshape(&[b, 1]);
        let positions = state["positions"].reshape(&[b, 1]);
        let cache = state.subtree("cache");
        let (y, cache) = self.model.decode(params, &tokens, &positions, CacheStep::Generate(&cache));
        let logits = self.model.head(params, &y).reshape(&[b, -1]);
        let (next_key, sample_key) = split(&state["key"]);
        cache
            .prefixed("cache")
            .with("tokens", self.sampling.sample(&logits, &sample_key))
            .with("positions", &state["positions"] + 1.0)
            .with("key", next_key)
    }
}

/// `jax.random.split(key)`: the next key and a key for this sample.
fn split(key: &Tensor) -> (Tensor, Tensor) {
    let keys = random::split(key, 2);
    (keys.slice_axis(0, 0, 1).reshape(&[2]), keys.slice_axis(0, 1, 2).reshape(&[2]))
}
