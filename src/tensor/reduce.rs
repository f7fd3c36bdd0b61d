//! Reductions over axes: sum, max and mean, with or without keeping the reduced dimensions;
//! the cumulative sum, which keeps them; `argmax`.

use super::elementwise::where_;
use super::trace::{apply1, Tensor};
use crate::ir::{DType, Prim, ReduceOp};

#[track_caller]
fn reduce(op: ReduceOp, x: &Tensor, axes: &[isize], keepdims: bool) -> Tensor {
    let norm = normalized(x, axes);
    if norm.is_empty() {
        return x.clone();
    }
    let reduced = apply1(Prim::Reduce { op, axes: norm.clone() }, &[x]);
    if !keepdims {
        return reduced;
    }
    let kept: Vec<i64> = x.shape().iter().enumerate().map(|(d, &n)| if norm.contains(&d) { 1 } else { n }).collect();
    reduced.reshape(&kept)
}

/// Sorted, distinct, non-negative axes.
#[track_caller]
fn normalized(x: &Tensor, axes: &[isize]) -> Vec<usize> {
    let mut norm = Vec::with_capacity(axes.len());
    for &a in axes {
        norm.push(x.axis(a));
    }
    norm.sort_unstable();
    norm.dedup();
    norm
}

fn all_axes(x: &Tensor) -> Vec<isize> {
    (0..x.rank() as isize).collect()
}

impl Tensor {
    #[track_caller]
    pub fn sum(&self, axes: &[isize]) -> Tensor {
        reduce(ReduceOp::Sum, self, axes, false)
    }

    #[track_caller]
    pub fn sum_keepdims(&self, axes: &[isize]) -> Tensor {
        reduce(ReduceOp::Sum, self, axes, true)
    }

    #[track_caller]
    pub fn max(&self, axes: &[isize]) -> Tensor {
        reduce(ReduceOp::Max, self, axes, false)
    }

    #[track_caller]
    pub fn max_keepdims(&self, axes: &[isize]) -> Tensor {
        reduce(ReduceOp::Max, self, axes, true)
    }

    #[track_caller]
    pub fn mean(&self, axes: &[isize]) -> Tensor {
        let n = self.count(axes);
        self.sum(axes) / n
    }

    #[track_caller]
    pub fn mean_keepdims(&self, axes: &[isize]) -> Tensor {
        let n = self.count(axes);
        self.sum_keepdims(axes) / n
    }

    /// Sum of all elements (a scalar).
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        self.sum(&all_axes(self))
    }

    #[track_caller]
    pub fn mean_all(&self) -> Tensor {
        self.mean(&all_axes(self))
    }

    #[track_caller]
    pub fn max_all(&self) -> Tensor {
        self.max(&all_axes(self))
    }

    /// The inclusive cumulative sum along `axis`: `out[i] = x[0] + ... + x[i]` (float or s32).
    #[track_caller]
    pub fn cumsum(&self, axis: isize) -> Tensor {
        apply1(Prim::Cumsum { axis: self.axis(axis), reverse: false }, &[self])
    }

    /// The cumulative sum from the end along `axis`: `out[i] = x[i] + ... + x[n-1]`.
    #[track_caller]
    pub fn cumsum_reverse(&self, axis: isize) -> Tensor {
        apply1(Prim::Cumsum { axis: self.axis(axis), reverse: true }, &[self])
    }

    /// The s32 index of the largest value along `axis` (removed), the first one when several
    /// are equal (`jnp.argmax`). Composed from a max, a comparison and a max of negated indices.
    #[track_caller]
    pub fn argmax(&self, axis: isize) -> Tensor {
        let a = self.axis(axis);
        let n = self.shape()[a];
        let is_max = self.eq(self.max_keepdims(&[axis]));
        let index = self.trace().iota(DType::S32, self.shape(), a);
        // The smallest index where the value is the max: -max(-index) over those positions.
        -where_(&is_max, -index, -(n as f64)).max(&[axis])
    }

    #[track_caller]
    fn count(&self, axes: &[isize]) -> f64 {
        normalized(self, axes).iter().map(|&a| self.shape()[a] as f64).product()
    }
}
