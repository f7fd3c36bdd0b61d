//! Neural-network composites built from primitives: softmax family, RMS norm, one-hot.
//! The max subtracted for stability goes through `stop_gradient`: the results do not depend on
//! it, so its gradient is zero anyway and skipping it saves backward work (as JAX does).

use super::trace::{op_error, Tensor};
use crate::ir::DType;

impl Tensor {
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        let shifted = self - &self.max_keepdims(&[axis]).stop_gradient();
        let e = shifted.exp();
        &e / &e.sum_keepdims(&[axis])
    }

    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        let shifted = self - &self.max_keepdims(&[axis]).stop_gradient();
        &shifted - &shifted.exp().sum_keepdims(&[axis]).log()
    }

    /// `log(sum(exp(x)))` over `axis`, which is removed.
    #[track_caller]
    pub fn logsumexp(&self, axis: isize) -> Tensor {
        let m = self.max_keepdims(&[axis]).stop_gradient();
        ((self - &m).exp().sum_keepdims(&[axis]).log() + &m).squeeze(axis)
    }

    /// RMS normalization over the last axis, computed in f32 for 16-bit inputs, then scaled
    /// by `scale` (shaped like the last axis), as MaxText's `RMSNorm`.
    #[track_caller]
    pub fn rms_norm(&self, scale: &Tensor, eps: f64) -> Tensor {
        let dtype = self.dtype();
        let x = match dtype {
            DType::BF16 | DType::F16 | DType::F8E4M3FN | DType::F8E5M2 => self.astype(DType::F32),
            DType::F32 | DType::F64 | DType::Pred | DType::S8 | DType::S32 | DType::S64 | DType::U8 | DType::U32 => {
                self.clone()
            }
        };
        let inv = (x.square().mean_keepdims(&[-1]) + eps).rsqrt();
        (x * &inv).astype(dtype) * &scale.astype(dtype)
    }

    /// One-hot encoding of integer indices along a new last axis of size `n`.
    #[track_caller]
    pub fn one_hot(&self, n: i64, dtype: DType) -> Tensor {
        if !self.dtype().is_integer() {
            op_error("one_hot", "indices must be s32 or u32", &[self.ty()]);
        }
        let mut shape = self.shape().to_vec();
        shape.push(n);
        let classes = self.trace().iota(self.dtype(), &shape, shape.len() - 1);
        self.expand_dims(-1).eq(&classes).astype(dtype)
    }
}
