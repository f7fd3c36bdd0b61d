//! Topology descriptions: a plugin's picture of devices that need not be attached to this
//! machine. Compiling against one (`PJRT_Compile` with no client) is how maxrs builds
//! executables for a GPU or TPU cluster on a CPU-only machine.

use std::sync::Arc;

use super::client::{describe, mlir_program};
use super::compile_options::CompileOptions;
use super::error::Result;
use super::executable::Executable;
use super::ffi;
use super::plugin::{compiling, setting_up, string_from, NamedValues, Plugin, Value};

pub struct Topology {
    plugin: Arc<Plugin>,
    raw: *mut ffi::TopologyDescription,
}

// SAFETY: the PJRT C API may be called from any thread; the handle is not tied to the thread that made it.
unsafe impl Send for Topology {}
// SAFETY: the plugin synchronizes concurrent calls on one handle itself (the PJRT C API is thread-safe); maxrs holds no
// unsynchronized state beside it.
unsafe impl Sync for Topology {}

/// One device of a topology.
#[derive(Debug, Clone, PartialEq)]
pub struct TopologyDevice {
    pub id: i32,
    pub process_index: i32,
    pub kind: String,
    pub attributes: Vec<(String, Value)>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        let mut args: ffi::TopologyDestroyArgs = ffi::args();
        args.topology = self.raw;
        if let Err(e) = crate::pjrt_call!(self.plugin, PJRT_TopologyDescription_Destroy, args) {
            tracing::warn!("destroying a PJRT topology: {e}");
        }
    }
}

impl Topology {
    /// `PJRT_TopologyDescription_Create` with a plugin-specific name and named options
    /// (GPU: `topology` = "<slices>x<hosts>x<devices>", `target_config`; TPU: a name such as
    /// `v5e:16x16` plus `chips_per_host_bounds`, `wrap`, `num_slices`).
    pub fn create(plugin: &Arc<Plugin>, name: &str, options: &[(String, Value)]) -> Result<Topology> {
        let named = NamedValues::new(options)?;
        let mut args: ffi::TopologyCreateArgs = ffi::args();
        args.topology_name = name.as_ptr().cast();
        args.topology_name_size = name.len();
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        let _alone = setting_up();
        crate::pjrt_call!(plugin, PJRT_TopologyDescription_Create, args)?;
        Ok(Topology { plugin: plugin.clone(), raw: args.topology })
    }

    pub fn platform_name(&self) -> Result<String> {
        let mut args: ffi::TopologyPlatformNameArgs = ffi::args();
        args.topology = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_TopologyDescription_PlatformName, args)?;
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    pub fn platform_version(&self) -> Result<String> {
        let mut args: ffi::TopologyPlatformVersionArgs = ffi::args();
        args.topology = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_TopologyDescription_PlatformVersion, args)?;
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        Ok(unsafe { string_from(args.platform_version, args.platform_version_size) })
    }

    pub fn devices(&self) -> Result<Vec<TopologyDevice>> {
        let mut args: ffi::TopologyGetDeviceDescriptionsArgs = ffi::args();
        args.topology = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_TopologyDescription_GetDeviceDescriptions, args)?;
        if args.num_descriptions == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned this array with this many entries in the successful call above, owned by the
        // object, which is alive here.
        unsafe { std::slice::from_raw_parts(args.descriptions, args.num_descriptions) }
            .iter()
            .map(|&raw| {
                let d = describe(&self.plugin, raw)?;
                Ok(TopologyDevice { id: d.id, process_index: d.process_index, kind: d.kind, attributes: d.attributes })
            })
            .collect()
    }

    /// Compiles StableHLO MLIR text for this topology without any device (deviceless AOT).
    pub fn compile(&self, mlir: &str, options: &CompileOptions) -> Result<Executable> {
        let options_bytes = options.to_proto_bytes();
        let program = mlir_program(mlir);
        let mut args: ffi::CompileArgs = ffi::args();
        args.topology = self.raw;
        args.program = &program;
        args.compile_options = options_bytes.as_ptr().cast();
        args.compile_options_size = options_bytes.len();
        let _beside_others = compiling();
        crate::pjrt_call!(self.plugin, PJRT_Compile, args)?;
        Ok(Executable::from_raw(self.plugin.clone(), args.executable))
    }
}
