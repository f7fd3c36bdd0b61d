//! A PJRT client (the runtime of one process over its devices), its devices, the key-value
//! store bridge multi-node plugins use to exchange topology and NCCL ids, and the entry points
//! that need a client: compile, deserialize, host -> device transfer.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::buffer::{Buffer, Event};
use super::compile_options::CompileOptions;
use super::error::{Error, ErrorCode, Result};
use super::executable::LoadedExecutable;
use super::ffi;
use super::plugin::{compiling, read_named_values, string_from, NamedValues, Plugin, Value};
use crate::host::{DType, HostTensor};

/// A key-value store shared by all processes of a job. Multi-node GPU clients publish their
/// local topology and NCCL clique ids through it. Implementations must be thread-safe; `get`
/// blocks until the key exists or the timeout passes.
pub trait KeyValueStore: Send + Sync {
    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String>;
    /// `Ok(None)` when the key is not there (yet).
    fn try_get(&self, key: &str) -> std::result::Result<Option<Vec<u8>>, String>;
    fn put(&self, key: &str, value: &[u8]) -> std::result::Result<(), String>;
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut ffi::Client,
    // The plugin holds a pointer to this for the client's life: dropped after the client.
    _kv_store: Option<Box<Arc<dyn KeyValueStore>>>,
}

// SAFETY: the PJRT C API may be called from any thread; the handle is not tied to the thread that made it.
unsafe impl Send for ClientInner {}
// SAFETY: the plugin synchronizes concurrent calls on one handle itself (the PJRT C API is thread-safe); maxrs holds no
// unsynchronized state beside it.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args: ffi::ClientDestroyArgs = ffi::args();
        args.client = self.raw;
        if let Err(e) = crate::pjrt_call!(self.plugin, PJRT_Client_Destroy, args) {
            tracing::warn!("destroying the PJRT client: {e}");
        }
    }
}

/// A PJRT client. Cheap to clone; buffers and executables keep it alive.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

/// One device as the client sees it.
#[derive(Clone)]
pub struct Device {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::Device,
    pub id: i32,
    pub process_index: i32,
    pub kind: String,
    pub is_addressable: bool,
    pub attributes: Vec<(String, Value)>,
}

// SAFETY: the PJRT C API may be called from any thread; the handle is not tied to the thread that made it.
unsafe impl Send for Device {}
// SAFETY: the plugin synchronizes concurrent calls on one handle itself (the PJRT C API is thread-safe); maxrs holds no
// unsynchronized state beside it.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("id", &self.id)
            .field("process_index", &self.process_index)
            .field("kind", &self.kind)
            .finish()
    }
}

/// A device's memory use as the allocator reports it (GPU/TPU; the CPU plugin has none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceMemoryStats {
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: Option<i64>,
    pub bytes_limit: Option<i64>,
}

/// The description behind a device (or a topology's device): id, process, kind, attributes.
pub(crate) struct Description {
    pub id: i32,
    pub process_index: i32,
    pub kind: String,
    pub attributes: Vec<(String, Value)>,
}

pub(crate) fn describe(plugin: &Plugin, raw: *mut ffi::DeviceDescription) -> Result<Description> {
    let mut id: ffi::DeviceDescriptionIdArgs = ffi::args();
    id.device_description = raw;
    crate::pjrt_call!(plugin, PJRT_DeviceDescription_Id, id)?;
    let mut process: ffi::DeviceDescriptionProcessIndexArgs = ffi::args();
    process.device_description = raw;
    crate::pjrt_call!(plugin, PJRT_DeviceDescription_ProcessIndex, process)?;
    let mut kind: ffi::DeviceDescriptionKindArgs = ffi::args();
    kind.device_description = raw;
    crate::pjrt_call!(plugin, PJRT_DeviceDescription_Kind, kind)?;
    let mut attributes: ffi::DeviceDescriptionAttributesArgs = ffi::args();
    attributes.device_description = raw;
    crate::pjrt_call!(plugin, PJRT_DeviceDescription_Attributes, attributes)?;
    Ok(Description {
        id: id.id,
        process_index: process.process_index,
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        kind: unsafe { string_from(kind.device_kind, kind.device_kind_size) },
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        attributes: unsafe { read_named_values(attributes.attributes, attributes.num_attributes) },
    })
}

fn description_of(plugin: &Plugin, device: *mut ffi::Device) -> Result<*mut ffi::DeviceDescription> {
    let mut args: ffi::DeviceGetDescriptionArgs = ffi::args();
    args.device = device;
    crate::pjrt_call!(plugin, PJRT_Device_GetDescription, args)?;
    Ok(args.device_description)
}

pub(crate) fn device_id(plugin: &Plugin, device: *mut ffi::Device) -> Result<i32> {
    let mut id: ffi::DeviceDescriptionIdArgs = ffi::args();
    id.device_description = description_of(plugin, device)?;
    crate::pjrt_call!(plugin, PJRT_DeviceDescription_Id, id)?;
    Ok(id.id)
}

impl Device {
    pub(crate) fn from_raw(client: &Arc<ClientInner>, raw: *mut ffi::Device) -> Result<Device> {
        let plugin = &client.plugin;
        let description = describe(plugin, description_of(plugin, raw)?)?;
        let mut addressable: ffi::DeviceIsAddressableArgs = ffi::args();
        addressable.device = raw;
        crate::pjrt_call!(plugin, PJRT_Device_IsAddressable, addressable)?;
        Ok(Device {
            client: client.clone(),
            raw,
            id: description.id,
            process_index: description.process_index,
            kind: description.kind,
            is_addressable: addressable.is_addressable,
            attributes: description.attributes,
        })
    }

    /// Allocator statistics; `Ok(None)` when the plugin does not track them (CPU).
    pub fn memory_stats(&self) -> Result<Option<DeviceMemoryStats>> {
        let mut args: ffi::DeviceMemoryStatsArgs = ffi::args();
        args.device = self.raw;
        match crate::pjrt_call!(self.client.plugin, PJRT_Device_MemoryStats, args) {
            Ok(()) => Ok(Some(DeviceMemoryStats {
                bytes_in_use: args.bytes_in_use,
                peak_bytes_in_use: args.peak_bytes_in_use_is_set.then_some(args.peak_bytes_in_use),
                bytes_limit: args.bytes_limit_is_set.then_some(args.bytes_limit),
            })),
            Err(e) if e.is_unsupported() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Client {
    /// Creates a client with the plugin's named options (e.g. `cpu_device_count`, or for GPUs
    /// `node_id`, `num_nodes`, `visible_devices`), optionally wired to a key-value store.
    pub fn create(
        plugin: &Arc<Plugin>,
        options: &[(String, Value)],
        kv_store: Option<Arc<dyn KeyValueStore>>,
    ) -> Result<Client> {
        let named = NamedValues::new(options)?;
        let mut args: ffi::ClientCreateArgs = ffi::args();
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        let kv_store = kv_store.map(Box::new);
        if let Some(store) = &kv_store {
            let user_arg = &**store as *const Arc<dyn KeyValueStore> as *mut c_void;
            args.kv_get_callback = Some(kv_get);
            args.kv_get_user_arg = user_arg;
            args.kv_try_get_callback = Some(kv_try_get);
            args.kv_try_get_user_arg = user_arg;
            args.kv_put_callback = Some(kv_put);
            args.kv_put_user_arg = user_arg;
        }
        crate::pjrt_call!(plugin, PJRT_Client_Create, args)?;
        Ok(Client { inner: Arc::new(ClientInner { plugin: plugin.clone(), raw: args.client, _kv_store: kv_store }) })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    pub fn platform_name(&self) -> Result<String> {
        let mut args: ffi::ClientPlatformNameArgs = ffi::args();
        args.client = self.inner.raw;
        crate::pjrt_call!(self.inner.plugin, PJRT_Client_PlatformName, args)?;
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    pub fn platform_version(&self) -> Result<String> {
        let mut args: ffi::ClientPlatformVersionArgs = ffi::args();
        args.client = self.inner.raw;
        crate::pjrt_call!(self.inner.plugin, PJRT_Client_PlatformVersion, args)?;
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        Ok(unsafe { string_from(args.platform_version, args.platform_version_size) })
    }

    pub fn process_index(&self) -> Result<i32> {
        let mut args: ffi::ClientProcessIndexArgs = ffi::args();
        args.client = self.inner.raw;
        crate::pjrt_call!(self.inner.plugin, PJRT_Client_ProcessIndex, args)?;
        Ok(args.process_index)
    }

    /// Every device of the job, across processes.
    pub fn devices(&self) -> Result<Vec<Device>> {
        let mut args: ffi::ClientDevicesArgs = ffi::args();
        args.client = self.inner.raw;
        crate::pjrt_call!(self.inner.plugin, PJRT_Client_Devices, args)?;
        self.wrap_devices(args.devices, args.num_devices)
    }

    /// The devices this process drives.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args: ffi::ClientDevicesArgs = ffi::args();
        args.client = self.inner.raw;
        crate::pjrt_call!(self.inner.plugin, PJRT_Client_AddressableDevices, args)?;
        self.wrap_devices(args.devices, args.num_devices)
    }

    fn wrap_devices(&self, raw: *const *mut ffi::Device, len: usize) -> Result<Vec<Device>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned this array with this many entries in the successful call above, owned by the
        // object, which is alive here.
        unsafe { std::slice::from_raw_parts(raw, len) }.iter().map(|&d| Device::from_raw(&self.inner, d)).collect()
    }

    /// Compiles StableHLO MLIR text for this client's devices, or loads it from the
    /// compilation cache ([`super::compile_cache`]) when that holds it.
    pub fn compile(&self, mlir: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        super::compile_cache::compile_through(self, mlir, options, || self.compile_uncached(mlir, options))
    }

    /// The executable of `mlir`, serialized, through the compilation cache (`jax_cache_dir`):
    /// what a pipeline loads onto each stage that runs the program.
    pub fn compile_serialized(&self, mlir: &str, options: &CompileOptions) -> Result<Vec<u8>> {
        super::compile_cache::serialized_through(self, mlir, options, || {
            self.compile_uncached(mlir, options)?.executable().serialize()
        })
    }

    /// [`Client::compile`] without the compilation cache, for an executable that will be
    /// serialized (an AOT artifact, a pipeline stage's program shared with other stages): a CPU
    /// executable loaded from serialized bytes does not serialize whole again (running the copy
    /// fails with "Function wrapped_broadcast.7 not found").
    pub fn compile_uncached(&self, mlir: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        let options_bytes = options.to_proto_bytes();
        let program = mlir_program(mlir);
        let mut args: ffi::ClientCompileArgs = ffi::args();
        args.client = self.inner.raw;
        args.program = &program;
        args.compile_options = options_bytes.as_ptr().cast();
        args.compile_options_size = options_bytes.len();
        let _beside_others = compiling();
        crate::pjrt_call!(self.inner.plugin, PJRT_Client_Compile, args)?;
        LoadedExecutable::from_raw(&self.inner, args.executable)
    }

    /// Loads an executable serialized by [`super::Executable::serialize`] (same plugin build).
    pub fn deserialize(&self, bytes: &[u8]) -> Result<LoadedExecutable> {
        self.deserialize_with(bytes, None)
    }

    /// [`Client::deserialize`] with compile options that replace the serialized ones: e.g. the
    /// same program on other devices (`device_assignment`), without compiling it again.
    pub fn deserialize_with_options(&self, bytes: &[u8], options: &CompileOptions) -> Result<LoadedExecutable> {
        self.deserialize_with(bytes, Some(&options.to_proto_bytes()))
    }

    fn deserialize_with(&self, bytes: &[u8], options: Option<&[u8]>) -> Result<LoadedExecutable> {
        let mut args: ffi::ExecutableDeserializeAndLoadArgs = ffi::args();
        args.client = self.inner.raw;
        args.serialized_executable = bytes.as_ptr().cast();
        args.serialized_executable_size = bytes.len();
        if let Some(options) = options {
            args.overridden_serialized_compile_options = options.as_ptr().cast();
            args.overridden_serialized_compile_options_size = options.len();
        }
        crate::pjrt_call!(self.inner.plugin, PJRT_Executable_DeserializeAndLoad, args)?;
        LoadedExecutable::from_raw(&self.inner, args.loaded_executable)
    }

    /// Copies a host tensor to `device`. The host bytes are read in place (no staging copy);
    /// this returns once the plugin is done reading them.
    pub fn to_device(&self, tensor: &HostTensor, device: &Device) -> Result<Buffer> {
        self.bytes_to_device(&tensor.data, tensor.ty, &tensor.dims, device)
    }

    /// Like [`Client::to_device`] for bytes that are not in a [`HostTensor`] (e.g. a slice of
    /// a memory-mapped checkpoint).
    pub fn bytes_to_device(&self, data: &[u8], ty: DType, dims: &[i64], device: &Device) -> Result<Buffer> {
        let count: i64 = dims.iter().product();
        if dims.iter().any(|&d| d < 0) || data.len() != count as usize * ty.byte_size() {
            return Err(Error::invalid(format!(
                "host data of {} bytes does not match shape {}",
                data.len(),
                crate::host::shape_string(ty, dims)
            )));
        }
        let mut args: ffi::ClientBufferFromHostBufferArgs = ffi::args();
        args.client = self.inner.raw;
        args.data = data.as_ptr().cast();
        args.buffer_type = super::buffer::to_raw(ty);
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = ffi::HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
        args.device = device.raw;
        crate::pjrt_call!(self.inner.plugin, PJRT_Client_BufferFromHostBuffer, args)?;
        let buffer = Buffer { client: self.inner.clone(), raw: args.buffer };
        // `data` is borrowed only for this call: wait until the plugin has read it.
        Event::new(self.inner.plugin.clone(), args.done_with_host_buffer).wait()?;
        Ok(buffer)
    }
}

/// A `PJRT_Program` pointing at StableHLO MLIR text (format `mlir`); it borrows `mlir`, which
/// the plugin only reads while compiling.
pub(crate) fn mlir_program(mlir: &str) -> ffi::Program {
    const FORMAT: &str = "mlir";
    let mut program: ffi::Program = ffi::args();
    program.code = mlir.as_ptr() as *mut _;
    program.code_size = mlir.len();
    program.format = FORMAT.as_ptr().cast();
    program.format_size = FORMAT.len();
    program
}

// ---- key-value store callbacks (called by the plugin, possibly from its own threads) ----

/// Hands a value to the plugin: a heap block whose first 8 bytes hold the length, so the
/// deleter (which only gets the data pointer back) can rebuild and free it.
fn leak_value(value: Vec<u8>) -> (*mut std::ffi::c_char, usize) {
    let len = value.len();
    let mut block = Vec::with_capacity(8 + len);
    block.extend_from_slice(&len.to_le_bytes());
    block.extend_from_slice(&value);
    let block = Box::into_raw(block.into_boxed_slice()) as *mut u8;
    // SAFETY: `block` is 8 + len bytes long, so offset 8 is within it or one past its end.
    (unsafe { block.add(8) } as *mut std::ffi::c_char, len)
}

unsafe extern "C" fn free_value(value: *mut std::ffi::c_char) {
    if value.is_null() {
        return;
    }
    let base = (value as *mut u8).sub(8);
    let len = usize::from_le_bytes(std::ptr::read_unaligned(base as *const [u8; 8]));
    drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(base, 8 + len)));
}

unsafe fn callback_error(make: *mut ffi::CallbackError, code: ErrorCode, message: &str) -> *mut ffi::Error {
    if make.is_null() {
        return std::ptr::null_mut();
    }
    (*make)(code.to_raw(), message.as_ptr().cast(), message.len())
}

unsafe fn store<'a>(user_arg: *mut c_void) -> &'a Arc<dyn KeyValueStore> {
    &*(user_arg as *const Arc<dyn KeyValueStore>)
}

unsafe extern "C" fn kv_get(args: *mut ffi::KvGetCallbackArgs) -> *mut ffi::Error {
    let args = &mut *args;
    let key = string_from(args.key, args.key_size);
    let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
    let result = catch_unwind(AssertUnwindSafe(|| store(args.user_arg).get(&key, timeout)));
    match result {
        Ok(Ok(value)) => {
            (args.value, args.value_size) = leak_value(value);
            args.value_deleter_callback = Some(free_value);
            std::ptr::null_mut()
        }
        Ok(Err(message)) => callback_error(args.callback_error, ErrorCode::DeadlineExceeded, &message),
        Err(_) => callback_error(args.callback_error, ErrorCode::Internal, "key-value store get panicked"),
    }
}

unsafe extern "C" fn kv_try_get(args: *mut ffi::KvTryGetCallbackArgs) -> *mut ffi::Error {
    let args = &mut *args;
    let key = string_from(args.key, args.key_size);
    let result = catch_unwind(AssertUnwindSafe(|| store(args.user_arg).try_get(&key)));
    match result {
        Ok(Ok(Some(value))) => {
            (args.value, args.value_size) = leak_value(value);
            args.value_deleter_callback = Some(free_value);
            std::ptr::null_mut()
        }
        Ok(Ok(None)) => callback_error(args.callback_error, ErrorCode::NotFound, &format!("key {key} not found")),
        Ok(Err(message)) => callback_error(args.callback_error, ErrorCode::Unavailable, &message),
        Err(_) => callback_error(args.callback_error, ErrorCode::Internal, "key-value store try_get panicked"),
    }
}

unsafe extern "C" fn kv_put(args: *mut ffi::KvPutCallbackArgs) -> *mut ffi::Error {
    let args = &mut *args;
    let key = string_from(args.key, args.key_size);
    let value = if args.value.is_null() {
        &[][..]
    } else {
        std::slice::from_raw_parts(args.value as *const u8, args.value_size)
    };
    let result = catch_unwind(AssertUnwindSafe(|| store(args.user_arg).put(&key, value)));
    match result {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(message)) => callback_error(args.callback_error, ErrorCode::Unavailable, &message),
        Err(_) => callback_error(args.callback_error, ErrorCode::Internal, "key-value store put panicked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaked_values_round_trip_through_the_deleter() {
        let (ptr, len) = leak_value(b"local_topology/cuda/0".to_vec());
        assert_eq!(len, 21);
        // SAFETY: `leak_value` returned a pointer to `len` initialized bytes, not yet freed.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        assert_eq!(bytes, b"local_topology/cuda/0");
        // SAFETY: `ptr` came from `leak_value` and is freed once.
        unsafe { free_value(ptr) };
    }
}
