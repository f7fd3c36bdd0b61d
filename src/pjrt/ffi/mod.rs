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
pub unsafe trait ArgsStruct: Sized {
    /// The `struct_size` a caller sets, as `pjrt_c_api.h` defines it (`PJRT_STRUCT_SIZE`): the
    /// offset of the last field plus its size, without the trailing padding `size_of` counts.
    /// The layout checks at the end of this file compare it with the header's `*_STRUCT_SIZE`.
    const STRUCT_SIZE: usize;
}

/// The end of the furthest of `fields` (offset + size): [`ArgsStruct::STRUCT_SIZE`] of a
/// `#[repr(C)]` struct whose fields are laid out in declaration order.
pub const fn end_of_last_field(fields: &[(usize, usize)]) -> usize {
    let mut end = 0;
    let mut i = 0;
    while i < fields.len() {
        let (offset, size) = fields[i];
        if offset + size > end {
            end = offset + size;
        }
        i += 1;
    }
    end
}

/// A zeroed args struct with `struct_size` set: the way the header asks callers to build them.
pub fn args<T: ArgsStruct>() -> T {
    // SAFETY: `ArgsStruct` promises that all-zero bytes are a valid `T`.
    let mut value: T = unsafe { std::mem::zeroed() };
    // SAFETY: `ArgsStruct` promises a `#[repr(C)]` struct whose first field, at offset 0, is a
    // `usize`; `value` is a live, aligned `T`.
    unsafe { *(&mut value as *mut T as *mut usize) = T::STRUCT_SIZE };
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
unsafe impl ArgsStruct for NamedValue {
    const STRUCT_SIZE: usize = end_of_last_field(&[(std::mem::offset_of!(NamedValue, value_size), 8)]);
}

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
        unsafe impl ArgsStruct for $name {
            const STRUCT_SIZE: usize = end_of_last_field(&[
                (std::mem::offset_of!($name, extension_start), std::mem::size_of::<*mut ExtensionBase>()),
                $((std::mem::offset_of!($name, $field), std::mem::size_of::<$ty>()),)*
            ]);
        }
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

// The layout of every struct above, checked against the C header at compile time.
mod layouts;
