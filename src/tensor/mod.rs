//! The user-facing tracing API: `Tensor` handles with operator overloading and JAX-like
//! methods, parameter `Tree`s, and the transformations `trace`, `scan`, `checkpoint` (and
//! `crate::autodiff`'s `value_and_grad`). Model code written against these modules knows
//! nothing about StableHLO.
//!
//! ```
//! use maxrs::ir::{DType, Signature};
//! use maxrs::autodiff::value_and_grad;
//! use maxrs::tensor::{trace, Tree};
//!
//! let mut sig = Signature::new(None);
//! sig.input("x", DType::F32, &[8, 4]);
//! sig.input("params.w", DType::F32, &[4, 2]);
//! let program = trace(&sig, |_ctx, inp| {
//!     let (loss, grads) = value_and_grad(&inp.subtree("params"), |p| {
//!         inp["x"].matmul(&p["w"]).tanh().log_softmax(-1).mean_all()
//!     });
//!     grads.prefixed("grad").with("loss", loss)
//! })?;
//! assert_eq!(program.outputs[0].name, "grad.w");
//! # Ok::<(), maxrs::tensor::TraceError>(())
//! ```

mod collectives;
mod creation;
mod elementwise;
mod indexing;
mod linalg;
mod nn;
mod program;
pub mod random;
mod reduce;
mod shape_ops;
mod sorting;
mod trace;
mod transforms;
mod tree;

pub use collectives::axis_index;
pub use elementwise::{broadcast_shapes, where_, IntoOperand, Operand};
pub use linalg::{dot_transpose_lhs, dot_transpose_rhs, einsum};
pub use program::{trace, TraceError};
pub use shape_ops::{concatenate, stack};
pub use sorting::sort;
pub(crate) use trace::usage_error;
pub use trace::{Tensor, Trace};
pub(crate) use transforms::manual_axes;
pub use transforms::{
    checkpoint, composite, custom_call, fence_cotangents, manual_computation, scan, scan_reverse, RematPolicy,
};
pub use tree::Tree;
