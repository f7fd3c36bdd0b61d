//! Compiled programs. [`Executable`] is the device-independent compiled artifact (what a
//! deviceless compile produces and what serializes); [`LoadedExecutable`] is one loaded onto a
//! client's devices, ready to run.
//!
//! Before anything runs, maxrs checks the arguments against the executable's per-device
//! parameter shapes, so a wrong count, shape or dtype is refused with a message naming the
//! argument instead of reaching the plugin: shapes the caller derives from its program
//! ([`LoadedExecutable::execute_blocks`]), or else those of the optimized HLO module.

use std::sync::{Arc, OnceLock};

use prost::Message;

use super::buffer::{from_xla_primitive, Buffer, Event};
use super::client::{ClientInner, Device};
use super::error::{Error, Result};
use super::ffi;
use super::plugin::{read_named_values, string_from, Plugin, Value};
use crate::host::{shape_string, DType, HostTensor};

/// Per-device parameter and output shapes of an executable.
#[derive(Debug, Clone, PartialEq)]
pub struct Signature {
    pub parameters: Vec<(DType, Vec<i64>)>,
    pub outputs: Vec<(DType, Vec<i64>)>,
}

/// Memory the executable needs per device, as XLA computed it at compile time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompiledMemoryStats {
    pub generated_code_bytes: i64,
    pub argument_bytes: i64,
    pub output_bytes: i64,
    /// Output bytes that reuse argument buffers (donation).
    pub alias_bytes: i64,
    pub temp_bytes: i64,
    pub peak_bytes: i64,
}

impl CompiledMemoryStats {
    /// Device memory the program occupies while running: arguments, outputs that do not alias
    /// arguments, temporaries and code.
    pub fn total_bytes(&self) -> i64 {
        self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.generated_code_bytes
    }
}

/// A compiled program, not bound to devices.
pub struct Executable {
    plugin: Arc<Plugin>,
    raw: *mut ffi::Executable,
    // Set for a handle taken from a loaded executable, which plugins may tie it to (the CPU
    // plugin does): dropped after the handle.
    _loaded: Option<Box<LoadedExecutable>>,
}

// SAFETY: the PJRT C API may be called from any thread; the handle is not tied to the thread that made it.
unsafe impl Send for Executable {}
// SAFETY: the plugin synchronizes concurrent calls on one handle itself (the PJRT C API is thread-safe); maxrs holds no
// unsynchronized state beside it.
unsafe impl Sync for Executable {}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut args: ffi::ExecutableDestroyArgs = ffi::args();
        args.executable = self.raw;
        if let Err(e) = crate::pjrt_call!(self.plugin, PJRT_Executable_Destroy, args) {
            tracing::warn!("destroying a PJRT executable: {e}");
        }
    }
}

impl Executable {
    pub(crate) fn from_raw(plugin: Arc<Plugin>, raw: *mut ffi::Executable) -> Executable {
        Executable { plugin, raw, _loaded: None }
    }

    pub fn name(&self) -> Result<String> {
        let mut args: ffi::ExecutableNameArgs = ffi::args();
        args.executable = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_Executable_Name, args)?;
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        Ok(unsafe { string_from(args.executable_name, args.executable_name_size) })
    }

    pub fn num_partitions(&self) -> Result<usize> {
        let mut args: ffi::ExecutableNumPartitionsArgs = ffi::args();
        args.executable = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_Executable_NumPartitions, args)?;
        Ok(args.num_partitions)
    }

    pub fn num_outputs(&self) -> Result<usize> {
        let mut args: ffi::ExecutableNumOutputsArgs = ffi::args();
        args.executable = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_Executable_NumOutputs, args)?;
        Ok(args.num_outputs)
    }

    /// Bytes that [`super::Client::deserialize`] turns back into a loaded executable.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let mut args: ffi::ExecutableSerializeArgs = ffi::args();
        args.executable = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_Executable_Serialize, args)?;
        // SAFETY: the plugin returned these serialized bytes with their length in the successful call above; they live
        // until the deleter runs below.
        let bytes = unsafe {
            std::slice::from_raw_parts(args.serialized_bytes as *const u8, args.serialized_bytes_size).to_vec()
        };
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: the plugin's own deleter for the serialized executable it returned; called exactly once, after
            // the bytes were copied.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }

    /// A fingerprint of the compiled code, when the plugin computes one.
    pub fn fingerprint(&self) -> Result<Option<String>> {
        let mut args: ffi::ExecutableFingerprintArgs = ffi::args();
        args.executable = self.raw;
        match crate::pjrt_call!(self.plugin, PJRT_Executable_Fingerprint, args) {
            Ok(()) if args.executable_fingerprint.is_null() => Ok(None),
            // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
            // which is alive here.
            Ok(()) => Ok(Some(unsafe { string_from(args.executable_fingerprint, args.executable_fingerprint_size) })),
            Err(e) if e.is_unsupported() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn compiled_memory_stats(&self) -> Result<CompiledMemoryStats> {
        let mut args: ffi::ExecutableGetCompiledMemoryStatsArgs = ffi::args();
        args.executable = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_Executable_GetCompiledMemoryStats, args)?;
        Ok(CompiledMemoryStats {
            generated_code_bytes: args.generated_code_size_in_bytes,
            argument_bytes: args.argument_size_in_bytes,
            output_bytes: args.output_size_in_bytes,
            alias_bytes: args.alias_size_in_bytes,
            temp_bytes: args.temp_size_in_bytes,
            peak_bytes: args.peak_memory_in_bytes,
        })
    }

    /// XLA's cost analysis (`flops`, `bytes accessed`, ...); `Ok(None)` where the plugin has none.
    pub fn cost_analysis(&self) -> Result<Option<Vec<(String, Value)>>> {
        let mut args: ffi::ExecutableGetCostAnalysisArgs = ffi::args();
        args.executable = self.raw;
        match crate::pjrt_call!(self.plugin, PJRT_Executable_GetCostAnalysis, args) {
            // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
            // which is alive here.
            Ok(()) => Ok(Some(unsafe { read_named_values(args.properties, args.num_properties) })),
            Err(e) if e.is_unsupported() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The optimized HLO module, serialized, with the plugin's name for its format: `hlo`
    /// (`xla.HloModuleProto`) or `hlo_with_config` (`xla.HloModuleProtoWithConfig`).
    pub fn optimized_program(&self) -> Result<(String, Vec<u8>)> {
        let format = "hlo";
        let mut program: ffi::Program = ffi::args();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        let mut args: ffi::ExecutableOptimizedProgramArgs = ffi::args();
        args.executable = self.raw;
        args.program = &mut program;
        crate::pjrt_call!(self.plugin, PJRT_Executable_OptimizedProgram, args)?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        crate::pjrt_call!(self.plugin, PJRT_Executable_OptimizedProgram, args)?;
        code.truncate(program.code_size);
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        let format = unsafe { string_from(program.format, program.format_size) };
        Ok((format, code))
    }

    /// Per-device parameter and output shapes, from the optimized module's entry computation.
    pub fn signature(&self) -> Result<Signature> {
        let (format, proto) = self.optimized_program()?;
        let decode_error =
            |e: prost::DecodeError| Error::invalid(format!("cannot decode the optimized {format} program: {e}"));
        let module = match format.as_str() {
            "hlo_with_config" => {
                hlo::HloModuleProtoWithConfig::decode(proto.as_slice()).map_err(decode_error)?.hlo_module
            }
            _ => Some(hlo::HloModuleProto::decode(proto.as_slice()).map_err(decode_error)?),
        };
        // After SPMD partitioning this is the per-device signature.
        let shape = module
            .and_then(|m| m.host_program_shape)
            .ok_or_else(|| Error::invalid("the optimized HLO module has no entry signature"))?;
        let outputs = match shape.result {
            Some(result) if !result.tuple_shapes.is_empty() => result.tuple_shapes,
            Some(result) => vec![result],
            None => Vec::new(),
        };
        Ok(Signature {
            parameters: shape.parameters.iter().map(hlo::array_shape).collect::<Result<_>>()?,
            outputs: outputs.iter().map(hlo::array_shape).collect::<Result<_>>()?,
        })
    }
}

/// The slice of XLA's `hlo.proto` / `xla_data.proto` needed to read an entry signature.
mod hlo {
    use super::{DType, Result};

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ShapeProto {
        #[prost(int32, tag = "2")]
        pub element_type: i32,
        #[prost(int64, repeated, tag = "3")]
        pub dimensions: Vec<i64>,
        #[prost(message, repeated, tag = "4")]
        pub tuple_shapes: Vec<ShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProgramShapeProto {
        #[prost(message, repeated, tag = "1")]
        pub parameters: Vec<ShapeProto>,
        #[prost(message, optional, tag = "2")]
        pub result: Option<ShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HloModuleProto {
        #[prost(message, optional, tag = "4")]
        pub host_program_shape: Option<ProgramShapeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HloModuleProtoWithConfig {
        #[prost(message, optional, tag = "1")]
        pub hlo_module: Option<HloModuleProto>,
    }

    pub fn array_shape(shape: &ShapeProto) -> Result<(DType, Vec<i64>)> {
        let ty = super::from_xla_primitive(shape.element_type)?;
        Ok((ty, shape.dimensions.clone()))
    }
}

/// An executable loaded on a client's devices.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: *mut ffi::LoadedExecutable,
    executable: Executable,
    devices: Vec<Device>,
    /// Read from the optimized program when first asked for: the plugin serializes the whole
    /// module for each read (twice: once for its size), 0.1-0.5 s per executable of the tests'
    /// models, which callers that know their program's blocks skip ([`LoadedExecutable::execute_blocks`]).
    signature: OnceLock<Signature>,
}

// SAFETY: the PJRT C API may be called from any thread; the handle is not tied to the thread that made it.
unsafe impl Send for LoadedExecutable {}
// SAFETY: the plugin synchronizes concurrent calls on one handle itself (the PJRT C API is thread-safe); maxrs holds no
// unsynchronized state beside it.
unsafe impl Sync for LoadedExecutable {}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut args: ffi::LoadedExecutableDestroyArgs = ffi::args();
        args.executable = self.raw;
        if let Err(e) = crate::pjrt_call!(self.client.plugin, PJRT_LoadedExecutable_Destroy, args) {
            tracing::warn!("destroying a PJRT loaded executable: {e}");
        }
    }
}

impl LoadedExecutable {
    pub(crate) fn from_raw(client: &Arc<ClientInner>, raw: *mut ffi::LoadedExecutable) -> Result<LoadedExecutable> {
        let plugin = &client.plugin;
        let mut get: ffi::LoadedExecutableGetExecutableArgs = ffi::args();
        get.loaded_executable = raw;
        if let Err(e) = crate::pjrt_call!(plugin, PJRT_LoadedExecutable_GetExecutable, get) {
            let mut destroy: ffi::LoadedExecutableDestroyArgs = ffi::args();
            destroy.executable = raw;
            let _ = crate::pjrt_call!(plugin, PJRT_LoadedExecutable_Destroy, destroy);
            return Err(e);
        }
        // From here on `loaded` owns both handles, so an early return releases them.
        let mut loaded = LoadedExecutable {
            client: client.clone(),
            raw,
            executable: Executable::from_raw(plugin.clone(), get.executable),
            devices: Vec::new(),
            signature: OnceLock::new(),
        };
        let mut devices: ffi::LoadedExecutableAddressableDevicesArgs = ffi::args();
        devices.executable = raw;
        crate::pjrt_call!(plugin, PJRT_LoadedExecutable_AddressableDevices, devices)?;
        if devices.num_addressable_devices > 0 {
            loaded.devices =
                // SAFETY: the plugin returned this array with this many entries in the successful call above, owned by
                // the object, which is alive here.
                unsafe { std::slice::from_raw_parts(devices.addressable_devices, devices.num_addressable_devices) }
                    .iter()
                    .map(|&d| Device::from_raw(client, d))
                    .collect::<Result<_>>()?;
        }
        Ok(loaded)
    }

    /// The compiled artifact (serialize, memory stats, cost analysis, fingerprint).
    pub fn executable(&self) -> &Executable {
        &self.executable
    }

    /// The compiled artifact as an [`Executable`] of its own, for code that deals in those
    /// whatever compiled them (the CPU path of AOT compilation). The handle keeps `self` alive:
    /// with the CPU plugin it is invalid once the loaded executable is destroyed.
    pub fn into_executable(self) -> Result<Executable> {
        let mut get: ffi::LoadedExecutableGetExecutableArgs = ffi::args();
        get.loaded_executable = self.raw;
        crate::pjrt_call!(self.client.plugin, PJRT_LoadedExecutable_GetExecutable, get)?;
        Ok(Executable { plugin: self.client.plugin.clone(), raw: get.executable, _loaded: Some(Box::new(self)) })
    }

    /// The devices the argument lists of [`LoadedExecutable::execute`] are for, in order.
    pub fn addressable_devices(&self) -> &[Device] {
        &self.devices
    }

    /// Per-device parameter and output shapes, from the optimized program.
    pub fn signature(&self) -> Result<&Signature> {
        if let Some(signature) = self.signature.get() {
            return Ok(signature);
        }
        let signature = self.executable.signature()?;
        Ok(self.signature.get_or_init(|| signature))
    }

    /// Checks `args[d]` against `expected(d)`, device `d`'s parameter types and shapes.
    fn check_arguments<'a>(
        &self,
        args: &[Vec<&Buffer>],
        expected: impl Fn(usize) -> &'a [(DType, Vec<i64>)],
    ) -> Result<()> {
        if args.len() != self.devices.len() {
            return Err(Error::invalid(format!(
                "executable runs on {} devices but got argument lists for {}",
                self.devices.len(),
                args.len()
            )));
        }
        for (d, list) in args.iter().enumerate() {
            let expected = expected(d);
            if list.len() != expected.len() {
                return Err(Error::invalid(format!(
                    "executable takes {} arguments but device {d} got {}",
                    expected.len(),
                    list.len()
                )));
            }
            for (i, (buffer, (ty, dims))) in list.iter().zip(expected).enumerate() {
                let (got_ty, got_dims) = (buffer.element_type()?, buffer.dims()?);
                if got_ty != *ty || got_dims != *dims {
                    return Err(Error::invalid(format!(
                        "argument {i} on device {d}: expected {}, got {}",
                        shape_string(*ty, dims),
                        shape_string(got_ty, &got_dims)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Runs the program: `args[d][i]` is argument `i` on the `d`-th addressable device; the
    /// result is `outputs[d][j]`. Arguments the program aliases to outputs (donation) are
    /// consumed: afterwards `is_deleted()` is true for them.
    pub fn execute(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        let parameters = &self.signature()?.parameters;
        self.check_arguments(args, |_| parameters)?;
        self.execute_checked(args)
    }

    /// [`LoadedExecutable::execute`] for a caller that knows the program's parameters:
    /// `blocks[d]` is what device `d`'s arguments must be (types and per-device shapes), so the
    /// optimized program is not read for them.
    pub fn execute_blocks(&self, args: &[Vec<&Buffer>], blocks: &[Vec<(DType, Vec<i64>)>]) -> Result<Vec<Vec<Buffer>>> {
        if blocks.len() != self.devices.len() {
            return Err(Error::invalid(format!(
                "executable runs on {} devices but the parameters of {} were given",
                self.devices.len(),
                blocks.len()
            )));
        }
        self.check_arguments(args, |d| &blocks[d])?;
        self.execute_checked(args)
    }

    /// Runs on arguments already checked: one list per device, each as long as the program's
    /// parameters.
    fn execute_checked(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        let num_devices = args.len();
        let num_args = args.first().map_or(0, Vec::len);
        let num_outputs = self.executable.num_outputs()?;
        let raw_args: Vec<Vec<*mut ffi::Buffer>> =
            args.iter().map(|list| list.iter().map(|b| b.raw).collect()).collect();
        let arg_ptrs: Vec<*const *mut ffi::Buffer> = raw_args.iter().map(|l| l.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut ffi::Buffer>> = vec![vec![std::ptr::null_mut(); num_outputs]; num_devices];
        let output_ptrs: Vec<*mut *mut ffi::Buffer> = outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::Event> = vec![std::ptr::null_mut(); num_devices];

        let mut options: ffi::ExecuteOptions = ffi::args();
        let mut call: ffi::LoadedExecutableExecuteArgs = ffi::args();
        call.executable = self.raw;
        call.options = &mut options;
        call.argument_lists = arg_ptrs.as_ptr();
        call.num_devices = num_devices;
        call.num_args = num_args;
        call.output_lists = output_ptrs.as_ptr();
        call.device_complete_events = events.as_mut_ptr();
        crate::pjrt_call!(self.client.plugin, PJRT_LoadedExecutable_Execute, call)?;

        // Own every output and event first, so nothing leaks if a wait fails.
        let results: Vec<Vec<Buffer>> = outputs
            .into_iter()
            .map(|list| list.into_iter().map(|raw| Buffer { client: self.client.clone(), raw }).collect())
            .collect();
        let events: Vec<Event> = events.into_iter().map(|e| Event::new(self.client.plugin.clone(), e)).collect();
        for event in events {
            event.wait()?;
        }
        Ok(results)
    }

    /// Single-device convenience: copies `args` to the device, runs, and copies the outputs back.
    pub fn execute_host(&self, args: &[HostTensor]) -> Result<Vec<HostTensor>> {
        if self.devices.len() != 1 {
            return Err(Error::invalid(format!(
                "execute_host runs single-device executables; this one spans {} devices",
                self.devices.len()
            )));
        }
        let client = super::Client { inner: self.client.clone() };
        let device = &self.devices[0];
        let buffers: Vec<Buffer> = args.iter().map(|t| client.to_device(t, device)).collect::<Result<_>>()?;
        let outputs = self.execute(&[buffers.iter().collect()])?;
        outputs.into_iter().next().unwrap_or_default().iter().map(Buffer::to_host).collect()
    }
}
