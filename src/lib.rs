//! maxrs: MaxText's job in Rust.
//!
//! The data flows through the modules in this order:
//! config -> model trace (`ir`, `tensor`) -> transforms (`autodiff`) -> StableHLO text (`lower`,
//! `sharding`) -> PJRT plugin (`pjrt`) -> train loop.

pub mod aot;
pub mod pjrt;
