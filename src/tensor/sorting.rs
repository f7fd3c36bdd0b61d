//! Order statistics: stable sorts along an axis (with payloads carried along), `argsort`, and
//! `top_k`.

use super::trace::{usage_error, Tensor, Trace};
use crate::ir::{DType, Prim};

/// Sorts `operands` (all of one shape) along `axis` by the values of `operands[0]`, stably
/// (equal keys keep their order), in increasing or decreasing order; returns every operand
/// permuted the same way. Floats compare in IEEE total order (`-0.0 < 0.0`, NaNs last).
#[track_caller]
pub fn sort(operands: &[&Tensor], axis: isize, descending: bool) -> Vec<Tensor> {
    let Some(keys) = operands.first() else { usage_error("sort of nothing") };
    let axis = keys.axis(axis);
    Trace::innermost(operands.iter().copied()).bind(Prim::Sort { axis, descending }, operands)
}

impl Tensor {
    /// The values sorted in increasing order along `axis`.
    #[track_caller]
    pub fn sort(&self, axis: isize) -> Tensor {
        sort(&[self], axis, false).remove(0)
    }

    /// The s32 positions that sort `self` along `axis` (stable: ties keep their order), so that
    /// `self.take_along_axis(&self.argsort(axis), axis)` is sorted.
    #[track_caller]
    pub fn argsort(&self, axis: isize) -> Tensor {
        let a = self.axis(axis);
        let positions = self.trace().iota(DType::S32, self.shape(), a);
        sort(&[self, &positions], axis, false).remove(1)
    }

    /// The `k` largest values along the last axis in decreasing order, and their s32 indices
    /// (ties: the lower index first), as `jax.lax.top_k`.
    #[track_caller]
    pub fn top_k(&self, k: i64) -> (Tensor, Tensor) {
        let mut outs = Trace::innermost([self]).bind(Prim::TopK { k }, &[self]);
        let indices = outs.pop().expect("two results");
        (outs.pop().expect("two results"), indices)
    }
}
