//! Where MaxText's model tree keeps NNX random streams (`nnx.Rngs`), which a MaxText train
//! state saves under `nnx_aux/model/` (`to_checkpoint_dict`, `src/maxtext/common/
//! train_state_nnx.py` at MaxText e591f30) and `maxrs convert to-maxtext` must write. maxrs
//! keeps no random streams; this file owns where MaxText's are, derived from the parameters'
//! names (`stacks.rs`: scanned, unscanned, per sub-layer) and what each family says of its layer
//! module (`Family::layer_rngs`). tests/data/orbax/nnx_streams.json lists MaxText's own, per
//! decoder block and layout (tools/maxtext_nnx_streams.py).
//!
//! In MaxText e591f30's NNX model (`src/maxtext/layers/nnx_decoders.py`, `linears.py`,
//! `src/maxtext/models/*.py`):
//! - every `Dropout` forks an `Rngs` of its own (`linears.py:417`): the decoder's `dropout`, a
//!   layer's `dropout` where its family's layer has one, and each `MlpBlock`'s (the module of a
//!   `wo.kernel` parameter);
//! - other modules keep the `Rngs` they were built with (`self.rngs = rngs`), one object shared:
//!   a layer module where its family's does, each attention's `AttentionOp` (`attention_op`
//!   beside an `out.kernel`), each routed MoE block (the module of a `gate.kernel`). NNX saves a
//!   shared object once, at its first path in sorted order (upper case before lower case), so
//!   only the first of them shows;
//! - the layers of a scanned stack share one `Rngs` per layer (saved stacked over the stack's
//!   layers); the layers built outside a scan (every layer with `scan_layers=false`, Gemma 3's
//!   remainder block) share the decoder's own, which is the decoder's `rngs` unless one of their
//!   modules comes first.

use super::family::Family;
use super::params::ParamDef;
use super::stacks::{LayerNames, Stack};
use super::Model;

/// One `Rngs` of MaxText's model tree: its path under `model/` (ending in `rngs`), and the layers
/// it is stacked over (a scanned stack's), if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RngModule {
    pub path: Vec<String>,
    pub layers: Option<i64>,
}

impl Model {
    /// Every `Rngs` of MaxText's model tree for this model, sorted by path; `None` where a
    /// family does not say what its layer module keeps (`Family::layer_rngs`).
    pub fn rng_modules(&self) -> Option<Vec<RngModule>> {
        let c = &self.config;
        let scan = c.scan_layers;
        let split = |name: &str| -> Vec<String> { name.split('.').map(str::to_string).collect() };
        let mut out = vec![RngModule { path: split("decoder.dropout.rngs"), layers: None }];
        // The holders of the decoder's own `Rngs`: the decoder, then every unscanned layer's.
        let mut decoder_holders = vec![split("decoder.rngs")];
        for s in self.stacks() {
            let (forks, holders) = layer_rngs(self.family.as_ref(), c, s)?;
            if s.scanned(scan) {
                let stacked =
                    |own: &str| RngModule { path: split(&format!("{}.{own}", s.prefix())), layers: Some(s.count) };
                out.extend(forks.iter().map(|own| stacked(own)));
                out.extend(holders.iter().map(|own| split(own)).min().map(|first| stacked(&first.join("."))));
            } else {
                for i in 0..s.count {
                    let named = |own: &String| split(&s.layer_param_name(i, own, scan));
                    out.extend(forks.iter().map(|own| RngModule { path: named(own), layers: None }));
                    decoder_holders.extend(holders.iter().map(named));
                }
            }
        }
        let first = decoder_holders.into_iter().min().expect("the decoder holds its own");
        out.push(RngModule { path: first, layers: None });
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Some(out)
    }
}

/// The `Rngs` of one layer of stack `s`, named as its parameters are within the layer: those its
/// dropouts fork, and the modules that keep the layer's shared one (see the module header).
fn layer_rngs(family: &dyn Family, c: &super::ModelConfig, s: &Stack) -> Option<(Vec<String>, Vec<String>)> {
    let rngs = family.layer_rngs(c, s.kind)?;
    let modules: Vec<String> = match s.names {
        LayerNames::Layer => vec![String::new()],
        LayerNames::PerSubLayer { size, .. } => (0..size).map(|j| format!("layers_{j}.")).collect(),
    };
    let (mut forks, mut holders) = (Vec::new(), Vec::new());
    for m in &modules {
        if rngs.dropout {
            forks.push(format!("{m}dropout.rngs"));
        }
        if rngs.keeps {
            holders.push(format!("{m}rngs"));
        }
    }
    let params: Vec<ParamDef> = family.layer_params(c, s.kind);
    for p in &params {
        if let Some(mlp) = p.name.strip_suffix(".wo.kernel") {
            forks.push(format!("{mlp}.dropout.rngs"));
        }
        if let Some(attention) = p.name.strip_suffix(".out.kernel") {
            holders.push(format!("{attention}.attention_op.rngs"));
        }
        if let Some(moe) = p.name.strip_suffix(".gate.kernel") {
            holders.push(format!("{moe}.rngs"));
        }
    }
    Some((forks, holders))
}
