//! Collectives inside a manual computation's body (JAX's `lax` collectives in a `shard_map`):
//! each runs across the devices of one of the body's manual axes, named as the mesh names it.
//! Outside a manual body, or over an axis it is not manual over, they are a usage error.

use super::trace::{apply1, usage_error, Tensor, Trace};
use crate::ir::{Collective, ManualAxis, Prim};

/// The manual axis `name` of the body `t` is traced in.
#[track_caller]
fn axis(t: &Trace, op: &str, name: &str) -> ManualAxis {
    match t.manual_axis(name) {
        Some(axis) => axis.clone(),
        None => usage_error(&format!("{op} over \"{name}\": not a manual axis of the enclosing manual_computation")),
    }
}

impl Tensor {
    /// Every device's value along mesh axis `name`, concatenated along `dim` in device order.
    #[track_caller]
    pub fn all_gather(&self, name: &str, dim: usize) -> Tensor {
        let axis = axis(self.trace(), "all_gather", name);
        apply1(Prim::Collective(Collective::AllGather { axis, dim }), &[self])
    }

    /// The sum over the devices of mesh axis `name`, of which device `k` keeps the `k`-th part
    /// along `dim`.
    #[track_caller]
    pub fn psum_scatter(&self, name: &str, dim: usize) -> Tensor {
        let axis = axis(self.trace(), "psum_scatter", name);
        apply1(Prim::Collective(Collective::ReduceScatter { axis, dim }), &[self])
    }

    /// Sends device `from`'s value to device `to` along mesh axis `name`, for each pair; a
    /// device no pair sends to gets zeros.
    #[track_caller]
    pub fn ppermute(&self, name: &str, pairs: &[(usize, usize)]) -> Tensor {
        let axis = axis(self.trace(), "ppermute", name);
        apply1(Prim::Collective(Collective::Permute { axis, pairs: pairs.to_vec() }), &[self])
    }

    /// Cuts the value along `split` into one part per device of mesh axis `name` and sends
    /// part `k` to device `k`; the parts received are concatenated along `concat`.
    #[track_caller]
    pub fn all_to_all(&self, name: &str, split: usize, concat: usize) -> Tensor {
        let axis = axis(self.trace(), "all_to_all", name);
        apply1(Prim::Collective(Collective::AllToAll { axis, split, concat }), &[self])
    }
}

/// This device's coordinate along mesh axis `name`, an `s32` scalar, in the manual body `t`
/// is traced in.
#[track_caller]
pub fn axis_index(t: &Trace, name: &str) -> Tensor {
    let axis = axis(t, "axis_index", name);
    t.bind1(Prim::Collective(Collective::AxisIndex { axis }), &[])
}
