//! maxrs: MaxText's job in Rust.
//!
//! The data flows through the modules in this order:
//! config -> model trace (`ir`, `tensor`) -> transforms (`autodiff`) -> StableHLO text (`lower`,
//! `sharding`) -> PJRT plugin (`pjrt`) -> train loop, across processes (`cluster`); `submit` sends a
//! train command to a cluster.
//!
//! The modules are layered, foundations (`sharding`, `host`, `files`, `input`, `net`) first:
//! none imports a higher layer (the book's source layout page, docs/src/reference/layout.md, lists
//! them; `tests/layers.rs` checks).

pub mod aot;
pub mod autodiff;
pub mod checkpoint;
pub mod cluster;
pub mod config;
pub mod data;
pub mod files;
pub mod host;
pub mod inference;
pub mod input;
pub mod ir;
pub mod lower;
pub mod model;
pub mod net;
pub mod output;
pub mod pjrt;
pub mod runtime;
pub mod sharding;
pub mod storage;
pub mod submit;
pub mod tensor;
pub mod train;
pub mod train_state;
