//! The PJRT runtime: maxrs's own binding of XLA's PJRT C API. Plugins (the CPU, CUDA and TPU
//! runtimes JAX uses, shipped as Python wheels) are loaded with `libloading`; everything above
//! this module talks to them through the safe types re-exported here.
//!
//! Layout: `ffi` (raw C declarations) -> `plugin` (loading, the checked call path, errors) ->
//! `client` / `buffer` / `executable` / `topology` (RAII handles), `compile_options` (the
//! protobuf PJRT compiles with), `compile_cache` (MaxText's `jax_cache_dir`), `profiler` (the plugin's profiler
//! extension) and `gpu_memory`
//! (the CUDA allocator's settings from JAX's variables, and the memory a run may use). `provision` finds or downloads
//! plugin files; `xla_flags`
//! checks `XLA_FLAGS` against a plugin before it is loaded (an unknown flag kills the process).
//!
//! Every `unsafe` block and impl says in a `// SAFETY:` comment why it is sound (the lint below
//! makes it a compile error not to), args structs come from the one safe constructor
//! [`ffi::args`], and `ffi` checks its struct layouts against `pjrt_c_api.h` at compile time.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod buffer;
pub mod client;
pub mod compile_cache;
pub mod compile_options;
pub mod cross_host;
pub mod error;
pub mod executable;
#[doc(hidden)]
pub mod ffi;
pub mod gpu_memory;
pub mod plugin;
pub mod profiler;
pub mod provision;
pub mod topology;
pub mod xla_flags;

pub use buffer::{Buffer, ReadyTime};
pub use client::{Client, Device, DeviceMemoryStats, KeyValueStore};
pub use compile_options::CompileOptions;
pub use error::{Error, ErrorCode, Result};
pub use executable::{CompiledMemoryStats, Executable, LoadedExecutable, Signature};
pub use plugin::{Plugin, Value};
pub use profiler::Profiler;
pub use topology::{Topology, TopologyDevice};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Resolves a plugin spec (see [`provision::resolve_plugin`]), checks `XLA_FLAGS` against the
/// plugin file (XLA ends the process on an unknown flag, so this must happen before loading),
/// and loads it.
pub fn load_plugin(spec: Option<&str>) -> anyhow::Result<(provision::ResolvedPlugin, Arc<Plugin>)> {
    load_chosen_plugin(&provision::choose_plugin(spec, None)?)
}

/// [`load_plugin`] for a spec chosen by [`provision::choose_plugin`].
pub fn load_chosen_plugin(
    choice: &provision::PluginChoice,
) -> anyhow::Result<(provision::ResolvedPlugin, Arc<Plugin>)> {
    let resolved = provision::resolve_choice(choice)?;
    let flags = xla_flags::XlaFlags::from_env()?;
    flags.validate_against_plugin(&resolved.path)?;
    xla_flags::probe::check_values(&flags.to_env_string(), &resolved.path)?;
    let plugin = Plugin::load(&resolved.path)?;
    Ok((resolved, plugin))
}

/// A client of the CPU plugin with `device_count` devices, created once per process and count
/// (tests and the CPU train path share it). The plugin is found or downloaded by `provision`.
pub fn cpu_client(device_count: usize) -> anyhow::Result<Client> {
    static CLIENTS: OnceLock<Mutex<HashMap<usize, Client>>> = OnceLock::new();
    let mut clients = CLIENTS.get_or_init(Default::default).lock().unwrap();
    if let Some(client) = clients.get(&device_count) {
        return Ok(client.clone());
    }
    let (_, plugin) = load_plugin(Some("cpu"))?;
    let client = Client::create(&plugin, &[("cpu_device_count".into(), Value::I64(device_count as i64))], None)?;
    clients.insert(device_count, client.clone());
    Ok(client)
}
