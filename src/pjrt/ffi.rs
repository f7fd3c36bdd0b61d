//! Raw declarations of the part of XLA's PJRT C API that maxrs calls.
//!
//! Written by hand against the struct layouts of PJRT C API 0.81 (`pjrt_c_api.h`), which every
//! current plugin accepts: a plugin checks `struct_size >= the smallest size it supports`, so an
//! older, shorter struct is fine while a struct with unknown trailing fields is not.
//! Every args struct starts with `struct_size` and `extension_start`; build them with [`args`].
//! Only the functions maxrs uses get typed argument structs; the others keep their slot in
//! [`Api`] (the table is positional) with an opaque argument type.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

/// PJRT C API version this binding was written against.
pub const API_MAJOR: i32 = 0;
pub const API_MINOR: i32 = 81;

macro_rules! opaque {
    ($($name:ident),* $(,)?) => { $(#[repr(C)] pub struct $name { _private: [u8; 0] })* };
}
opaque!(
    Error,
    Client,
    Device,
    DeviceDescription,
    Memory,
    Event,
    Buffer,
    Executable,
    LoadedExecutable,
    TopologyDescription,
    SerializedExecutable,
    SerializedTopology,
    ExtensionBase,
    Unused
);

/// The structs the C API sizes by a leading `struct_size` field.
///
/// # Safety
/// Implement it only for `#[repr(C)]` structs whose first field is the `usize` struct size and
/// for which all-zero bytes are a valid value of every field (null pointers, zero integers,
/// `false`, `None` function pointers). `args_struct!` implements it for what it declares.
pub unsafe trait ArgsStruct: Sized {}

/// A zeroed args struct with `struct_size` set: the way the header asks callers to build them.
pub fn args<T: ArgsStruct>() -> T {
    // SAFETY: `ArgsStruct` promises that all-zero bytes are a valid `T`.
    let mut value: T = unsafe { std::mem::zeroed() };
    // SAFETY: `ArgsStruct` promises a `#[repr(C)]` struct whose first field, at offset 0, is a
    // `usize`; `value` is a live, aligned `T`.
    unsafe { *(&mut value as *mut T as *mut usize) = std::mem::size_of::<T>() };
    value
}

pub type ErrorCode = c_int;
pub type BufferType = c_int;

pub const NAMED_STRING: c_int = 0;
pub const NAMED_INT64: c_int = 1;
pub const NAMED_INT64_LIST: c_int = 2;
pub const NAMED_FLOAT: c_int = 3;
pub const NAMED_BOOL: c_int = 4;

pub const HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES: c_int = 1;

#[repr(C)]
#[derive(Clone, Copy)]
pub union NamedValueUnion {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

// SAFETY: repr(C), `struct_size` first, and every field (pointers, integers, the union of
// plain values) is valid as zero bytes.
unsafe impl ArgsStruct for NamedValue {}

#[repr(C)]
pub struct NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub name: *const c_char,
    pub name_size: usize,
    pub value_type: c_int,
    pub value: NamedValueUnion,
    pub value_size: usize,
}

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub major_version: c_int,
    pub minor_version: c_int,
}

/// Declares an args struct: the two standard leading fields plus the listed ones.
macro_rules! args_struct {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut ExtensionBase,
            $(pub $field: $ty,)*
        }

        // SAFETY: repr(C) with `struct_size` first; the fields are pointers, integers, bools
        // and optional function pointers, all valid as zero bytes.
        unsafe impl ArgsStruct for $name {}
    };
}

pub type CallbackError = unsafe extern "C" fn(code: ErrorCode, message: *const c_char, size: usize) -> *mut Error;
pub type ValueDeleter = unsafe extern "C" fn(value: *mut c_char);

args_struct!(ErrorDestroyArgs { error: *mut Error });
args_struct!(ErrorMessageArgs { error: *const Error, message: *const c_char, message_size: usize });
args_struct!(ErrorGetCodeArgs { error: *const Error, code: ErrorCode });
args_struct!(PluginInitializeArgs {});
args_struct!(PluginAttributesArgs { attributes: *const NamedValue, num_attributes: usize });
args_struct!(EventDestroyArgs { event: *mut Event });
args_struct!(EventAwaitArgs { event: *mut Event });
/// Called once when an event is ready; it owns `error` (null when the event succeeded).
pub type EventOnReadyCallback = unsafe extern "C" fn(error: *mut Error, user_arg: *mut c_void);
args_struct!(EventOnReadyArgs { event: *mut Event, callback: Option<EventOnReadyCallback>, user_arg: *mut c_void });
args_struct!(BufferReadyEventArgs { buffer: *mut Buffer, event: *mut Event });
args_struct!(KvGetCallbackArgs {
    key: *const c_char,
    key_size: usize,
    timeout_in_ms: c_int,
    callback_error: *mut CallbackError,
    user_arg: *mut c_void,
    value: *mut c_char,
    value_size: usize,
    value_deleter_callback: Option<ValueDeleter>,
});
args_struct!(KvTryGetCallbackArgs {
    key: *const c_char,
    key_size: usize,
    callback_error: *mut CallbackError,
    user_arg: *mut c_void,
    value: *mut c_char,
    value_size: usize,
    value_deleter_callback: Option<ValueDeleter>,
});
args_struct!(KvPutCallbackArgs {
    key: *const c_char,
    key_size: usize,
    value: *const c_char,
    value_size: usize,
    callback_error: *mut CallbackError,
    user_arg: *mut c_void,
});
pub type KvGetCallback = unsafe extern "C" fn(args: *mut KvGetCallbackArgs) -> *mut Error;
pub type KvTryGetCallback = unsafe extern "C" fn(args: *mut KvTryGetCallbackArgs) -> *mut Error;
pub type KvPutCallback = unsafe extern "C" fn(args: *mut KvPutCallbackArgs) -> *mut Error;

args_struct!(ClientCreateArgs {
    create_options: *const NamedValue,
    num_options: usize,
    kv_get_callback: Option<KvGetCallback>,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: Option<KvPutCallback>,
    kv_put_user_arg: *mut c_void,
    client: *mut Client,
    kv_try_get_callback: Option<KvTryGetCallback>,
    kv_try_get_user_arg: *mut c_void,
});
args_struct!(ClientDestroyArgs { client: *mut Client });
args_struct!(ClientPlatformNameArgs { client: *mut Client, platform_name: *const c_char, platform_name_size: usize });
args_struct!(ClientProcessIndexArgs { client: *mut Client, process_index: c_int });
args_struct!(ClientPlatformVersionArgs { client: *mut Client, platform_version: *const c_char, platform_version_size: usize });
args_struct!(ClientDevicesArgs { client: *mut Client, devices: *const *mut Device, num_devices: usize });
args_struct!(Program { code: *mut c_char, code_size: usize, format: *const c_char, format_size: usize });
args_struct!(ClientCompileArgs {
    client: *mut Client,
    program: *const Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut LoadedExecutable,
});
args_struct!(ClientBufferFromHostBufferArgs {
    client: *mut Client,
    data: *const c_void,
    buffer_type: BufferType,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: c_int,
    device: *mut Device,
    memory: *mut Memory,
    device_layout: *mut c_void,
    done_with_host_buffer: *mut Event,
    buffer: *mut Buffer,
});

args_struct!(DeviceDescriptionIdArgs { device_description: *mut DeviceDescription, id: c_int });
args_struct!(DeviceDescriptionProcessIndexArgs { device_description: *mut DeviceDescription, process_index: c_int });
args_struct!(DeviceDescriptionAttributesArgs {
    device_description: *mut DeviceDescription,
    num_attributes: usize,
    attributes: *const NamedValue,
});
args_struct!(DeviceDescriptionKindArgs { device_description: *mut DeviceDescription, device_kind: *const c_char, device_kind_size: usize });
args_struct!(DeviceGetDescriptionArgs { device: *mut Device, device_description: *mut DeviceDescription });
args_struct!(DeviceIsAddressableArgs { device: *mut Device, is_addressable: bool });
args_struct!(DeviceMemoryStatsArgs {
    device: *mut Device,
    bytes_in_use: i64,
    peak_bytes_in_use: i64,
    peak_bytes_in_use_is_set: bool,
    num_allocs: i64,
    num_allocs_is_set: bool,
    largest_alloc_size: i64,
    largest_alloc_size_is_set: bool,
    bytes_limit: i64,
    bytes_limit_is_set: bool,
    bytes_reserved: i64,
    bytes_reserved_is_set: bool,
    peak_bytes_reserved: i64,
    peak_bytes_reserved_is_set: bool,
    bytes_reservable_limit: i64,
    bytes_reservable_limit_is_set: bool,
    largest_free_block_bytes: i64,
    largest_free_block_bytes_is_set: bool,
    pool_bytes: i64,
    pool_bytes_is_set: bool,
    peak_pool_bytes: i64,
    peak_pool_bytes_is_set: bool,
});

args_struct!(ExecutableDestroyArgs { executable: *mut Executable });
args_struct!(ExecutableNameArgs { executable: *mut Executable, executable_name: *const c_char, executable_name_size: usize });
args_struct!(ExecutableNumPartitionsArgs { executable: *mut Executable, num_partitions: usize });
args_struct!(ExecutableNumOutputsArgs { executable: *mut Executable, num_outputs: usize });
args_struct!(ExecutableGetCostAnalysisArgs { executable: *mut Executable, num_properties: usize, properties: *const NamedValue });
args_struct!(ExecutableOptimizedProgramArgs { executable: *mut Executable, program: *mut Program });
args_struct!(ExecutableSerializeArgs {
    executable: *const Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut SerializedExecutable,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut SerializedExecutable)>,
});
args_struct!(ExecutableFingerprintArgs { executable: *mut Executable, executable_fingerprint: *const c_char, executable_fingerprint_size: usize });
args_struct!(ExecutableGetCompiledMemoryStatsArgs {
    executable: *mut Executable,
    generated_code_size_in_bytes: i64,
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    host_generated_code_size_in_bytes: i64,
    host_argument_size_in_bytes: i64,
    host_output_size_in_bytes: i64,
    host_alias_size_in_bytes: i64,
    host_temp_size_in_bytes: i64,
    peak_memory_in_bytes: i64,
});
args_struct!(ExecutableOutputElementTypesArgs { executable: *mut Executable, output_types: *const BufferType, num_output_types: usize });
args_struct!(ExecutableOutputDimensionsArgs { executable: *mut Executable, num_outputs: usize, dims: *const i64, dim_sizes: *const usize });

args_struct!(LoadedExecutableDestroyArgs { executable: *mut LoadedExecutable });
args_struct!(LoadedExecutableGetExecutableArgs { loaded_executable: *mut LoadedExecutable, executable: *mut Executable });
args_struct!(LoadedExecutableAddressableDevicesArgs {
    executable: *mut LoadedExecutable,
    addressable_devices: *const *mut Device,
    num_addressable_devices: usize,
});
args_struct!(ExecuteOptions {
    send_callbacks: *mut c_void,
    recv_callbacks: *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut c_void,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut c_int,
    incarnation_ids: *mut i64,
});
args_struct!(LoadedExecutableExecuteArgs {
    executable: *mut LoadedExecutable,
    options: *mut ExecuteOptions,
    argument_lists: *const *const *mut Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut Buffer,
    device_complete_events: *mut *mut Event,
    execute_device: *mut Device,
});
args_struct!(ExecutableDeserializeAndLoadArgs {
    client: *mut Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});

args_struct!(BufferDestroyArgs { buffer: *mut Buffer });
args_struct!(BufferElementTypeArgs { buffer: *mut Buffer, buffer_type: BufferType });
args_struct!(BufferDimensionsArgs { buffer: *mut Buffer, dims: *const i64, num_dims: usize });
args_struct!(BufferDeviceArgs { buffer: *mut Buffer, device: *mut Device });
args_struct!(BufferIsDeletedArgs { buffer: *mut Buffer, is_deleted: bool });
args_struct!(BufferCopyToDeviceArgs { buffer: *mut Buffer, dst_device: *mut Device, dst_buffer: *mut Buffer });
args_struct!(BufferToHostBufferArgs {
    src: *mut Buffer,
    host_layout: *mut c_void,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut Event,
});

args_struct!(TopologyCreateArgs {
    topology_name: *const c_char,
    topology_name_size: usize,
    create_options: *const NamedValue,
    num_options: usize,
    topology: *mut TopologyDescription,
});
args_struct!(TopologyDestroyArgs { topology: *mut TopologyDescription });
args_struct!(TopologyPlatformNameArgs { topology: *const TopologyDescription, platform_name: *const c_char, platform_name_size: usize });
args_struct!(TopologyPlatformVersionArgs { topology: *mut TopologyDescription, platform_version: *const c_char, platform_version_size: usize });
args_struct!(TopologyGetDeviceDescriptionsArgs {
    topology: *const TopologyDescription,
    descriptions: *const *mut DeviceDescription,
    num_descriptions: usize,
});
args_struct!(CompileArgs {
    topology: *const TopologyDescription,
    program: *const Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    client: *mut Client,
    executable: *mut Executable,
});

/// A slot in the function table.
pub type Fn<A> = Option<unsafe extern "C" fn(args: *mut A) -> *mut Error>;
type Skip = Fn<Unused>;

/// The plugin's function table (`PJRT_Api`), in header order. Fields maxrs never calls are
/// typed `Skip`; they are there so the offsets of the later fields are right.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub pjrt_api_version: ApiVersion,

    pub PJRT_Error_Destroy: Fn<ErrorDestroyArgs>,
    pub PJRT_Error_Message: Fn<ErrorMessageArgs>,
    pub PJRT_Error_GetCode: Fn<ErrorGetCodeArgs>,

    pub PJRT_Plugin_Initialize: Fn<PluginInitializeArgs>,
    pub PJRT_Plugin_Attributes: Fn<PluginAttributesArgs>,

    pub PJRT_Event_Destroy: Fn<EventDestroyArgs>,
    pub PJRT_Event_IsReady: Skip,
    pub PJRT_Event_Error: Skip,
    pub PJRT_Event_Await: Fn<EventAwaitArgs>,
    pub PJRT_Event_OnReady: Fn<EventOnReadyArgs>,

    pub PJRT_Client_Create: Fn<ClientCreateArgs>,
    pub PJRT_Client_Destroy: Fn<ClientDestroyArgs>,
    pub PJRT_Client_PlatformName: Fn<ClientPlatformNameArgs>,
    pub PJRT_Client_ProcessIndex: Fn<ClientProcessIndexArgs>,
    pub PJRT_Client_PlatformVersion: Fn<ClientPlatformVersionArgs>,
    pub PJRT_Client_Devices: Fn<ClientDevicesArgs>,
    pub PJRT_Client_AddressableDevices: Fn<ClientDevicesArgs>,
    pub PJRT_Client_LookupDevice: Skip,
    pub PJRT_Client_LookupAddressableDevice: Skip,
    pub PJRT_Client_AddressableMemories: Skip,
    pub PJRT_Client_Compile: Fn<ClientCompileArgs>,
    pub PJRT_Client_DefaultDeviceAssignment: Skip,
    pub PJRT_Client_BufferFromHostBuffer: Fn<ClientBufferFromHostBufferArgs>,

    pub PJRT_DeviceDescription_Id: Fn<DeviceDescriptionIdArgs>,
    pub PJRT_DeviceDescription_ProcessIndex: Fn<DeviceDescriptionProcessIndexArgs>,
    pub PJRT_DeviceDescription_Attributes: Fn<DeviceDescriptionAttributesArgs>,
    pub PJRT_DeviceDescription_Kind: Fn<DeviceDescriptionKindArgs>,
    pub PJRT_DeviceDescription_DebugString: Skip,
    pub PJRT_DeviceDescription_ToString: Skip,

    pub PJRT_Device_GetDescription: Fn<DeviceGetDescriptionArgs>,
    pub PJRT_Device_IsAddressable: Fn<DeviceIsAddressableArgs>,
    pub PJRT_Device_LocalHardwareId: Skip,
    pub PJRT_Device_AddressableMemories: Skip,
    pub PJRT_Device_DefaultMemory: Skip,
    pub PJRT_Device_MemoryStats: Fn<DeviceMemoryStatsArgs>,

    pub PJRT_Memory_Id: Skip,
    pub PJRT_Memory_Kind: Skip,
    pub PJRT_Memory_DebugString: Skip,
    pub PJRT_Memory_ToString: Skip,
    pub PJRT_Memory_AddressableByDevices: Skip,

    pub PJRT_Executable_Destroy: Fn<ExecutableDestroyArgs>,
    pub PJRT_Executable_Name: Fn<ExecutableNameArgs>,
    pub PJRT_Executable_NumReplicas: Skip,
    pub PJRT_Executable_NumPartitions: Fn<ExecutableNumPartitionsArgs>,
    pub PJRT_Executable_NumOutputs: Fn<ExecutableNumOutputsArgs>,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes: Skip,
    pub PJRT_Executable_GetCostAnalysis: Fn<ExecutableGetCostAnalysisArgs>,
    pub PJRT_Executable_OutputMemoryKinds: Skip,
    pub PJRT_Executable_OptimizedProgram: Fn<ExecutableOptimizedProgramArgs>,
    pub PJRT_Executable_Serialize: Fn<ExecutableSerializeArgs>,

    pub PJRT_LoadedExecutable_Destroy: Fn<LoadedExecutableDestroyArgs>,
    pub PJRT_LoadedExecutable_GetExecutable: Fn<LoadedExecutableGetExecutableArgs>,
    pub PJRT_LoadedExecutable_AddressableDevices: Fn<LoadedExecutableAddressableDevicesArgs>,
    pub PJRT_LoadedExecutable_Delete: Skip,
    pub PJRT_LoadedExecutable_IsDeleted: Skip,
    pub PJRT_LoadedExecutable_Execute: Fn<LoadedExecutableExecuteArgs>,
    pub PJRT_Executable_DeserializeAndLoad: Fn<ExecutableDeserializeAndLoadArgs>,
    pub PJRT_LoadedExecutable_Fingerprint: Skip,

    pub PJRT_Buffer_Destroy: Fn<BufferDestroyArgs>,
    pub PJRT_Buffer_ElementType: Fn<BufferElementTypeArgs>,
    pub PJRT_Buffer_Dimensions: Fn<BufferDimensionsArgs>,
    pub PJRT_Buffer_UnpaddedDimensions: Skip,
    pub PJRT_Buffer_DynamicDimensionIndices: Skip,
    pub PJRT_Buffer_GetMemoryLayout: Skip,
    pub PJRT_Buffer_OnDeviceSizeInBytes: Skip,
    pub PJRT_Buffer_Device: Fn<BufferDeviceArgs>,
    pub PJRT_Buffer_Memory: Skip,
    pub PJRT_Buffer_Delete: Skip,
    pub PJRT_Buffer_IsDeleted: Fn<BufferIsDeletedArgs>,
    pub PJRT_Buffer_CopyToDevice: Fn<BufferCopyToDeviceArgs>,
    pub PJRT_Buffer_ToHostBuffer: Fn<BufferToHostBufferArgs>,
    pub PJRT_Buffer_IsOnCpu: Skip,
    pub PJRT_Buffer_ReadyEvent: Fn<BufferReadyEventArgs>,
    pub PJRT_Buffer_UnsafePointer: Skip,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: Skip,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: Skip,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Skip,

    pub PJRT_CopyToDeviceStream_Destroy: Skip,
    pub PJRT_CopyToDeviceStream_AddChunk: Skip,
    pub PJRT_CopyToDeviceStream_TotalBytes: Skip,
    pub PJRT_CopyToDeviceStream_GranuleSize: Skip,
    pub PJRT_CopyToDeviceStream_CurrentBytes: Skip,

    pub PJRT_TopologyDescription_Create: Fn<TopologyCreateArgs>,
    pub PJRT_TopologyDescription_Destroy: Fn<TopologyDestroyArgs>,
    pub PJRT_TopologyDescription_PlatformName: Fn<TopologyPlatformNameArgs>,
    pub PJRT_TopologyDescription_PlatformVersion: Fn<TopologyPlatformVersionArgs>,
    pub PJRT_TopologyDescription_GetDeviceDescriptions: Fn<TopologyGetDeviceDescriptionsArgs>,
    pub PJRT_TopologyDescription_Serialize: Skip,
    pub PJRT_TopologyDescription_Attributes: Skip,

    pub PJRT_Compile: Fn<CompileArgs>,

    pub PJRT_Executable_OutputElementTypes: Fn<ExecutableOutputElementTypesArgs>,
    pub PJRT_Executable_OutputDimensions: Fn<ExecutableOutputDimensionsArgs>,
    pub PJRT_Buffer_CopyToMemory: Skip,
    pub PJRT_Client_CreateViewOfDeviceBuffer: Skip,
    pub PJRT_Executable_Fingerprint: Fn<ExecutableFingerprintArgs>,
    pub PJRT_Client_TopologyDescription: Skip,
    pub PJRT_Executable_GetCompiledMemoryStats: Fn<ExecutableGetCompiledMemoryStatsArgs>,
}

/// `GetPjrtApi`, the one symbol a plugin exports.
pub type GetPjrtApi = unsafe extern "C" fn() -> *const Api;

/// Checks at compile time that a struct has the size and field offsets of its C counterpart.
macro_rules! layout {
    ($name:ident = _ { $($field:ident : $offset:expr),* $(,)? }) => {
        $(const _: () = assert!(std::mem::offset_of!($name, $field) == $offset, concat!(stringify!($name), ".", stringify!($field)));)*
    };
    ($name:ident = $size:literal { $($field:ident : $offset:expr),* $(,)? }) => {
        const _: () = assert!(std::mem::size_of::<$name>() == $size, concat!("size of ", stringify!($name)));
        layout!($name = _ { $($field: $offset),* });
    };
}

// The layouts of pjrt_c_api.h 0.81 (the header in the PyPI wheel xla-cpu-pjrt==0.0.1), printed by
// `python3 tools/pjrt_layouts.py pjrt_c_api.h`, which compiles the header with a C compiler. A
// struct or field declared above that disagrees with the header does not compile.
layout!(ErrorDestroyArgs = 24 { struct_size: 0, extension_start: 8, error: 16, });
layout!(ErrorMessageArgs = 40 { struct_size: 0, extension_start: 8, error: 16, message: 24, message_size: 32, });
layout!(ErrorGetCodeArgs = 32 { struct_size: 0, extension_start: 8, error: 16, code: 24, });
layout!(PluginInitializeArgs = 16 { struct_size: 0, extension_start: 8, });
layout!(PluginAttributesArgs = 32 { struct_size: 0, extension_start: 8, attributes: 16, num_attributes: 24, });
layout!(EventDestroyArgs = 24 { struct_size: 0, extension_start: 8, event: 16, });
layout!(EventAwaitArgs = 24 { struct_size: 0, extension_start: 8, event: 16, });
layout!(EventOnReadyArgs = 40 { struct_size: 0, extension_start: 8, event: 16, callback: 24, user_arg: 32, });
layout!(BufferReadyEventArgs = 32 { struct_size: 0, extension_start: 8, buffer: 16, event: 24, });
layout!(KvGetCallbackArgs = 80 { struct_size: 0, extension_start: 8, key: 16, key_size: 24, timeout_in_ms: 32, callback_error: 40, user_arg: 48, value: 56, value_size: 64, value_deleter_callback: 72, });
layout!(KvTryGetCallbackArgs = 72 { struct_size: 0, extension_start: 8, key: 16, key_size: 24, callback_error: 32, user_arg: 40, value: 48, value_size: 56, value_deleter_callback: 64, });
layout!(KvPutCallbackArgs = 64 { struct_size: 0, extension_start: 8, key: 16, key_size: 24, value: 32, value_size: 40, callback_error: 48, user_arg: 56, });
layout!(ClientCreateArgs = 88 { struct_size: 0, extension_start: 8, create_options: 16, num_options: 24, kv_get_callback: 32, kv_get_user_arg: 40, kv_put_callback: 48, kv_put_user_arg: 56, client: 64, kv_try_get_callback: 72, kv_try_get_user_arg: 80, });
layout!(ClientDestroyArgs = 24 { struct_size: 0, extension_start: 8, client: 16, });
layout!(ClientPlatformNameArgs = 40 { struct_size: 0, extension_start: 8, client: 16, platform_name: 24, platform_name_size: 32, });
layout!(ClientProcessIndexArgs = 32 { struct_size: 0, extension_start: 8, client: 16, process_index: 24, });
layout!(ClientPlatformVersionArgs = 40 { struct_size: 0, extension_start: 8, client: 16, platform_version: 24, platform_version_size: 32, });
layout!(ClientDevicesArgs = 40 { struct_size: 0, extension_start: 8, client: 16, devices: 24, num_devices: 32, });
layout!(Program = 48 { struct_size: 0, extension_start: 8, code: 16, code_size: 24, format: 32, format_size: 40, });
layout!(ClientCompileArgs = 56 { struct_size: 0, extension_start: 8, client: 16, program: 24, compile_options: 32, compile_options_size: 40, executable: 48, });
layout!(ClientBufferFromHostBufferArgs = 120 { struct_size: 0, extension_start: 8, client: 16, data: 24, buffer_type: 32, dims: 40, num_dims: 48, byte_strides: 56, num_byte_strides: 64, host_buffer_semantics: 72, device: 80, memory: 88, device_layout: 96, done_with_host_buffer: 104, buffer: 112, });
layout!(DeviceDescriptionIdArgs = 32 { struct_size: 0, extension_start: 8, device_description: 16, id: 24, });
layout!(DeviceDescriptionProcessIndexArgs = 32 { struct_size: 0, extension_start: 8, device_description: 16, process_index: 24, });
layout!(DeviceDescriptionAttributesArgs = 40 { struct_size: 0, extension_start: 8, device_description: 16, num_attributes: 24, attributes: 32, });
layout!(DeviceDescriptionKindArgs = 40 { struct_size: 0, extension_start: 8, device_description: 16, device_kind: 24, device_kind_size: 32, });
layout!(DeviceGetDescriptionArgs = 32 { struct_size: 0, extension_start: 8, device: 16, device_description: 24, });
layout!(DeviceIsAddressableArgs = 32 { struct_size: 0, extension_start: 8, device: 16, is_addressable: 24, });
layout!(DeviceMemoryStatsArgs = 192 { struct_size: 0, extension_start: 8, device: 16, bytes_in_use: 24, peak_bytes_in_use: 32, peak_bytes_in_use_is_set: 40, num_allocs: 48, num_allocs_is_set: 56, largest_alloc_size: 64, largest_alloc_size_is_set: 72, bytes_limit: 80, bytes_limit_is_set: 88, bytes_reserved: 96, bytes_reserved_is_set: 104, peak_bytes_reserved: 112, peak_bytes_reserved_is_set: 120, bytes_reservable_limit: 128, bytes_reservable_limit_is_set: 136, largest_free_block_bytes: 144, largest_free_block_bytes_is_set: 152, pool_bytes: 160, pool_bytes_is_set: 168, peak_pool_bytes: 176, peak_pool_bytes_is_set: 184, });
layout!(ExecutableDestroyArgs = 24 { struct_size: 0, extension_start: 8, executable: 16, });
layout!(ExecutableNameArgs = 40 { struct_size: 0, extension_start: 8, executable: 16, executable_name: 24, executable_name_size: 32, });
layout!(ExecutableNumPartitionsArgs = 32 { struct_size: 0, extension_start: 8, executable: 16, num_partitions: 24, });
layout!(ExecutableNumOutputsArgs = 32 { struct_size: 0, extension_start: 8, executable: 16, num_outputs: 24, });
layout!(ExecutableGetCostAnalysisArgs = 40 { struct_size: 0, extension_start: 8, executable: 16, num_properties: 24, properties: 32, });
layout!(ExecutableOptimizedProgramArgs = 32 { struct_size: 0, extension_start: 8, executable: 16, program: 24, });
layout!(ExecutableSerializeArgs = 56 { struct_size: 0, extension_start: 8, executable: 16, serialized_bytes: 24, serialized_bytes_size: 32, serialized_executable: 40, serialized_executable_deleter: 48, });
layout!(ExecutableFingerprintArgs = 40 { struct_size: 0, extension_start: 8, executable: 16, executable_fingerprint: 24, executable_fingerprint_size: 32, });
layout!(ExecutableGetCompiledMemoryStatsArgs = 112 { struct_size: 0, extension_start: 8, executable: 16, generated_code_size_in_bytes: 24, argument_size_in_bytes: 32, output_size_in_bytes: 40, alias_size_in_bytes: 48, temp_size_in_bytes: 56, host_generated_code_size_in_bytes: 64, host_argument_size_in_bytes: 72, host_output_size_in_bytes: 80, host_alias_size_in_bytes: 88, host_temp_size_in_bytes: 96, peak_memory_in_bytes: 104, });
layout!(ExecutableOutputElementTypesArgs = 40 { struct_size: 0, extension_start: 8, executable: 16, output_types: 24, num_output_types: 32, });
layout!(ExecutableOutputDimensionsArgs = 48 { struct_size: 0, extension_start: 8, executable: 16, num_outputs: 24, dims: 32, dim_sizes: 40, });
layout!(LoadedExecutableDestroyArgs = 24 { struct_size: 0, extension_start: 8, executable: 16, });
layout!(LoadedExecutableGetExecutableArgs = 32 { struct_size: 0, extension_start: 8, loaded_executable: 16, executable: 24, });
layout!(LoadedExecutableAddressableDevicesArgs = 40 { struct_size: 0, extension_start: 8, executable: 16, addressable_devices: 24, num_addressable_devices: 32, });
layout!(ExecuteOptions = 112 { struct_size: 0, extension_start: 8, send_callbacks: 16, recv_callbacks: 24, num_send_ops: 32, num_recv_ops: 40, launch_id: 48, non_donatable_input_indices: 56, num_non_donatable_input_indices: 64, context: 72, call_location: 80, num_tasks: 88, task_ids: 96, incarnation_ids: 104, });
layout!(LoadedExecutableExecuteArgs = 80 { struct_size: 0, extension_start: 8, executable: 16, options: 24, argument_lists: 32, num_devices: 40, num_args: 48, output_lists: 56, device_complete_events: 64, execute_device: 72, });
layout!(ExecutableDeserializeAndLoadArgs = 64 { struct_size: 0, extension_start: 8, client: 16, serialized_executable: 24, serialized_executable_size: 32, loaded_executable: 40, overridden_serialized_compile_options: 48, overridden_serialized_compile_options_size: 56, });
layout!(BufferDestroyArgs = 24 { struct_size: 0, extension_start: 8, buffer: 16, });
layout!(BufferElementTypeArgs = 32 { struct_size: 0, extension_start: 8, buffer: 16, buffer_type: 24, });
layout!(BufferDimensionsArgs = 40 { struct_size: 0, extension_start: 8, buffer: 16, dims: 24, num_dims: 32, });
layout!(BufferDeviceArgs = 32 { struct_size: 0, extension_start: 8, buffer: 16, device: 24, });
layout!(BufferIsDeletedArgs = 32 { struct_size: 0, extension_start: 8, buffer: 16, is_deleted: 24, });
layout!(BufferCopyToDeviceArgs = 40 { struct_size: 0, extension_start: 8, buffer: 16, dst_device: 24, dst_buffer: 32, });
layout!(BufferToHostBufferArgs = 56 { struct_size: 0, extension_start: 8, src: 16, host_layout: 24, dst: 32, dst_size: 40, event: 48, });
layout!(TopologyCreateArgs = 56 { struct_size: 0, extension_start: 8, topology_name: 16, topology_name_size: 24, create_options: 32, num_options: 40, topology: 48, });
layout!(TopologyDestroyArgs = 24 { struct_size: 0, extension_start: 8, topology: 16, });
layout!(TopologyPlatformNameArgs = 40 { struct_size: 0, extension_start: 8, topology: 16, platform_name: 24, platform_name_size: 32, });
layout!(TopologyPlatformVersionArgs = 40 { struct_size: 0, extension_start: 8, topology: 16, platform_version: 24, platform_version_size: 32, });
layout!(TopologyGetDeviceDescriptionsArgs = 40 { struct_size: 0, extension_start: 8, topology: 16, descriptions: 24, num_descriptions: 32, });
layout!(CompileArgs = 64 { struct_size: 0, extension_start: 8, topology: 16, program: 24, compile_options: 32, compile_options_size: 40, client: 48, executable: 56, });
layout!(NamedValue = 56 { struct_size: 0, extension_start: 8, name: 16, name_size: 24, value_type: 32, value: 40, value_size: 48, });
layout!(ApiVersion = 24 { struct_size: 0, extension_start: 8, major_version: 16, minor_version: 20, });
layout!(Api = _ { struct_size: 0, extension_start: 8, pjrt_api_version: 16, PJRT_Error_Destroy: 40, PJRT_Error_Message: 48, PJRT_Error_GetCode: 56, PJRT_Plugin_Initialize: 64, PJRT_Plugin_Attributes: 72, PJRT_Event_Destroy: 80, PJRT_Event_IsReady: 88, PJRT_Event_Error: 96, PJRT_Event_Await: 104, PJRT_Event_OnReady: 112, PJRT_Client_Create: 120, PJRT_Client_Destroy: 128, PJRT_Client_PlatformName: 136, PJRT_Client_ProcessIndex: 144, PJRT_Client_PlatformVersion: 152, PJRT_Client_Devices: 160, PJRT_Client_AddressableDevices: 168, PJRT_Client_LookupDevice: 176, PJRT_Client_LookupAddressableDevice: 184, PJRT_Client_AddressableMemories: 192, PJRT_Client_Compile: 200, PJRT_Client_DefaultDeviceAssignment: 208, PJRT_Client_BufferFromHostBuffer: 216, PJRT_DeviceDescription_Id: 224, PJRT_DeviceDescription_ProcessIndex: 232, PJRT_DeviceDescription_Attributes: 240, PJRT_DeviceDescription_Kind: 248, PJRT_DeviceDescription_DebugString: 256, PJRT_DeviceDescription_ToString: 264, PJRT_Device_GetDescription: 272, PJRT_Device_IsAddressable: 280, PJRT_Device_LocalHardwareId: 288, PJRT_Device_AddressableMemories: 296, PJRT_Device_DefaultMemory: 304, PJRT_Device_MemoryStats: 312, PJRT_Memory_Id: 320, PJRT_Memory_Kind: 328, PJRT_Memory_DebugString: 336, PJRT_Memory_ToString: 344, PJRT_Memory_AddressableByDevices: 352, PJRT_Executable_Destroy: 360, PJRT_Executable_Name: 368, PJRT_Executable_NumReplicas: 376, PJRT_Executable_NumPartitions: 384, PJRT_Executable_NumOutputs: 392, PJRT_Executable_SizeOfGeneratedCodeInBytes: 400, PJRT_Executable_GetCostAnalysis: 408, PJRT_Executable_OutputMemoryKinds: 416, PJRT_Executable_OptimizedProgram: 424, PJRT_Executable_Serialize: 432, PJRT_LoadedExecutable_Destroy: 440, PJRT_LoadedExecutable_GetExecutable: 448, PJRT_LoadedExecutable_AddressableDevices: 456, PJRT_LoadedExecutable_Delete: 464, PJRT_LoadedExecutable_IsDeleted: 472, PJRT_LoadedExecutable_Execute: 480, PJRT_Executable_DeserializeAndLoad: 488, PJRT_LoadedExecutable_Fingerprint: 496, PJRT_Buffer_Destroy: 504, PJRT_Buffer_ElementType: 512, PJRT_Buffer_Dimensions: 520, PJRT_Buffer_UnpaddedDimensions: 528, PJRT_Buffer_DynamicDimensionIndices: 536, PJRT_Buffer_GetMemoryLayout: 544, PJRT_Buffer_OnDeviceSizeInBytes: 552, PJRT_Buffer_Device: 560, PJRT_Buffer_Memory: 568, PJRT_Buffer_Delete: 576, PJRT_Buffer_IsDeleted: 584, PJRT_Buffer_CopyToDevice: 592, PJRT_Buffer_ToHostBuffer: 600, PJRT_Buffer_IsOnCpu: 608, PJRT_Buffer_ReadyEvent: 616, PJRT_Buffer_UnsafePointer: 624, PJRT_Buffer_IncreaseExternalReferenceCount: 632, PJRT_Buffer_DecreaseExternalReferenceCount: 640, PJRT_Buffer_OpaqueDeviceMemoryDataPointer: 648, PJRT_CopyToDeviceStream_Destroy: 656, PJRT_CopyToDeviceStream_AddChunk: 664, PJRT_CopyToDeviceStream_TotalBytes: 672, PJRT_CopyToDeviceStream_GranuleSize: 680, PJRT_CopyToDeviceStream_CurrentBytes: 688, PJRT_TopologyDescription_Create: 696, PJRT_TopologyDescription_Destroy: 704, PJRT_TopologyDescription_PlatformName: 712, PJRT_TopologyDescription_PlatformVersion: 720, PJRT_TopologyDescription_GetDeviceDescriptions: 728, PJRT_TopologyDescription_Serialize: 736, PJRT_TopologyDescription_Attributes: 744, PJRT_Compile: 752, PJRT_Executable_OutputElementTypes: 760, PJRT_Executable_OutputDimensions: 768, PJRT_Buffer_CopyToMemory: 776, PJRT_Client_CreateViewOfDeviceBuffer: 784, PJRT_Executable_Fingerprint: 792, PJRT_Client_TopologyDescription: 800, PJRT_Executable_GetCompiledMemoryStats: 808, });
