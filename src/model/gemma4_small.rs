//! Gemma 4 small, text only (MaxText's `decoder_block: gemma4_small`: `Gemma4SmallPLE` and
//! `Gemma4SmallDecoderLayer` in `src/maxtext/models/gemma4_small.py`, run by
//! `Decoder._apply_gemma4_small_layers` in `src/maxtext/layers/decoders.py` at e591f30; gemma4-e2b,
//! gemma4-e4b): its layout, per-layer inputs, key/value sharing and FLOPs. Each layer is a Gemma 4
//! layer (`gemma4.rs`: its attention and MLP halves and scalar are called from there) with:
//! - local and global layers in `get_attention_pattern`'s period: 4 local then 1 global under
//!   `model_name=gemma4-e2b`, 5 then 1 under any other name (MaxText picks it by the name);
//! - per-layer inputs (with `hidden_size_per_layer_input` and `vocab_size_per_layer_input`):
//!   once per pass, `(embed_tokens_per_layer[token] * sqrt(width) + norm(x @
//!   per_layer_model_projection * emb^-1/2)) * 2^-1/2`, `[batch, seq, layers, width]` from the
//!   tokens and their embeddings `x`; layer `j`, after its MLP, adds
//!   `post_per_layer_input_norm((gelu(h @ per_layer_input_gate) * input_j) @ per_layer_projection)`
//!   before its `layer_scalar`;
//! - key/value sharing: the last `num_kv_shared_layers` layers have no key or value projections
//!   (nor their norms) and attend over the keys and values, rotated and normed, of the last
//!   earlier layer of their kind (`kv_donor_layer_idx`); with `use_double_wide_mlp` their MLPs
//!   are twice `base_mlp_dim` wide. Decoding, a sharing layer keeps its own cache of its donor's
//!   keys and values, as each of MaxText's `Attention` modules has its `KVCache_0` (MaxText's
//!   vLLM path shares the donor's slot instead, `kv_cache_slot_map`): the same attention, at the
//!   cost of the sharing layers' caches.
//!
//! The four norms around attention and MLP are always there (MaxText's layer ignores
//! `use_post_attn_norm` / `use_post_ffw_norm`; false is refused); they have MaxText's default
//! epsilon 1e-6, the per-layer inputs' norms `normalization_layer_epsilon`.
//!
//! MaxText runs the layers one by one, threading the per-layer inputs and the donors' keys and
//! values through its loop (`scan_layers=true` is refused there: `src/maxtext/configs/types.py:3945`
//! for gemma4-e2b/e4b, `src/maxtext/layers/nnx_decoders.py:458` for the block; pipelines too). maxrs
//! does the same inside one module: the stack is a single module of every layer, each named
//! `decoder.layers_<n>` as MaxText's unscanned modules are, and each a remat region of its own
//! (`Family::remats_its_sub_layers`), whose outputs are its output and a donor's keys and values.
//! The per-layer embedder is the decoder's (`decoder.per_layer_embedder`, `Family::per_layer_inputs`),
//! as in MaxText.
//!
//! Parameters, beyond a Gemma 4 layer's (`gemma4.rs`; `decoder.layers_<n>.<p>`):
//!
//! | name | shape | logical axes | init |
//! |---|---|---|---|
//! | `decoder.per_layer_embedder.embed_tokens_per_layer` | [ple_vocab, layers * width] | vocab, embed_vocab | normal(width^-1/2) |
//! | `decoder.per_layer_embedder.per_layer_model_projection.kernel` | [emb, layers * width] | embed, mlp | fan_in |
//! | `decoder.per_layer_embedder.per_layer_projection_norm.scale` | [width] | norm | ones |
//! | `per_layer_input_gate.kernel` | [emb, width] | embed, mlp | fan_in |
//! | `per_layer_projection.kernel` | [width, emb] | mlp, embed | fan_in |
//! | `post_per_layer_input_norm.scale` | [emb] | norm | ones |
//!
//! A sharing layer has no `self_attention.{key,value}.kernel` nor `self_attention.{key,value}_norm.scale`.

use crate::config::{self, Config};
use crate::ir::{DType, RematFences};
use crate::tensor::{checkpoint, Tensor, Tree};

use super::attention::{rope_tables, LayerContext};
use super::blocks::{dense, Mlp, Norm};
use super::family::{constrain, Family, LayerFlops, LayerOutput, BTE};
use super::gemma4::{scaled, Attention, Gemma4, KeyValue};
use super::params::{ParamDef, ParamInit};
use super::stacks::{sub_layer_name, Stack};
use super::ModelConfig;

/// One layer's place in the model.
#[derive(Clone, Debug)]
struct Layer {
    global: bool,
    /// The layer whose keys and values it attends over instead of its own.
    donor: Option<usize>,
    /// Later layers attend over its keys and values.
    donates: bool,
}

/// Gemma 4 E2B/E4B's decoder: Gemma 4 layers with per-layer inputs and shared keys and values.
#[derive(Debug)]
pub struct Gemma4Small {
    base: Gemma4,
    layers: Vec<Layer>,
    /// `use_double_wide_mlp`: the sharing layers' MLPs are twice as wide.
    double_wide: bool,
    /// The per-layer inputs' width and the rows of their embedding (both positive), if any.
    per_layer: Option<(i64, i64)>,
    /// `normalization_layer_epsilon`: the per-layer inputs' norms.
    eps: f64,
}

/// The period of the local and global layers (`get_attention_pattern`'s length, `gemma4_small.py`
/// at MaxText e591f30): 5 under `model_name=gemma4-e2b`, 6 under any other name; the last layer of
/// each period is global.
pub fn period(model_name: &str) -> i64 {
    if model_name == "gemma4-e2b" {
        5
    } else {
        6
    }
}

/// The layers in `period`s, the last of each global, and the sharing layers' donors
/// (`kv_donor_layer_idx`): `None` for a sharing layer that has no earlier layer of its kind.
fn layout(model_name: &str, layers: i64, shared: i64) -> Vec<(bool, Option<Option<usize>>)> {
    let period = period(model_name);
    let global: Vec<bool> = (0..layers).map(|j| j % period == period - 1).collect();
    // `first_kv_shared_layer_idx` and `is_kv_shared_layer`: no sharing when every layer would share.
    let first = if shared > 0 { (layers - shared).max(0) as usize } else { layers as usize };
    (0..layers as usize)
        .map(|j| {
            let donor = (j >= first && first > 0).then(|| (0..first).rev().find(|&i| global[i] == global[j]));
            (global[j], donor)
        })
        .collect()
}

impl Gemma4Small {
    pub fn from_config(c: &Config, mc: &ModelConfig) -> anyhow::Result<Gemma4Small> {
        if c.scan_layers {
            return Err(anyhow::anyhow!(
                "scan_layers=true: gemma4_small's layers read earlier layers' keys and values, which MaxText does not scan (src/maxtext/configs/types.py:3945 and src/maxtext/layers/nnx_decoders.py:458 at e591f30 refuse it); set scan_layers=false"
            ));
        }
        if c.ici_pipeline_parallelism > 1 || c.dcn_pipeline_parallelism > 1 {
            return Err(anyhow::anyhow!(
                "ici_pipeline_parallelism={}, dcn_pipeline_parallelism={}: MaxText runs gemma4_small without pipeline stages (src/maxtext/layers/nnx_decoders.py:458 at e591f30 refuses them); use 1",
                c.ici_pipeline_parallelism,
                c.dcn_pipeline_parallelism
            ));
        }
        if mc.fp8.is_some() || mc.lora.is_some() {
            let what = if mc.lora.is_some() { "LoRA (lora.enable_lora)" } else { "fp8 quantization" };
            return Err(anyhow::anyhow!(
                "{what} is not supported yet with decoder_block=gemma4_small; train it without"
            ));
        }
        for (key, on) in [("use_post_attn_norm", c.use_post_attn_norm), ("use_post_ffw_norm", c.use_post_ffw_norm)] {
            if !on {
                return Err(anyhow::anyhow!(
                    "{key}=false: gemma4_small's layers always norm their attention and MLP outputs (MaxText's Gemma4SmallDecoderLayer ignores the key); set it true, as the model files do"
                ));
            }
        }
        let (width, rows) = (c.hidden_size_per_layer_input, c.vocab_size_per_layer_input);
        let per_layer = match (width, rows) {
            (0, 0) => None,
            (w, r) if w > 0 && r > 0 => Some((w, r)),
            _ => {
                return Err(anyhow::anyhow!(
                    "hidden_size_per_layer_input={width}, vocab_size_per_layer_input={rows}: per-layer inputs need both positive (MaxText builds the layers' gates without the embedding, or the reverse, and never applies them), which is not supported yet; set both (256 and 262144 in the model files) or both 0"
                ))
            }
        };
        let layers = c.base_num_decoder_layers << config::parameter_scales(c.global_parameter_scale).3;
        let mut placed = Vec::new();
        for (j, (global, donor)) in layout(&c.model_name, layers, c.num_kv_shared_layers).into_iter().enumerate() {
            let donor = match donor {
                Some(None) => {
                    let kind = if global { "global" } else { "local" };
                    return Err(anyhow::anyhow!(
                        "num_kv_shared_layers={}: layer {j} ({kind}) would reuse the keys and values of an earlier {kind} layer, but none of the first {} layers is one (MaxText fails there); use fewer shared layers",
                        c.num_kv_shared_layers,
                        layers - c.num_kv_shared_layers
                    ));
                }
                Some(Some(d)) => Some(d),
                None => None,
            };
            placed.push(Layer { global, donor, donates: false });
        }
        for j in 0..placed.len() {
            if let Some(d) = placed[j].donor {
                placed[d].donates = true;
            }
        }
        Ok(Gemma4Small {
            base: Gemma4::from_config(c, mc)?,
            layers: placed,
            double_wide: c.use_double_wide_mlp,
            per_layer,
            eps: c.normalization_layer_epsilon,
        })
    }

    /// Layer `j`'s attention.
    fn attention(&self, j: usize) -> &Attention {
        match self.layers[j].global {
            true => &self.base.global,
            false => &self.base.local,
        }
    }

    /// Layer `j`'s MLP width.
    fn mlp_width(&self, c: &ModelConfig, j: usize) -> i64 {
        match self.double_wide && self.layers[j].donor.is_some() {
            true => 2 * c.mlp,
            false => c.mlp,
        }
    }

    /// Layer `j`'s parameters, named relative to it: a Gemma 4 layer's, without key and value
    /// projections when it shares, with its MLP's width, and the per-layer input's.
    fn sub_layer_params(&self, c: &ModelConfig, j: usize) -> Vec<ParamDef> {
        let shares = self.layers[j].donor.is_some();
        let own_kv =
            ["self_attention.key.", "self_attention.value.", "self_attention.key_norm.", "self_attention.value_norm."];
        let wide = Mlp::new(c, false, None).params("mlp", c.emb, self.mlp_width(c, j));
        let mut defs: Vec<ParamDef> = self
            .base
            .sub_layer_params(c, self.attention(j))
            .into_iter()
            .filter(|d| !(shares && own_kv.iter().any(|p| d.name.starts_with(p))))
            .map(|d| wide.iter().find(|w| w.name == d.name).cloned().unwrap_or(d))
            .collect();
        if let Some((width, _)) = self.per_layer {
            let e = c.emb;
            defs.push(ParamDef::dense_kernel(
                "per_layer_input_gate.kernel",
                &[e, width],
                &["embed", "mlp"],
                ParamInit::FanIn(e),
                1,
            ));
            defs.push(ParamDef::dense_kernel(
                "per_layer_projection.kernel",
                &[width, e],
                &["mlp", "embed"],
                ParamInit::FanIn(width),
                1,
            ));
            defs.extend(Norm::Rms { eps: self.eps }.params("post_per_layer_input_norm", e));
        }
        defs
    }

    /// The per-layer input block of a layer (`Gemma4SmallDecoderLayer.__call__`) on `h`, with its
    /// slice `input: [batch, seq, width]` of the per-layer inputs.
    fn per_layer_block(&self, c: &ModelConfig, p: &Tree, h: &Tensor, input: &Tensor) -> Tensor {
        let wide = if c.dtype == DType::F64 { DType::F64 } else { DType::F32 };
        // `jax.nn.gelu(approximate=True)` on the gate in f32, then back in `dtype`.
        let gate = dense(c, p, "per_layer_input_gate", h, 1).astype(wide).gelu().astype(c.dtype);
        let projected = dense(c, p, "per_layer_projection", &(gate * &input.astype(c.dtype)), 1);
        let normed = Norm::Rms { eps: self.eps }.apply(p, "post_per_layer_input_norm", &projected);
        constrain(c, h + &constrain(c, normed, BTE), BTE)
    }
}

impl Family for Gemma4Small {
    /// One single module of every layer, `decoder.layers_<n>` (`LayerNames::PerSubLayer`).
    fn stacks(&self, _c: &ModelConfig) -> Vec<Stack> {
        vec![Stack::single("layers", 0).per_sub_layer(self.layers.len() as i64, 0)]
    }

    fn layer_params(&self, c: &ModelConfig, _kind: usize) -> Vec<ParamDef> {
        (0..self.layers.len())
            .flat_map(|j| {
                let name = sub_layer_name(j as i64);
                self.sub_layer_params(c, j).into_iter().map(move |d| ParamDef { name: name(&d.name), ..d })
            })
            .collect()
    }

    /// `Gemma4SmallPLE`'s parameters (`decoder.per_layer_embedder`), with per-layer inputs.
    fn decoder_params(&self, c: &ModelConfig) -> Vec<ParamDef> {
        let Some((width, rows)) = self.per_layer else { return vec![] };
        let packed = self.layers.len() as i64 * width;
        let prefix = "decoder.per_layer_embedder";
        let mut defs = vec![
            ParamDef::new(
                &format!("{prefix}.embed_tokens_per_layer"),
                &[rows, packed],
                &["vocab", "embed_vocab"],
                ParamInit::Normal((width as f64).powf(-0.5)),
            ),
            ParamDef::dense_kernel(
                &format!("{prefix}.per_layer_model_projection.kernel"),
                &[c.emb, packed],
                &["embed", "mlp"],
                ParamInit::FanIn(c.emb),
                1,
            ),
        ];
        defs.extend(Norm::Rms { eps: self.eps }.params(&format!("{prefix}.per_layer_projection_norm"), width));
        defs
    }

    /// `Gemma4SmallPLE.__call__`: the tokens' rows of the per-layer embedding times `sqrt(width)`,
    /// plus the normed projection of their embeddings times `emb^-1/2`, times `2^-1/2`, in `dtype`
    /// (MaxText's constants are in `dtype` too).
    fn per_layer_inputs(&self, c: &ModelConfig, params: &Tree, tokens: &Tensor, x: &Tensor) -> Option<Tensor> {
        let (width, _) = self.per_layer?;
        let p = params.subtree("decoder.per_layer_embedder");
        let shape = [tokens.shape()[0], tokens.shape()[1], self.layers.len() as i64, width];
        let identity = p["embed_tokens_per_layer"].astype(c.dtype).take(tokens) * (width as f64).sqrt();
        let context = dense(c, &p, "per_layer_model_projection", x, 1) * (c.emb as f64).powf(-0.5);
        let context = Norm::Rms { eps: self.eps }.apply(&p, "per_layer_projection_norm", &context.reshape(&shape));
        Some(((identity.reshape(&shape) + &context) * 0.5f64.sqrt()).astype(c.dtype))
    }

    /// Each layer (MaxText's `layers_<n>`) is a remat region of its own, as MaxText's are.
    fn remats_its_sub_layers(&self) -> bool {
        true
    }

    /// `Decoder._apply_gemma4_small_layers`: layer by layer, each donor's keys and values kept for
    /// the layers that reuse them, each layer's slice of the per-layer inputs. Outside decoding each
    /// layer is a remat region (`remat_policy`) whose inputs are its parameters, its input, its
    /// per-layer input and the keys and values it reuses, and whose outputs are its output and, a
    /// donor's, its keys and values.
    fn layer(&self, c: &ModelConfig, _kind: usize, p: &Tree, x: &Tensor, ctx: &LayerContext) -> LayerOutput {
        let mut donated: Vec<Option<KeyValue>> = vec![None; self.layers.len()];
        let mut x = x.clone();
        for (j, layer) in self.layers.iter().enumerate() {
            let mut inputs = p.subtree(&format!("layers_{j}")).prefixed("params").with("x", x);
            if let Some(d) = layer.donor {
                let (k, v) = donated[d].clone().expect("a donor precedes the layers reusing it");
                inputs.extend(Tree::new().with("key", k).with("value", v).prefixed("reused"));
            }
            if self.per_layer.is_some() {
                let all = ctx.per_layer_inputs.as_ref().expect("the decoder computes Family::per_layer_inputs");
                inputs.insert("per_layer", all.slice_axis(2, j as i64, j as i64 + 1).squeeze(2));
            }
            let sub_layer = |a: &Tree| -> Tree {
                let own = a.subtree("params");
                let a_j = self.attention(j);
                // The tables are computed inside the region (cheap, elementwise) rather than
                // captured: they would be a full-size input of every region otherwise.
                let (cos, sin) = rope_tables(&ctx.positions, &a_j.rope);
                let reused = a.get("reused.key").map(|k| (k.clone(), a["reused.value"].clone()));
                let (h, (k, v)) = self.base.attention_block(c, &own, &a["x"], ctx, a_j, (&cos, &sin), reused.as_ref());
                let (h, _) = self.base.feed_forward(c, &own, &h);
                let h = match a.get("per_layer") {
                    Some(input) => self.per_layer_block(c, &own, &h, input),
                    None => h,
                };
                let out = Tree::new().with("x", scaled(c, &own, &h));
                match layer.donates {
                    true => out.with("kv.key", k).with("kv.value", v),
                    false => out,
                }
            };
            let out = match ctx.decoding() {
                true => sub_layer(&inputs),
                false => {
                    let fences =
                        RematFences { inputs: c.remat_prevent_cse, cotangents: true, wait_for_cotangents: false };
                    checkpoint(&c.remat, fences, &inputs, sub_layer)
                }
            };
            if layer.donates {
                donated[j] = Some((out["kv.key"].clone(), out["kv.value"].clone()));
            }
            x = out["x"].clone();
        }
        LayerOutput::new(x)
    }

    /// MaxText's `calculate_gemma4_small_tflops_training_per_device` (`src/maxtext/utils/maxtext_utils.py`
    /// at e591f30): each layer's attention (`Gemma4::attention_flops`, key and value projections
    /// only where it has them), its MLP at its width, and the per-layer inputs' projection, gates
    /// and projections.
    fn layer_flops(&self, c: &ModelConfig, _kind: usize, tokens: f64, seq: f64) -> LayerFlops {
        let e = c.emb as f64;
        let matrices = c.mlp_activations.len() as f64 + 1.0;
        let (mut weights, mut attention) = (0.0, 0.0);
        for (j, layer) in self.layers.iter().enumerate() {
            let kv_projections = if layer.donor.is_some() { 0.0 } else { 2.0 };
            let a = self.base.attention_flops(c, self.attention(j), kv_projections, tokens, seq);
            weights += a.weights + 2.0 * tokens * e * self.mlp_width(c, j) as f64 * matrices;
            attention += a.attention;
        }
        if let Some((width, _)) = self.per_layer {
            let layers = self.layers.len() as f64;
            weights += 2.0 * tokens * e * layers * width as f64 + layers * 4.0 * tokens * e * width as f64;
        }
        LayerFlops { weights, attention }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Model;

    /// MaxText's donors by hand (`kv_donor_layer_idx`): gemma4-e2b's 35 layers in periods of 5
    /// share from layer 15 on, the local ones reusing layer 13's keys and values, the global ones
    /// (19, 24, ...) layer 14's; gemma4-e4b's 42 in periods of 6 from 24 on, from 22 and 23.
    #[test]
    fn donors_are_the_last_earlier_layer_of_the_kind() {
        let e2b = super::layout("gemma4-e2b", 35, 20);
        assert_eq!(e2b[14], (true, None));
        assert_eq!(e2b[15], (false, Some(Some(13))));
        assert_eq!(e2b[19], (true, Some(Some(14))));
        assert_eq!(e2b[34], (true, Some(Some(14))));
        let e4b = super::layout("gemma4-e4b", 42, 18);
        assert_eq!(e4b[23], (true, None));
        assert_eq!(e4b[24], (false, Some(Some(22))));
        assert_eq!(e4b[29], (true, Some(Some(23))));
        // Every layer would share: none does (`is_kv_shared_layer`'s `first > 0`).
        assert!(super::layout("gemma4-e4b", 6, 6).iter().all(|(_, d)| d.is_none()));
        let five = super::layout("gemma4-e4b", 6, 5);
        assert_eq!((five[1], five[5]), ((false, Some(Some(0))), (true, Some(None))));
    }

    /// The model files' parameter counts by hand, and their names: gemma4-e2b (35 layers, emb 1536,
    /// 8 heads, 1 kv head, head 256 / global 512, MLP 6144 and 12288 on its 20 sharing layers) and
    /// gemma4-e4b (42 layers, emb 2560, 2 kv heads, MLP 10240, 18 sharing layers); per layer q,
    /// out, q norm, (k, v, k norm: the owners), the GeGLU MLP, 4 norms of emb, layer_scalar, the
    /// per-layer gate, projection and norm (width 256); the embedding, the per-layer embedding
    /// (262144 x layers * 256) and its projection and norm, the final norm.
    #[test]
    fn model_files_load_with_maxtext_names() {
        let count = |layers: i64, (e, kv, m): (i64, i64, i64), shared: i64, wide: bool, period: i64| {
            let mut n = 262144 * e + 262144 * layers * 256 + e * layers * 256 + 256 + e;
            for j in 0..layers {
                let d = if j % period == period - 1 { 512 } else { 256 };
                let shares = j >= layers - shared;
                let mlp = if shares && wide { 2 * m } else { m };
                n += 2 * e * 8 * d + d + 3 * e * mlp + 4 * e + 1 + 2 * e * 256 + e;
                if !shares {
                    n += 2 * e * kv * d + d;
                }
            }
            n
        };
        let e2b = Model::from_args(&["model_name=gemma4-e2b", "scan_layers=false"]).unwrap();
        assert_eq!(e2b.num_params() as i64, count(35, (1536, 1, 6144), 20, true, 5));
        let e4b = Model::from_args(&["model_name=gemma4-e4b", "scan_layers=false"]).unwrap();
        assert_eq!(e4b.num_params() as i64, count(42, (2560, 2, 10240), 18, false, 6));
        let shape = |m: &Model, n: &str| m.param_defs().into_iter().find(|d| d.name == n).map(|d| d.shape);
        assert_eq!(shape(&e2b, "decoder.layers_14.self_attention.key.kernel"), Some(vec![1536, 1, 512]));
        assert_eq!(shape(&e2b, "decoder.layers_15.self_attention.key.kernel"), None);
        assert_eq!(shape(&e2b, "decoder.layers_15.mlp.wo.kernel"), Some(vec![12288, 1536]));
        assert_eq!(shape(&e2b, "decoder.layers_34.per_layer_projection.kernel"), Some(vec![256, 1536]));
        let table = "decoder.per_layer_embedder.embed_tokens_per_layer";
        assert_eq!(shape(&e4b, table), Some(vec![262144, 42 * 256]));
    }

    /// What each refusal names, on one line.
    #[test]
    fn refusals_name_the_culprit() {
        let small = ["model_name=gemma4-e2b", "override_model_config=true", "scan_layers=false"];
        let refused = |extra: &[&str], want: &str| {
            let e = Model::from_args(&[&small[..], extra].concat()).err().unwrap_or_default();
            assert!(e.contains(want) && !e.contains('\n'), "{extra:?}: {e}");
        };
        refused(&["scan_layers=true"], "scan_layers=true: gemma4_small's layers read earlier layers'");
        refused(&["use_post_ffw_norm=false"], "use_post_ffw_norm=false: gemma4_small's layers always norm");
        refused(&["vocab_size_per_layer_input=0"], "hidden_size_per_layer_input=256, vocab_size_per_layer_input=0");
        refused(&["num_kv_shared_layers=33"], "num_kv_shared_layers=33: layer 4 (global) would reuse");
        refused(&["quantization=fp8"], "fp8 quantization is not supported yet with decoder_block=gemma4_small");
        refused(&["ici_pipeline_parallelism=2"], "ici_pipeline_parallelism=2, dcn_pipeline_parallelism=1: MaxText");
        let e = Model::from_args(&["model_name=gemma4-31b", "override_model_config=true", "num_kv_shared_layers=2"])
            .err()
            .unwrap_or_default();
        assert!(e.contains("decoder_block=gemma4 does not use num_kv_shared_layers"), "{e}");
    }
}
