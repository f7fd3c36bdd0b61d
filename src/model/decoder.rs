//! The shared decoder (`Model`): what every decoder family shares, written once. A family
//! (`family.rs`, built by `families.rs` from `decoder_block`) declares its stacks of layers
//! (`stacks.rs`: by default one stack `layers`), one layer's parameters and one layer's
//! computation for each kind of layer; the shared decoder runs the stacks (`run_stacks.rs`; with
//! a key/value cache `decode.rs`), and owns the token (and learned position) embedding, the final
//! norm (of the family's kind), the logits, the loss (in tiles of the tokens with
//! `num_vocab_tiling`; with the layers' auxiliary losses, e.g. MoE load balancing, averaged over
//! layers and added as MaxText adds them), the parameter list and count, and the FLOP count. The
//! train step, the initializer, TFLOPs, the AOT artifact's compiled keys and the parameter-file
//! check all ask a `Model` instead of knowing any family's layout.
//!
//! Shared parameters (names as in a MaxText checkpoint's `params` tree):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `token_embedder.embedding` | [vocab, emb] | vocab, embed | normal(1.0) |
//! | `decoder.layers.<layer param>` | [layers, ...] | layers, ... | the family's |
//! | `decoder.decoder_norm.scale` | [emb] | norm | ones (zeros for gpt3's LayerNorm) |
//! | `decoder.decoder_norm.bias` (gpt3's LayerNorm only) | [emb] | norm | zeros |
//! | `decoder.logits_dense.kernel` | [emb, vocab] | embed, vocab | fan_in (absent with `logits_via_embedding`) |
//! | `decoder.position_embedder.embedding` (with `trainable_position_size` > 0) | [trainable_position_size, emb] | vocab, embed | normal(1.0) |
//!
//! With `scan_layers=false` layer `i`'s parameters are `decoder.layers_{i}.<layer param>`
//! without the leading axis (MaxText's unscanned names); another stack than `layers` is named
//! the same way after its own name (`stacks.rs`).
//!
//! Embedding and logits follow MaxText's `Decoder` (`src/maxtext/layers/decoders.py`, e591f30):
//! learned position embeddings are added to the token embeddings; with `logits_via_embedding`
//! the logits are `y @ embedding^T`, divided by `sqrt(emb)` with `normalize_embedding_logits`,
//! then soft-capped with `final_logits_soft_cap`.

use std::sync::Arc;

use anyhow::bail;

use crate::config::registry;
use crate::config::{self, Config, DecoderBlock};
use crate::ir::{DType, RematFences, Signature};
use crate::sharding::PartitionSpec;
use crate::tensor::{checkpoint, einsum, fence_cotangents, random, scan, RematPolicy, Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::Activation;
use super::context_parallel;
use super::families;
use super::family::{constrain, Family, BTE};
use super::flops::{StepShape, StepTflops};
use super::fp8::{self, Scaling};
use super::kernel;
use super::lora::Lora;
use super::mask::Order;
use super::params::{self, ParamDef, ParamInit};
use super::stacks::{unstack_layers, Stack};
use super::ModelConfig;

/// The `fold_in` of `init_weights_seed`'s key that LoRA adapters are drawn from ("LoRA" in ASCII):
/// beyond any parameter index.
const LORA_STREAM: u32 = 0x4c6f_5241;

/// Checks of the shared keys that only mean something together with others.
fn check_shared(c: &Config, mc: &ModelConfig) -> anyhow::Result<()> {
    if let Some(bad) = mc.mlp_activations.iter().find(|a| Activation::parse(a).is_none()) {
        return Err(anyhow::anyhow!(
            "mlp_activations: `{bad}` is not supported yet; use {}",
            config::MLP_ACTIVATIONS.join(", ")
        ));
    }
    // A soft cap asks for capped logits, which MaxText computes only on the tied path
    // (`decoders.py` `apply_output_head` at main e591f30). `normalize_embedding_logits=false`
    // asks for none of its division, which untied logits never have: MaxText's qwen2.5 and qwen3
    // files set it on untied models, and the model is the same.
    if !mc.logits_via_embedding {
        if let Some(value) = config::non_default_value(c, "final_logits_soft_cap") {
            return Err(anyhow::anyhow!(
                "final_logits_soft_cap={value}: it applies to the tied logits of logits_via_embedding=true only (MaxText ignores it otherwise)"
            ));
        }
    }
    // MaxText's `init_rotary_embedding` (attentions.py at main e591f30) builds Llama 3.1's RoPE
    // without the linear factor.
    if matches!(mc.rope, super::config::Rope::Llama31 { .. }) {
        if let Some(value) = config::non_default_value(c, "rope_linear_scaling_factor") {
            return Err(anyhow::anyhow!(
                "rope_linear_scaling_factor={value}: Llama 3.1's RoPE (rope_type=llama3.1 or a llama3.1 model_name) does not use it (MaxText ignores it there); it scales the default RoPE"
            ));
        }
    }
    if !matches!(mc.rope, super::config::Rope::Llama31 { .. }) && !c.rope_use_scale {
        bail!(
            "rope_use_scale=false: it applies to Llama 3.1's RoPE only (rope_type=llama3.1 or a llama3.1 model_name); MaxText ignores it otherwise"
        );
    }
    Ok(())
}

/// A decoder: the shared configuration and the family's layer.
#[derive(Clone, Debug)]
pub struct Model {
    pub config: ModelConfig,
    /// `decoder_block`: which keys the model reads (`config_keys`).
    block: DecoderBlock,
    pub(super) family: Arc<dyn Family>,
    /// The family's stacks of layers, in order, none empty.
    stacks: Vec<Stack>,
    /// With `lora.enable_lora`: the adapters' parameters (`lora`), after every other.
    adapters: Vec<ParamDef>,
}

/// The forward pass's results.
pub struct Forward {
    /// `[batch, seq, emb]` in `dtype`: the token embeddings (input of layer 0).
    pub embeddings: Tensor,
    /// `[layers, batch, seq, emb]`: each layer's output, when asked for.
    pub layer_outputs: Option<Tensor>,
    /// `[batch, seq, vocab]`, f32.
    pub logits: Tensor,
    /// Each auxiliary loss the layers report (`LayerOutput::aux_losses`), averaged over layers.
    pub aux_losses: Tree,
}

impl Model {
    /// The model of the command-line keys `args` (on maxrs's defaults), or the one-line error
    /// loading or building it gives: what the families' unit tests check their model files and
    /// refusals with.
    #[cfg(test)]
    pub(crate) fn from_args(args: &[&str]) -> Result<Model, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let c = crate::config::load(None, &args).map_err(|e| e.to_string())?;
        Model::from_config(&c).map_err(|e| e.to_string())
    }

    /// The model `c` describes. Errors name the key that a family cannot use.
    pub fn from_config(c: &Config) -> anyhow::Result<Model> {
        let config = ModelConfig::from_config(c);
        check_shared(c, &config)?;
        let family = families::build(c, &config)?;
        if let Some(refusal) = kernel::soft_cap_refusal(c) {
            bail!(refusal);
        }
        let stacks: Vec<Stack> = family.stacks(&config).into_iter().filter(|s| s.count > 0).collect();
        assert!(!stacks.is_empty(), "the {} family declares no layers", c.decoder_block);
        Lora::check(c)?;
        let mut model = Model { config, block: c.decoder_block, family, stacks, adapters: vec![] };
        if let Some(lora) = &model.config.lora {
            model.adapters = lora.adapters(&model.base_param_defs(model.config.scan_layers))?;
        }
        Ok(model)
    }

    /// The stacks of layers, in order.
    pub fn stacks(&self) -> &[Stack] {
        &self.stacks
    }

    /// Every configuration key the traced model depends on: those whose declaration says this
    /// model's family reads them.
    pub fn config_keys(&self) -> Vec<&'static str> {
        registry::model_keys(self.block).collect()
    }

    /// Every parameter, in a fixed order (the order `init_params` draws them in): the model's,
    /// frozen under LoRA, then the adapters.
    pub fn param_defs(&self) -> Vec<ParamDef> {
        let frozen = !self.adapters.is_empty();
        let mut defs = self.base_param_defs(self.config.scan_layers);
        defs.iter_mut().for_each(|d| d.frozen = frozen);
        defs.extend(self.adapters.iter().cloned());
        defs
    }

    /// The model's own parameters (no adapters) with the layers' stacked (`scan`) or one set
    /// per layer.
    fn base_param_defs(&self, scan: bool) -> Vec<ParamDef> {
        let c = &self.config;
        let mut defs = vec![ParamDef::new(
            "token_embedder.embedding",
            &[c.vocab, c.emb],
            &["vocab", "embed"],
            ParamInit::Normal(1.0),
        )];
        for s in &self.stacks {
            defs.extend(s.param_defs(&self.family.layer_params(c, s.kind), scan));
        }
        defs.extend(self.family.final_norm(c).params("decoder.decoder_norm", c.emb));
        if !c.logits_via_embedding {
            defs.push(ParamDef::new(
                "decoder.logits_dense.kernel",
                &[c.emb, c.vocab],
                &["embed", "vocab"],
                ParamInit::FanIn(c.emb),
            ));
        }
        // Last, so that the models without it draw every other parameter as before.
        if let Some(positions) = c.trainable_position_size {
            defs.push(ParamDef::new(
                "decoder.position_embedder.embedding",
                &[positions, c.emb],
                &["vocab", "embed"],
                ParamInit::Normal(1.0),
            ));
        }
        defs.extend(self.family.decoder_params(c));
        defs
    }

    /// With LoRA, the start-up line: the adapted projections and how much of the model trains.
    pub fn lora_summary(&self) -> Option<String> {
        let lora = self.config.lora.as_ref()?;
        let trained: u64 = self.adapters.iter().map(ParamDef::size).sum();
        let mut kernels: Vec<&str> =
            self.adapters.iter().filter_map(|d| d.name.strip_suffix(".kernel_lora_a")).collect();
        let count = kernels.len();
        kernels.truncate(3);
        Some(format!(
            "lora: rank {}, alpha {} (x{}), {count} projections adapted ({}{}) by {:?}; {trained} parameters train ({:.2}% of {}), the rest are frozen",
            lora.rank,
            lora.alpha,
            lora.scale(),
            kernels.join(", "),
            if count > 3 { ", ..." } else { "" },
            lora.module_path,
            100.0 * trained as f64 / self.num_params() as f64,
            self.num_params(),
        ))
    }

    /// Whether parameter `name` is a LoRA adapter.
    pub fn is_adapter(&self, name: &str) -> bool {
        self.adapters.iter().any(|d| d.name == name)
    }

    /// The number of parameters.
    pub fn num_params(&self) -> u64 {
        self.param_defs().iter().map(ParamDef::size).sum()
    }

    /// Declares every parameter as an input `{prefix}.{name}` of `sig` (in `weight_dtype`),
    /// sharded by the logical rules when the signature has a mesh.
    pub fn declare_params(&self, sig: &mut Signature, prefix: &str) {
        params::declare(sig, &self.param_defs(), self.config.weight_dtype, &self.config.rules, prefix);
    }

    /// The fp8 state (`quantization=fp8`, see `fp8`): for each quantized product of a layer
    /// (`Family::fp8_products`), named as the parameters are (`decoder.layers.mlp.wo.input_scale`,
    /// ...); none otherwise.
    pub fn fp8_state_defs(&self) -> Vec<ParamDef> {
        let c = &self.config;
        if c.fp8 != Some(Scaling::Delayed) {
            return vec![];
        }
        let stacks = self.stacks.iter();
        stacks.flat_map(|s| fp8::stack_state_defs(&self.family.fp8_products(c, s.kind), s, c.scan_layers)).collect()
    }

    /// Draws every parameter from `key` (`random::key(ctx, init_weights_seed)`). Unscanned
    /// layers get the values the scanned model draws, stacked, sliced layer by layer: one random
    /// computation per kind of layer parameter instead of one per layer and kind, which XLA
    /// compiles several times faster (issue 27: on an H100 the unscanned init took 22.8 s, the
    /// scanned 2.3 s), and a model initializes the same whether its layers are scanned or not.
    ///
    /// The adapters are drawn from their own stream of `key` (`LORA_STREAM`), so that the model's
    /// parameters are the same with and without them.
    pub fn init_params(&self, key: &Tensor) -> Tree {
        let stacked = params::init(&self.base_param_defs(true), self.config.weight_dtype, key);
        let mut params = match self.config.scan_layers {
            true => stacked,
            false => unstack_layers(&stacked, self.base_param_defs(false), &self.stacks),
        };
        let lora_key = random::fold_in(key, LORA_STREAM);
        params.extend(params::init(&self.adapters, self.config.weight_dtype, &lora_key));
        params
    }

    /// Embeds `batch["inputs"]` (`s32[batch, seq]`), runs the decoder layers and the final
    /// norm, and returns f32 logits. `inputs_position` and `inputs_segmentation`, when the batch
    /// has them, give each token's position (RoPE, learned position embeddings) and document.
    /// With `keep_layer_outputs` the output of every layer is returned too (for tests; it costs
    /// memory).
    pub fn forward(&self, params: &Tree, batch: &Tree, keep_layer_outputs: bool) -> Forward {
        self.forward_in_order(params, batch, None, keep_layer_outputs)
    }

    /// `forward` on a batch whose sequence is in `order` (load-balanced over the context axis,
    /// `context_parallel::reorder_batch`), which attention's mask follows.
    pub fn forward_in_order(
        &self,
        params: &Tree,
        batch: &Tree,
        order: Option<Order>,
        keep_layer_outputs: bool,
    ) -> Forward {
        let (embeddings, y, layer_outputs, aux_losses) = self.hidden(params, batch, order, keep_layer_outputs);
        Forward { embeddings, layer_outputs, logits: self.head(params, &y), aux_losses }
    }

    /// `forward_in_order` up to the head: the embeddings, the last layer's output `[batch, seq,
    /// emb]`, the layer outputs when asked for, and the auxiliary losses.
    fn hidden(
        &self,
        params: &Tree,
        batch: &Tree,
        order: Option<Order>,
        keep_layer_outputs: bool,
    ) -> (Tensor, Tensor, Option<Tensor>, Tree) {
        let c = &self.config;
        let mut ctx = LayerContext::new(c, batch).in_order(order);
        let x = self.embed(params, &batch["inputs"], &ctx.positions);
        ctx.per_layer_inputs = self.family.per_layer_inputs(c, params, &batch["inputs"], &x);
        let (y, layer_outputs, aux_losses) = self.run_stacks(params, &x, &ctx, keep_layer_outputs);
        (x, y, layer_outputs, aux_losses)
    }

    /// The embeddings `[batch, seq, emb]` (in `dtype`) of `tokens: s32[batch, seq]` at
    /// `positions` (learned position embeddings are added when the model has them).
    pub fn embed(&self, params: &Tree, tokens: &Tensor, positions: &Tensor) -> Tensor {
        let c = &self.config;
        let mut x = embed(c, &params["token_embedder.embedding"].astype(c.dtype), tokens);
        if c.trainable_position_size.is_some() {
            let table = params["decoder.position_embedder.embedding"].astype(c.dtype);
            x = x + &embed(c, &table, positions);
        }
        constrain(c, x, BTE)
    }

    /// The f32 logits `[batch, seq, vocab]` of the last layer's output `y: [batch, seq, emb]`:
    /// the family's final norm, then the output projection (or the embedding, tied).
    pub fn head(&self, params: &Tree, y: &Tensor) -> Tensor {
        let (params, y, weights) = &fence_head(params, y, &self.output_weights(params));
        self.logits(params, y, weights)
    }

    /// The output projection's weights as the product reads them.
    fn output_weights(&self, params: &Tree) -> Tensor {
        let c = &self.config;
        let in_f32 = |x: &Tensor| if c.logits_dot_in_fp32 { x.astype(DType::F32) } else { x.clone() };
        // Tied, MaxText's `attend_on_embedding` (`src/maxtext/layers/embeddings.py` at e591f30)
        // is `jnp.dot(y, jnp.asarray(table, jnp.bfloat16).T, preferred_element_type=attend_dtype)`:
        // the table is rounded to bf16 whatever `dtype` is (and promoted back to `y`'s dtype for
        // the product), so its gradient through the logits is rounded to bf16 too. Otherwise
        // MaxText's `logits_dot_in_fp32` (`Decoder.apply_output_head` in
        // `src/maxtext/layers/decoders.py`, e591f30) makes the product f32.
        match c.logits_via_embedding {
            true => in_f32(&params["token_embedder.embedding"].astype(DType::BF16).astype(c.dtype)),
            false => {
                let dtype = if c.logits_dot_in_fp32 { DType::F32 } else { c.dtype };
                params["decoder.logits_dense.kernel"].astype(dtype)
            }
        }
    }

    /// The final norm and the f32 logits `[batch, seq, vocab]` of `y: [batch, seq, emb]`, given
    /// the output projection's `weights` (`output_weights`).
    fn logits(&self, params: &Tree, y: &Tensor, weights: &Tensor) -> Tensor {
        let c = &self.config;
        let in_f32 = |x: &Tensor| if c.logits_dot_in_fp32 { x.astype(DType::F32) } else { x.clone() };
        let y = self.family.final_norm(c).apply(params, "decoder.decoder_norm", y);
        let logits = if c.logits_via_embedding {
            let mut logits = einsum("btd,vd->btv", &[&in_f32(&y), weights]);
            if c.normalize_embedding_logits {
                logits = logits * (1.0 / (c.emb as f64).sqrt());
            }
            match c.final_logits_soft_cap {
                Some(cap) => (logits / cap).tanh() * cap,
                None => logits,
            }
        } else {
            in_f32(&y).matmul(weights)
        };
        constrain(c, logits.astype(DType::F32), &["activation_batch", "activation_length", "activation_vocab"])
    }

    /// The final norm, logits and [`loss_from_logits`]'s summed loss and aux values of the last
    /// layer's output `y` on `batch` (a pipeline's last stage; the layers' auxiliary losses are
    /// the stages' to add).
    pub fn head_loss(&self, params: &Tree, y: &Tensor, batch: &Tree, z_loss_multiplier: f64) -> (Tensor, Tree) {
        let (targets, segmentation) = (&batch["targets"], &batch["targets_segmentation"]);
        if self.config.vocab_tiles > 1 {
            let sums = self.tiled_loss_sums(params, y, targets, segmentation, z_loss_multiplier);
            return loss_from_sums(sums, segmentation);
        }
        loss_from_logits(&self.head(params, y), targets, segmentation, z_loss_multiplier)
    }

    /// The masked sums of [`masked_sums`] (cross-entropy with the z-loss term, and the z-loss
    /// term alone) over the head's logits of `y: [batch, seq, emb]`, computed in
    /// `num_vocab_tiling` tiles of the tokens, one after another: MaxText's vocabulary tiling
    /// (`vocab_tiling_nnx_loss`, `src/maxtext/utils/vocabulary_tiling.py` at e591f30, which
    /// `loss_fn` in `trainers/pre_train/train.py` calls with `num_vocab_tiling > 1`). A scan over
    /// the tiles whose body is a rematerialization region that keeps nothing: the forward pass
    /// holds one tile's logits at a time, and the backward pass (a reverse scan) recomputes each
    /// tile's norm and logits from the tile's input to differentiate them, as MaxText's custom
    /// VJP does, instead of keeping `[batch, seq, vocab]` logits and their cotangent. The head's
    /// parameters are the scan's constants: their gradients add up over the tiles in their own
    /// dtype (f32 with f32 weights, as MaxText's accumulator), cast for the product in each tile.
    ///
    /// MaxText's tile `t` is the `t`-th block of the flattened `[batch * seq]` tokens. Here it is
    /// every `num_vocab_tiling`-th token of each row from token `t` on: on a mesh each device's
    /// contiguous run of the sequence (the `context` axis) and its rows (the batch axes) then
    /// split into tiles where they are, where MaxText's blocks re-lay every token out across the
    /// devices first. The loss is a sum over tokens, so the grouping changes only its order of
    /// summation.
    fn tiled_loss_sums(
        &self,
        params: &Tree,
        y: &Tensor,
        targets: &Tensor,
        segmentation: &Tensor,
        z: f64,
    ) -> [Tensor; 2] {
        let c = &self.config;
        let tiles = c.vocab_tiles;
        let (rows, seq) = (y.shape()[0], y.shape()[1]);
        // [rows, seq, ...] -> [tiles, rows, seq / tiles, ...]: token i * tiles + t of a row is
        // token i of tile t.
        let split = |x: &Tensor, logical: &[&str]| -> Tensor {
            let rest = &x.shape()[2..];
            let dims: Vec<i64> = [rows, seq / tiles, tiles].iter().chain(rest).copied().collect();
            let perm: Vec<usize> = [2, 0, 1].into_iter().chain(3..dims.len()).collect();
            let tiled = x.reshape(&dims).transpose(&perm);
            let Some(mesh) = tiled.trace().mesh().cloned() else { return tiled };
            let spec = c.rules.spec(logical, &mesh);
            let dims = std::iter::once(vec![]).chain((0..spec.rank()).map(|d| spec.dim(d).to_vec()));
            tiled.with_sharding_constraint(&PartitionSpec::from_axes(dims.collect()))
        };
        let xs: Tree = [
            ("y", split(y, BTE)),
            ("targets", split(targets, &BTE[..2])),
            ("segmentation", split(segmentation, &BTE[..2])),
        ]
        .into_iter()
        .collect();
        let head = self.head_params(params);
        let zero = y.trace().scalar(0.0, DType::F32);
        let carry: Tree = [("xent", zero.clone()), ("z_loss", zero)].into_iter().collect();
        let (sums, _) = scan(&carry, &xs, |acc, tile| {
            let mut inputs = head.prefixed("head");
            inputs.extend(tile.clone());
            // Nothing to fence: the backward scan's results (the tiles' input cotangents and the
            // weights' summed gradients) all leave the loop together.
            let fences = RematFences { inputs: false, cotangents: false, wait_for_cotangents: false };
            let sums = checkpoint(&RematPolicy::Full, fences, &inputs, |t| {
                let head = t.subtree("head");
                let logits = self.logits(&head, &t["y"], &self.output_weights(&head));
                let [xent, z_loss] = masked_sums(&logits, &t["targets"], &t["segmentation"], z);
                [("xent", xent), ("z_loss", z_loss)].into_iter().collect()
            });
            let acc: Tree = acc.map(|name, a| a + &sums[name]);
            (acc, Tree::new())
        });
        [sums["xent"].clone(), sums["z_loss"].clone()]
    }

    /// The parameters the head reads (the final norm's and the output projection's), with
    /// `vocab_tiling_ag_once` laid out whole over the axes that shard their `embed` dimension
    /// (MaxText's `get_physical_spec_without_axes` over `FSDP_MESH_AXES + ("context",
    /// "context_usp_ulysses", "expert")`, `vocabulary_tiling.py` at e591f30): the product in each
    /// tile reads them without gathering them again, and their summed gradient is held whole too.
    fn head_params(&self, params: &Tree) -> Tree {
        let c = &self.config;
        let weight = if c.logits_via_embedding { "token_embedder.embedding" } else { "decoder.logits_dense.kernel" };
        let is_head = |n: &str| n == weight || n.starts_with("decoder.decoder_norm.");
        let head: Tree = params.iter().filter(|(n, _)| is_head(n)).map(|(n, p)| (n, p.clone())).collect();
        let mesh = head.values().next().and_then(|p| p.trace().mesh().cloned());
        let mesh = match mesh {
            Some(mesh) if c.vocab_tiling_ag_once => mesh,
            _ => return head,
        };
        const GATHERED: [&str; 5] = ["fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"];
        let defs = self.base_param_defs(c.scan_layers);
        head.map(|name, p| {
            let def = defs.iter().find(|d| d.name == name).expect("a head parameter is the model's");
            let spec = c.rules.spec(&def.logical, &mesh);
            let keep = |d: usize| spec.dim(d).iter().filter(|a| !GATHERED.contains(&a.as_str())).cloned().collect();
            p.with_sharding_constraint(&PartitionSpec::from_axes((0..spec.rank()).map(keep).collect()))
        })
    }

    /// MaxText's loss on a batch tree with `inputs`, `targets` (s32 `[batch, seq]`) and
    /// `targets_segmentation` (s32, 0 = padding): per token `logsumexp(logits) - logits[target]`
    /// plus `z_loss_multiplier * logsumexp^2`, masked by `targets_segmentation != 0`, summed and
    /// divided by the number of unmasked tokens; plus the layers' auxiliary losses. Returns the
    /// loss and an aux tree with `total_loss` (the masked sum), `total_weights` (the token
    /// count), `z_loss` (its masked mean part of the loss) and `aux_losses.<name>` (each
    /// auxiliary loss, averaged over layers), all f32 scalars.
    pub fn loss(&self, params: &Tree, batch: &Tree, z_loss_multiplier: f64) -> (Tensor, Tree) {
        // MaxText reorders the train and eval batches for load-balanced context parallelism
        // (`setup_train_loop`, utils/train_utils.py:306-331 at e591f30).
        let (batch, order) = context_parallel::reorder_batch(&self.config.context_parallel, batch);
        let (_, y, _, aux_losses) = self.hidden(params, &batch, order, false);
        let (mut loss, mut aux) = self.head_loss(params, &y, &batch, z_loss_multiplier);
        for (_, value) in aux_losses.iter() {
            loss = loss + &value.astype(DType::F32);
        }
        aux.extend(aux_losses.map(|_, v| v.astype(DType::F32)).prefixed("aux_losses"));
        (loss, aux)
    }

    /// TFLOPs of one train step on one device (MaxText's `calculate_tflops_training_per_device`
    /// in `src/maxtext/utils/maxtext_utils.py`): every matmul counted on the per-device batch,
    /// forward + backward = 3 x forward.
    pub fn training_tflops_per_device(&self, shape: &StepShape) -> StepTflops {
        let c = &self.config;
        let seq = shape.max_target_length as f64;
        let tokens = shape.per_device_batch_size * seq;
        let (mut weights, mut attention) = (0.0, 0.0);
        for s in &self.stacks {
            let layer = self.family.layer_flops(c, s.kind, tokens, seq);
            weights += layer.weights * s.count as f64;
            attention += layer.attention * s.count as f64;
        }
        let unembedding = 2.0 * tokens * c.emb as f64 * c.vocab as f64;
        let scale = 3.0 / 1e12 * shape.gradient_accumulation_steps as f64;
        let learnable_weight = (weights + unembedding) * scale;
        let attention = attention * scale;
        StepTflops { total: learnable_weight + attention, learnable_weight, attention }
    }
}

/// The head's input `y`, its final norm's parameters and its output projection's `weights` (as
/// the product reads them, bf16 in a bf16 model) behind one `fence_cotangents`: the backward pass
/// computes the head's weight gradients before it goes on into the last layer, as MaxText's step
/// does, instead of keeping the `[batch, seq, vocab]` logits cotangent alive for a product XLA
/// may defer to the end (issue 46: 0.98 GiB more than MaxText at the peak for llama2-7b with
/// 4 x 4096 tokens per device). Fenced as the product reads them, the weights' gradient is held
/// in that dtype, as in MaxText's step; the f32 copy is left to the optimizer.
fn fence_head(params: &Tree, y: &Tensor, weights: &Tensor) -> (Tree, Tensor, Tensor) {
    let norm: Vec<&str> = params.names().filter(|n| n.starts_with("decoder.decoder_norm.")).collect();
    let inputs: Vec<&Tensor> = norm.iter().map(|&n| &params[n]).chain([y, weights]).collect();
    let mut fenced = fence_cotangents(&inputs);
    let weights = fenced.pop().expect("the fence returns its inputs");
    let y = fenced.pop().expect("the fence returns its inputs");
    let mut params = params.clone();
    for (name, p) in norm.into_iter().zip(fenced) {
        params.insert(name, p);
    }
    (params, y, weights)
}

/// The embeddings `[batch, seq, emb]` of `tokens` (or positions) from `table: [rows, emb]` (in `dtype`).
///
/// With `use_iota_embed` (MaxText's `Embed.__call__` in `src/maxtext/layers/embeddings.py`,
/// main at e591f30) a one-hot matmul, `one_hot(tokens) @ table`, whose gradient is a matmul too.
/// Otherwise a gather, whose gradient is a scatter-add into the table. The table's `embed`
/// dimension is sharded (over `fsdp`) while activations shard the batch over the same axes; the
/// gather's result is first laid out with the table's `embed` sharding and the batch over the
/// remaining batch axes, so that both the lookup and, in the backward pass, the scatter-add work
/// on matching shards: going from batch-sharded activations straight to the table's layout is
/// an "involuntary full rematerialization" for XLA's SPMD partitioner (it replicates the whole
/// `[batch, seq, emb]` cotangent first).
///
/// The one-hot is as large as the logits (`[batch, seq, vocab]`) and the table's gradient reads
/// it: kept for the backward pass it holds 1 GiB per device at the A3 Mega seed recipe's peak
/// (issue 46). So the product is a rematerialization region that keeps nothing and whose
/// recomputation waits for the embeddings' cotangent: the backward pass recomputes the one-hot
/// (an iota compare) where the table's gradient needs it, and XLA drops the recomputed product,
/// which that gradient does not read. MaxText keeps the one-hot.
fn embed(c: &ModelConfig, table: &Tensor, tokens: &Tensor) -> Tensor {
    if c.use_iota_embed {
        let inputs: Tree = [("table", table.clone()), ("tokens", tokens.clone())].into_iter().collect();
        let fences = RematFences { inputs: true, cotangents: false, wait_for_cotangents: true };
        let rows = table.shape()[0];
        let out = checkpoint(&RematPolicy::Full, fences, &inputs, |t| {
            [("x", t["tokens"].one_hot(rows, c.dtype).matmul(&t["table"]))].into_iter().collect()
        });
        return out["x"].clone();
    }
    let looked_up = table.take(tokens);
    let Some(mesh) = looked_up.trace().mesh().cloned() else { return looked_up };
    let table_spec = c.rules.spec(&["vocab", "embed"], &mesh);
    let embed_axes = table_spec.dim(1).to_vec();
    let activation = c.rules.spec(BTE, &mesh);
    let batch_axes: Vec<String> = activation.dim(0).iter().filter(|a| !embed_axes.contains(a)).cloned().collect();
    let spec = PartitionSpec::from_axes(vec![batch_axes, vec![], embed_axes]);
    looked_up.with_sharding_constraint(&spec)
}

/// The loss of `Model::loss` given f32 logits.
pub fn loss_from_logits(logits: &Tensor, targets: &Tensor, segmentation: &Tensor, z: f64) -> (Tensor, Tree) {
    loss_from_sums(masked_sums(logits, targets, segmentation, z), segmentation)
}

/// Over the tokens whose `segmentation` is not 0: the sum of each token's cross-entropy
/// `logsumexp(logits) - logits[target]` plus its z-loss term `z * logsumexp^2`, and the sum of
/// the z-loss terms alone (f32 scalars).
fn masked_sums(logits: &Tensor, targets: &Tensor, segmentation: &Tensor, z: f64) -> [Tensor; 2] {
    let vocab = logits.shape()[logits.rank() - 1];
    let log_z = logits.logsumexp(-1);
    let target_logit = (logits * &targets.one_hot(vocab, DType::F32)).sum(&[-1]);
    let weights = segmentation.ne(0).astype(DType::F32);
    let z_term = log_z.square() * z;
    let xent = (&log_z - &target_logit + &z_term) * &weights;
    [xent.sum_all(), (z_term * &weights).sum_all()]
}

/// The loss (the masked sum over the token count) and its aux tree (`Model::loss`) from
/// `masked_sums`' sums.
fn loss_from_sums([total_loss, z_sum]: [Tensor; 2], segmentation: &Tensor) -> (Tensor, Tree) {
    let total_weights = segmentation.ne(0).astype(DType::F32).sum_all();
    let loss = &total_loss / &total_weights.maximum(1.0);
    let z_loss = z_sum / &total_weights.maximum(1.0);
    let aux = Tree::new().with("total_loss", total_loss).with("total_weights", total_weights).with("z_loss", z_loss);
    (loss, aux)
}
