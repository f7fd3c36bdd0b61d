//! The decoder's layers with a key/value cache (`Model::decode`): prefill creates the cache,
//! a generate step updates it in place, stack by stack (`stacks.rs`), running the family's
//! training layer with the cache attached to its `LayerContext`.

use crate::ir::DType;
use crate::tensor::{scan, stack, Tensor, Tree};

use super::attention::{cache_slots, cache_tree, LayerCache, LayerContext};
use super::decoder::Model;
use super::stacks::Stack;

/// What `Model::decode` does with the key/value cache.
#[derive(Clone, Copy)]
pub enum CacheStep<'a> {
    /// Create it, `len` positions long, from prompts.
    Prefill { len: i64 },
    /// Update this one (a tree `Model::decode` returned).
    Generate(&'a Tree),
}

impl Model {
    /// Decoding with a key/value cache: the decoder layers on `tokens: s32[batch, seq]` at
    /// `positions: s32[batch, seq]`; returns the last layer's output `[batch, seq, emb]` (`head`
    /// turns the rows wanted into logits) and the cache afterwards. The cache is a tree with
    /// `<i>.key` and `<i>.value` for the `i`-th attention call of a layer, each `[layers, batch,
    /// len, kv_heads, head_dim]` in `dtype` (`KvCache`, logical axes `CACHE_AXES`); a model of
    /// several stacks has one such tree per stack, under the stack's name
    /// (`layers_remainder.<i>.key`), `layers` the stack's layers.
    ///
    /// - `CacheStep::Prefill { len }`: the tokens are prompts starting at position 0 (rows may
    ///   end in padding: causal attention keeps it out of the real tokens); the layers run as
    ///   in training and the cache is created, `len` positions long, holding the tokens' keys
    ///   and values at their positions.
    /// - `CacheStep::Generate(cache)`: `cache` (from prefill or an earlier step) is updated at
    ///   the tokens' positions, in place (it is carried through the layer loop and each layer
    ///   writes only its rows), and each token attends over the cached positions up to its own.
    ///
    /// The family's layer is the training one: its attention calls `LayerContext::attend`, to
    /// which the decoder attaches each layer's cache. No remat: there is no backward pass.
    pub fn decode(&self, params: &Tree, tokens: &Tensor, positions: &Tensor, step: CacheStep) -> (Tensor, Tree) {
        let x = self.embed(params, tokens, positions);
        let mut ctx = LayerContext::new(
            &self.config,
            &Tree::new().with("inputs", tokens.clone()).with("inputs_position", positions.clone()),
        );
        ctx.per_layer_inputs = self.family.per_layer_inputs(&self.config, params, tokens, &x);
        let mut y = x;
        let mut caches = Tree::new();
        for s in self.stacks() {
            let prefix = self.cache_prefix(s);
            let (out, cache) = match step {
                CacheStep::Prefill { len } => self.prefill_stack(s, params, &y, &ctx, len),
                CacheStep::Generate(cache) => {
                    let own = match prefix {
                        Some(prefix) => cache.subtree(prefix),
                        None => cache.clone(),
                    };
                    self.generate_stack(s, params, &y, &ctx, &own)
                }
            };
            y = out;
            caches.extend(match prefix {
                Some(prefix) => cache.prefixed(prefix),
                None => cache,
            });
        }
        (y, caches)
    }

    /// The name of a stack's cache tree in the model's: none for a model of one stack.
    pub fn cache_prefix(&self, s: &Stack) -> Option<&'static str> {
        (self.stacks().len() > 1).then_some(s.name)
    }

    /// Prefill of one stack's layers: their output on `x` and their new cache.
    fn prefill_stack(&self, s: &Stack, params: &Tree, x: &Tensor, ctx: &LayerContext, len: i64) -> (Tensor, Tree) {
        let c = &self.config;
        let fill = |x: &Tensor, p: &Tree| -> (Tensor, Tree) {
            let layer_ctx = ctx.with_cache(LayerCache::Fill { len, filled: Vec::new() });
            let y = self.family.layer(c, s.kind, p, x, &layer_ctx).x;
            let Some(LayerCache::Fill { filled, .. }) = layer_ctx.into_cache() else { unreachable!() };
            (y, cache_tree(filled))
        };
        if s.scanned(c.scan_layers) {
            let (carry, cache) = scan(&Tree::new().with("x", x.clone()), &params.subtree(&s.prefix()), |carry, p| {
                let (y, cache) = fill(&carry["x"], p);
                (Tree::new().with("x", y), cache)
            });
            return (carry["x"].clone(), cache);
        }
        let mut y = x.clone();
        let mut per_layer = Vec::new();
        for i in 0..s.count {
            let (out, cache) = fill(&y, &s.layer_params(params, i, c.scan_layers));
            y = out;
            per_layer.push(cache);
        }
        let stacked = per_layer[0]
            .names()
            .map(|name| {
                let layers: Vec<&Tensor> = per_layer.iter().map(|t| &t[name]).collect();
                (name.to_string(), stack(&layers, 0))
            })
            .collect();
        (y, stacked)
    }

    /// A generate step of one stack's layers on `x` with their `cache`: the output and the
    /// updated cache.
    fn generate_stack(&self, s: &Stack, params: &Tree, x: &Tensor, ctx: &LayerContext, cache: &Tree) -> (Tensor, Tree) {
        let c = &self.config;
        let update = |x: &Tensor, p: &Tree, layer: &Tensor, cache: &Tree| -> (Tensor, Tree) {
            let caches = cache_slots(cache);
            let expected = caches.len();
            let layer_ctx = ctx.with_cache(LayerCache::Update { layer: layer.clone(), caches, used: 0 });
            let y = self.family.layer(c, s.kind, p, x, &layer_ctx).x;
            let Some(LayerCache::Update { caches, used, .. }) = layer_ctx.into_cache() else { unreachable!() };
            assert_eq!(used, expected, "the layer made {used} attention calls, but the cache is for {expected}");
            (y, cache_tree(caches))
        };
        if s.scanned(c.scan_layers) {
            let s32 = |v: f64| x.trace().scalar(v, DType::S32);
            let carry = cache.clone().prefixed("cache").with("x", x.clone()).with("layer", s32(0.0));
            let (carry, _) = scan(&carry, &params.subtree(&s.prefix()), |carry, p| {
                let (y, cache) = update(&carry["x"], p, &carry["layer"], &carry.subtree("cache"));
                let next = cache.prefixed("cache").with("x", y).with("layer", &carry["layer"] + 1.0);
                (next, Tree::new())
            });
            return (carry["x"].clone(), carry.subtree("cache"));
        }
        let (mut y, mut cache) = (x.clone(), cache.clone());
        for i in 0..s.count {
            let layer = y.trace().scalar(i as f64, DType::S32);
            (y, cache) = update(&y, &s.layer_params(params, i, c.scan_layers), &layer, &cache);
        }
        (y, cache)
    }
}
