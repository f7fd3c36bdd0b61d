//! The PJRT runtime: maxrs's own binding of XLA's PJRT C API (plugins are loaded with
//! `libloading`), plugin provisioning, and the compile options sent to `PJRT_Client_Compile`.

pub mod provision;
pub mod xla_flags;
