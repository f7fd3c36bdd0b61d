//! The user-facing tracing API: `Tensor` handles with operator overloading and JAX-like
//! methods, parameter `Tree`s, and the transformations `trace`, `scan`, `checkpoint`,
//! `value_and_grad`. Model code written against this module knows nothing about StableHLO.
//!
//! ```ignore
//! let program = trace(&sig, |_ctx, p| {
//!     let h = (p["x"].matmul(&p["w"]) + &p["b"]).relu();
//!     Tree::new().with("y", h.softmax(-1))
//! })?;
//! ```

mod creation;
mod elementwise;
mod linalg;
mod nn;
mod program;
pub mod random;
mod reduce;
mod shape_ops;
mod trace;
mod transforms;
mod tree;

pub use elementwise::{broadcast_shapes, where_, IntoOperand, Operand};
pub use linalg::einsum;
pub use program::{trace, TraceError};
pub use shape_ops::{concatenate, stack};
pub use trace::{Tensor, Trace};
pub use transforms::{checkpoint, scan, value_and_grad, value_and_grad_with_aux, RematPolicy};
pub use tree::Tree;
