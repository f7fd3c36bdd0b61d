//! Gathers and scatters: the general `stablehlo.gather` / scatter-add forms, and the two
//! shapes model code uses — rows of a table (`take`, `scatter_add`: embedding lookups, token
//! permutations) and one element per position along an axis (`take_along_axis`,
//! `scatter_add_along_axis`: top-k selections, sort permutations).

use super::trace::{apply1, op_error, Tensor};
use crate::ir::{GatherDims, Prim, ScatterDims};

impl Tensor {
    /// `stablehlo.gather` with explicit dimension numbers.
    #[track_caller]
    pub fn gather(&self, indices: &Tensor, dims: GatherDims) -> Tensor {
        apply1(Prim::Gather(dims), &[self, indices])
    }

    /// `self` plus `updates` scattered at `indices` (`stablehlo.scatter` with addition).
    #[track_caller]
    pub fn scatter_add_with(&self, indices: &Tensor, updates: &Tensor, dims: ScatterDims) -> Tensor {
        apply1(Prim::ScatterAdd(dims), &[self, indices, updates])
    }

    /// Rows of `self` (a table indexed along axis 0) at integer `indices`: shape
    /// `indices.shape ++ self.shape[1..]` (embedding lookup).
    #[track_caller]
    pub fn take(&self, indices: &Tensor) -> Tensor {
        let m = indices.rank();
        let mut slice_sizes = self.shape().to_vec();
        if let Some(first) = slice_sizes.first_mut() {
            *first = 1;
        }
        let dims = GatherDims {
            offset_dims: (m..m + self.rank().saturating_sub(1)).collect(),
            collapsed_slice_dims: vec![0],
            operand_batching_dims: vec![],
            start_indices_batching_dims: vec![],
            start_index_map: vec![0],
            index_vector_dim: m,
            slice_sizes,
        };
        self.gather(indices, dims)
    }

    /// `self` with `updates` (shaped `indices.shape ++ self.shape[1..]`) added at rows `indices`;
    /// repeated indices accumulate. The transpose of `take`.
    #[track_caller]
    pub fn scatter_add(&self, indices: &Tensor, updates: &Tensor) -> Tensor {
        let m = indices.rank();
        let dims = ScatterDims {
            update_window_dims: (m..m + self.rank().saturating_sub(1)).collect(),
            inserted_window_dims: vec![0],
            input_batching_dims: vec![],
            scatter_indices_batching_dims: vec![],
            scatter_dims_to_operand_dims: vec![0],
            index_vector_dim: m,
        };
        self.scatter_add_with(indices, updates, dims)
    }

    /// numpy's `take_along_axis`: `out[..., j, ...] = self[..., indices[..., j, ...], ...]` along
    /// `axis`; `indices` has `self`'s rank and shape except along `axis`.
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Tensor, axis: isize) -> Tensor {
        let a = self.axis(axis);
        along_axis_check("take_along_axis", self, indices, a);
        let batch: Vec<usize> = (0..self.rank()).filter(|&d| d != a).collect();
        let dims = GatherDims {
            offset_dims: vec![],
            collapsed_slice_dims: vec![a],
            operand_batching_dims: batch.clone(),
            start_indices_batching_dims: batch,
            start_index_map: vec![a],
            index_vector_dim: indices.rank(),
            slice_sizes: vec![1; self.rank()],
        };
        self.gather(indices, dims)
    }

    /// The transpose of `take_along_axis`: `self` with `updates[..., j, ...]` added at
    /// `[..., indices[..., j, ...], ...]` along `axis` (`updates` shaped like `indices`).
    #[track_caller]
    pub fn scatter_add_along_axis(&self, indices: &Tensor, updates: &Tensor, axis: isize) -> Tensor {
        let a = self.axis(axis);
        along_axis_check("scatter_add_along_axis", self, indices, a);
        let batch: Vec<usize> = (0..self.rank()).filter(|&d| d != a).collect();
        let dims = ScatterDims {
            update_window_dims: vec![],
            inserted_window_dims: vec![a],
            input_batching_dims: batch.clone(),
            scatter_indices_batching_dims: batch,
            scatter_dims_to_operand_dims: vec![a],
            index_vector_dim: indices.rank(),
        };
        self.scatter_add_with(indices, updates, dims)
    }
}

/// `indices` must match `x` in rank and in every dimension but `axis`.
#[track_caller]
fn along_axis_check(op: &str, x: &Tensor, indices: &Tensor, axis: usize) {
    let fits = indices.rank() == x.rank() && (0..x.rank()).all(|d| d == axis || indices.shape()[d] == x.shape()[d]);
    if !fits {
        op_error(
            op,
            &format!("indices must have the operand's shape except along axis {axis}"),
            &[x.ty(), indices.ty()],
        );
    }
}
