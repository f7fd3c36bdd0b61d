//! The core IR: element types, shapes, the closed set of primitives with their shape rules,
//! graphs of equations, and traced programs. Pure data: nothing here traces, differentiates,
//! lowers or runs — `tensor`, `autodiff` and `lower` do, each by matching `Prim` exhaustively.

mod graph;
mod prim;
mod program;
pub mod shape_rules;
mod types;

pub use crate::host::DType;
pub use graph::{Eqn, Graph, ValueId};
pub use prim::{
    BinaryOp, Collective, Comparison, Composite, CustomCall, DotDims, GatherDims, Literal, Manual, ManualAxis, Prim,
    RaggedDotMode, ReduceOp, Remat, RematFences, Scan, ScatterDims, UnaryOp,
};
pub use program::{InputSpec, OutputSpec, Program, Signature};
pub use types::{Shape, Type};
