//! Operations that move data without arithmetic: reshape, transpose, broadcast, slicing,
//! padding and concatenation. (Gathers and scatters are in `indexing`.)

use super::elementwise::{IntoOperand, Operand};
use super::trace::{apply1, op_error, usage_error, Tensor};
use crate::ir::{Prim, Shape};

impl Tensor {
    /// Normalizes a possibly negative axis (`-1` is the last).
    #[track_caller]
    pub fn axis(&self, axis: isize) -> usize {
        let rank = self.rank() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank {
            usage_error(&format!("axis {axis} is out of range for {}", self.ty()));
        }
        a as usize
    }

    /// Reshape; one dimension may be `-1` (inferred).
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Tensor {
        let mut dims = shape.to_vec();
        if let Some(pos) = dims.iter().position(|&d| d == -1) {
            let known: i64 = dims.iter().filter(|&&d| d != -1).product();
            if known == 0 || self.ty().shape.num_elements() % known != 0 {
                op_error("reshape", &format!("cannot infer -1 in {shape:?}"), &[self.ty()]);
            }
            dims[pos] = self.ty().shape.num_elements() / known;
        }
        if dims == self.shape() {
            return self.clone();
        }
        apply1(Prim::Reshape(Shape::from(dims)), &[self])
    }

    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> Tensor {
        if perm.iter().enumerate().all(|(i, &p)| i == p) && perm.len() == self.rank() {
            return self.clone();
        }
        apply1(Prim::Transpose(perm.to_vec()), &[self])
    }

    /// Operand dim `i` becomes dim `dims[i]` of `shape`.
    #[track_caller]
    pub fn broadcast_in_dim(&self, shape: &[i64], dims: &[usize]) -> Tensor {
        apply1(Prim::BroadcastInDim { shape: Shape::new(shape), dims: dims.to_vec() }, &[self])
    }

    /// Numpy broadcasting to `shape` (trailing dimensions aligned).
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[i64]) -> Tensor {
        if self.shape() == shape {
            return self.clone();
        }
        if shape.len() < self.rank() {
            op_error("broadcast_in_dim", &format!("cannot broadcast to {shape:?}"), &[self.ty()]);
        }
        let offset = shape.len() - self.rank();
        self.broadcast_in_dim(shape, &(offset..shape.len()).collect::<Vec<_>>())
    }

    /// Inserts a size-1 dimension at `axis` (counted in the result).
    #[track_caller]
    pub fn expand_dims(&self, axis: isize) -> Tensor {
        let rank = self.rank() as isize + 1;
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank {
            usage_error(&format!("axis {axis} is out of range for expand_dims of {}", self.ty()));
        }
        let mut dims = self.shape().to_vec();
        dims.insert(a as usize, 1);
        self.reshape(&dims)
    }

    /// Removes the size-1 dimension `axis`.
    #[track_caller]
    pub fn squeeze(&self, axis: isize) -> Tensor {
        let a = self.axis(axis);
        if self.shape()[a] != 1 {
            op_error("reshape", &format!("squeeze of axis {axis}, which is not of size 1"), &[self.ty()]);
        }
        let mut dims = self.shape().to_vec();
        dims.remove(a);
        self.reshape(&dims)
    }

    #[track_caller]
    pub fn slice(&self, start: &[i64], limit: &[i64]) -> Tensor {
        self.slice_strided(start, limit, &vec![1; self.rank()])
    }

    #[track_caller]
    pub fn slice_strided(&self, start: &[i64], limit: &[i64], strides: &[i64]) -> Tensor {
        apply1(Prim::Slice { start: start.to_vec(), limit: limit.to_vec(), strides: strides.to_vec() }, &[self])
    }

    /// `x[..., start:limit, ...]` along one axis.
    #[track_caller]
    pub fn slice_axis(&self, axis: isize, start: i64, limit: i64) -> Tensor {
        let a = self.axis(axis);
        let mut lo = vec![0; self.rank()];
        let mut hi = self.shape().to_vec();
        lo[a] = start;
        hi[a] = limit;
        self.slice(&lo, &hi)
    }

    /// A block of `sizes` starting at traced s32 scalar positions (clamped into range by XLA).
    #[track_caller]
    pub fn dynamic_slice(&self, starts: &[&Tensor], sizes: &[i64]) -> Tensor {
        let mut ops = vec![self];
        ops.extend_from_slice(starts);
        apply1(Prim::DynamicSlice { sizes: sizes.to_vec() }, &ops)
    }

    /// `self` with `update` written at traced s32 scalar positions.
    #[track_caller]
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &[&Tensor]) -> Tensor {
        let mut ops = vec![self, update];
        ops.extend_from_slice(starts);
        apply1(Prim::DynamicUpdateSlice, &ops)
    }

    /// Pads with `value` (a scalar or a scalar tensor): `low`/`high` elements at each end,
    /// `interior` between elements.
    #[track_caller]
    pub fn pad(&self, value: impl IntoOperand, low: &[i64], high: &[i64], interior: &[i64]) -> Tensor {
        let v = match value.into_operand() {
            Operand::Tensor(t) => t,
            Operand::Scalar(x) => self.trace().scalar(x, self.dtype()),
        };
        apply1(Prim::Pad { low: low.to_vec(), high: high.to_vec(), interior: interior.to_vec() }, &[self, &v])
    }
}

/// Joins tensors along `axis`.
#[track_caller]
pub fn concatenate(ts: &[&Tensor], axis: isize) -> Tensor {
    let Some(first) = ts.first() else { usage_error("concatenate of nothing") };
    apply1(Prim::Concatenate { axis: first.axis(axis) }, ts)
}

/// Stacks equally shaped tensors along a new `axis`.
#[track_caller]
pub fn stack(ts: &[&Tensor], axis: isize) -> Tensor {
    let mut expanded = Vec::with_capacity(ts.len());
    for t in ts {
        expanded.push(t.expand_dims(axis));
    }
    let refs: Vec<&Tensor> = expanded.iter().collect();
    let a = if axis < 0 { axis + refs.first().map_or(1, |t| t.rank() as isize) } else { axis };
    concatenate(&refs, a)
}
