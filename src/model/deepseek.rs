//! The DeepSeek decoder layers (MaxText's `decoder_block: deepseek`, `DeepSeekDenseLayer` and
//! `DeepSeekMoELayer` in `src/maxtext/models/deepseek.py`, main at e591f30): pre-norm
//! multi-head latent attention (`mla.rs`), then, after a second RMSNorm, the dense MLP
//! (`mlp.wi_0`, `mlp.wi_1`, `mlp.wo`, as Llama's) or the mixture-of-experts block
//! `DeepSeekMoeBlock_0` (MaxText's `RoutedAndSharedMoE`, `moe.rs`: routed experts `MoeBlock_0`
//! with DeepSeek-V3's router, and `shared_experts`). Embedding, stacking, final norm, logits and
//! loss are the shared decoder's.
//!
//! One layer's parameters: `pre_self_attention_layer_norm.scale`, `self_attention.*` (the MLA
//! table in `mla.rs`), `post_self_attention_layer_norm.scale`, and `mlp.*` (dense) or
//! `DeepSeekMoeBlock_0.MoeBlock_0.{gate.kernel, gate.bias, wi_0, wi_1, wo}` and
//! `DeepSeekMoeBlock_0.shared_experts.{wi_0,wi_1,wo}.kernel` (`moe.rs`), the experts
//! `base_moe_mlp_dim` wide. The first `first_num_dense_layers` layers are dense (stack
//! `dense_layers`), the others routed (`moe_layers`), as MaxText names them. As MaxText's
//! `post_process` and `loss_fn` do, the load-balancing loss is reported by the routed layers only
//! with `load_balance_loss_weight > 0`, and averaged over them.

use crate::config::Config;
use crate::tensor::{Tensor, Tree};

use super::attention::LayerContext;
use super::blocks::{Mlp, Norm};
use super::family::LayerRngs;
use super::family::{constrain, Family, LayerFlops, LayerOutput};
use super::mla::Mla;
use super::moe::{routed_and_shared_block, routed_and_shared_flops, routed_and_shared_param_defs, MoeConfig};
use super::params::ParamDef;
use super::stacks::Stack;
use super::ModelConfig;

/// The residual stream's logical axes in MaxText's DeepSeek layers (`logical_axis_names`).
const ACTIVATIONS: &[&str] = &["activation_batch", "activation_norm_length", "activation_embed"];

/// The experts' block in a layer (MaxText's `RoutedAndSharedMoE`).
const MOE: &str = "DeepSeekMoeBlock_0";

/// The layer kinds (`Stack::kind`): MaxText's `DeepSeekDenseLayer` and `DeepSeekMoELayer`.
const DENSE: usize = 0;
const ROUTED: usize = 1;

/// DeepSeek's layers.
#[derive(Debug)]
pub struct Deepseek {
    pub mla: Mla,
    /// `first_num_dense_layers`: the layers before the routed ones.
    pub dense_layers: i64,
    /// The routed and shared experts of the other layers.
    pub moe: MoeConfig,
    /// The experts' hidden size (MaxText's `moe_mlp_dim`: `base_moe_mlp_dim` scaled as
    /// `base_mlp_dim` is).
    pub moe_mlp: i64,
}

impl Deepseek {
    /// The layers `c` describes, with MaxText's checks of the experts' width
    /// (`src/maxtext/configs/types.py`, e591f30). The MLPs are SwiGLU (DeepSeek's), so other
    /// `mlp_activations` are refused with experts, as in the other MoE families.
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Deepseek> {
        let moe = MoeConfig::deepseek(c)?;
        let routed = mc.layers > c.first_num_dense_layers;
        if c.first_num_dense_layers > mc.layers {
            return Err(anyhow::anyhow!(
                "first_num_dense_layers={}: more than the model's {} layers; use at most {}",
                c.first_num_dense_layers,
                mc.layers,
                mc.layers
            ));
        }
        if routed && c.base_moe_mlp_dim < 1 {
            return Err(anyhow::anyhow!(
                "base_moe_mlp_dim={}: the {} layers after first_num_dense_layers={} have experts, whose hidden size it is; set it",
                c.base_moe_mlp_dim,
                mc.layers - c.first_num_dense_layers,
                c.first_num_dense_layers
            ));
        }
        if c.num_experts > 1 && c.first_num_dense_layers == 0 && c.base_moe_mlp_dim != c.base_mlp_dim {
            return Err(anyhow::anyhow!(
                "base_moe_mlp_dim={}: with every layer routed (first_num_dense_layers=0), MaxText requires base_mlp_dim ({}) to equal it",
                c.base_moe_mlp_dim, c.base_mlp_dim
            ));
        }
        if routed && mc.mlp_activations != ["silu", "linear"] {
            return Err(anyhow::anyhow!(
                "mlp_activations=[{}]: deepseek's experts are SwiGLU MLPs, [silu, linear]; other activations are not supported yet",
                mc.mlp_activations.join(", ")
            ));
        }
        if c.v_head_dim > c.qk_head_dim() {
            return Err(anyhow::anyhow!(
                "v_head_dim={}: maxrs's attention kernels take values at most as wide as the keys \
                 (qk_nope_head_dim + qk_rope_head_dim = {}); wider values are not supported yet",
                c.v_head_dim,
                c.qk_head_dim()
            ));
        }
        let (_, _, mlp_scale, _) = crate::config::parameter_scales(c.global_parameter_scale);
        Ok(Deepseek {
            mla: Mla::from_config(c),
            dense_layers: c.first_num_dense_layers,
            moe,
            moe_mlp: c.base_moe_mlp_dim.max(0) << mlp_scale,
        })
    }
}

impl Family for Deepseek {
    /// MaxText's `DeepSeekGenericLayer` (`src/maxtext/models/deepseek.py` at e591f30) keeps its `rngs` (line 74) and
    /// has a `dropout` (line 176).
    fn layer_rngs(&self, _c: &ModelConfig, _kind: usize) -> Option<LayerRngs> {
        Some(LayerRngs { keeps: true, dropout: true })
    }

    /// MaxText's `dense_layers`, then `moe_layers` (`Decoder` in `src/maxtext/layers/decoders.py`,
    /// e591f30); a stack without layers is left out.
    fn stacks(&self, c: &ModelConfig) -> Vec<Stack> {
        vec![
            Stack::new("dense_layers", self.dense_layers, DENSE),
            Stack::new("moe_layers", c.layers - self.dense_layers, ROUTED),
        ]
    }

    fn layer_params(&self, c: &ModelConfig, kind: usize) -> Vec<ParamDef> {
        let norm = Norm::Rms { eps: c.eps };
        let mut defs = norm.params("pre_self_attention_layer_norm", c.emb);
        defs.extend(self.mla.params("self_attention", c));
        defs.extend(norm.params("post_self_attention_layer_norm", c.emb));
        match kind {
            DENSE => defs.extend(Mlp::new(c, false, None).params("mlp", c.emb, c.mlp)),
            _ => defs.extend(
                routed_and_shared_param_defs(c, &self.moe, c.emb, self.moe_mlp)
                    .into_iter()
                    .map(|def| ParamDef { name: format!("{MOE}.{}", def.name), ..def }),
            ),
        }
        defs
    }

    fn layer(&self, c: &ModelConfig, kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let norm = Norm::Rms { eps: c.eps };
        let x = constrain(c, x.clone(), ACTIVATIONS);
        let h = constrain(c, norm.apply(p, "pre_self_attention_layer_norm", &x), ACTIVATIONS);
        let attention = constrain(c, self.mla.apply(c, p, "self_attention", &h, ctx), ACTIVATIONS);
        let x = x + &attention;
        let h = constrain(c, norm.apply(p, "post_self_attention_layer_norm", &x), ACTIVATIONS);
        if kind == DENSE {
            let mlp = constrain(c, Mlp::new(c, false, None).apply(c, p, "mlp", &h), ACTIVATIONS);
            return LayerOutput::new(constrain(c, mlp + &x, ACTIVATIONS));
        }
        let block = routed_and_shared_block(c, &self.moe, &p.subtree(MOE), &h);
        let out = constrain(c, constrain(c, block.output, ACTIVATIONS) + &x, ACTIVATIONS);
        let mut aux_losses = Tree::new();
        if let Some(loss) = block.load_balance_loss {
            aux_losses.insert("moe_lb_loss", loss);
        }
        LayerOutput { x: out, aux_losses }
    }

    /// MaxText's DeepSeek terms (`calculate_tflops_training_per_device`, e591f30): MLA's
    /// (`Mla::flops`), and the dense MLP or the router, the `num_experts_per_tok` chosen experts
    /// and the shared ones.
    fn layer_flops(&self, c: &ModelConfig, kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let ffn = match kind {
            DENSE => 2.0 * tokens * (c.mlp * c.emb) as f64 * (c.mlp_activations.len() as f64 + 1.0),
            _ => routed_and_shared_flops(&self.moe, c.emb, self.moe_mlp, tokens),
        };
        let attention = self.mla.flops(c, tokens, seq);
        LayerFlops { weights: ffn + attention.weights, attention: attention.attention }
    }
}
