//! Compile-time checks that every struct of [`super`] has the size, `struct_size` and field
//! offsets of its counterpart in `pjrt_c_api.h` 0.81: a struct or field that disagrees with the
//! header does not compile. The `layout!` lines are generated (see the comment above them).

#![allow(non_snake_case)]

use super::*;

/// Checks at compile time that a struct has the size, `struct_size` and field offsets of its C
/// counterpart.
macro_rules! layout {
    ($name:ident = _ { $($field:ident : $offset:expr),* $(,)? }) => {
        $(const _: () = assert!(std::mem::offset_of!($name, $field) == $offset, concat!(stringify!($name), ".", stringify!($field)));)*
    };
    ($name:ident = $size:literal { $($field:ident : $offset:expr),* $(,)? }) => {
        const _: () = assert!(std::mem::size_of::<$name>() == $size, concat!("size of ", stringify!($name)));
        layout!($name = _ { $($field: $offset),* });
    };
    ($name:ident = $size:literal, struct_size $struct_size:literal { $($field:ident : $offset:expr),* $(,)? }) => {
        const _: () = assert!(std::mem::size_of::<$name>() == $size, concat!("size of ", stringify!($name)));
        layout!($name = _ { struct_size: 0, extension_start: 8 });
        const _: () = assert!(<$name as ArgsStruct>::STRUCT_SIZE == $struct_size, concat!("struct_size of ", stringify!($name)));
        layout!($name = _ { $($field: $offset),* });
    };
}

// The layouts of pjrt_c_api.h 0.81 (the header in the PyPI wheel xla-cpu-pjrt==0.0.1), printed by
// `python3 tools/pjrt_layouts.py pjrt_c_api.h`, which compiles the header with a C compiler. A
// struct or field of ffi/mod.rs that disagrees with the header does not compile.
layout!(ErrorDestroyArgs = 24, struct_size 24 { error: 16, });
layout!(ErrorMessageArgs = 40, struct_size 40 { error: 16, message: 24, message_size: 32, });
layout!(ErrorGetCodeArgs = 32, struct_size 28 { error: 16, code: 24, });
layout!(PluginInitializeArgs = 16, struct_size 16 {});
layout!(PluginAttributesArgs = 32, struct_size 32 { attributes: 16, num_attributes: 24, });
layout!(EventDestroyArgs = 24, struct_size 24 { event: 16, });
layout!(EventAwaitArgs = 24, struct_size 24 { event: 16, });
layout!(EventOnReadyArgs = 40, struct_size 40 { event: 16, callback: 24, user_arg: 32, });
layout!(BufferReadyEventArgs = 32, struct_size 32 { buffer: 16, event: 24, });
layout!(KvGetCallbackArgs = 80, struct_size 80 {
    key: 16, key_size: 24, timeout_in_ms: 32, callback_error: 40, user_arg: 48, value: 56,
    value_size: 64, value_deleter_callback: 72,
});
layout!(KvTryGetCallbackArgs = 72, struct_size 72 {
    key: 16, key_size: 24, callback_error: 32, user_arg: 40, value: 48, value_size: 56,
    value_deleter_callback: 64,
});
layout!(KvPutCallbackArgs = 64, struct_size 64 {
    key: 16, key_size: 24, value: 32, value_size: 40, callback_error: 48, user_arg: 56,
});
layout!(ClientCreateArgs = 88, struct_size 88 {
    create_options: 16, num_options: 24, kv_get_callback: 32, kv_get_user_arg: 40,
    kv_put_callback: 48, kv_put_user_arg: 56, client: 64, kv_try_get_callback: 72,
    kv_try_get_user_arg: 80,
});
layout!(ClientDestroyArgs = 24, struct_size 24 { client: 16, });
layout!(ClientPlatformNameArgs = 40, struct_size 40 {
    client: 16, platform_name: 24, platform_name_size: 32,
});
layout!(ClientProcessIndexArgs = 32, struct_size 28 { client: 16, process_index: 24, });
layout!(ClientPlatformVersionArgs = 40, struct_size 40 {
    client: 16, platform_version: 24, platform_version_size: 32,
});
layout!(ClientDevicesArgs = 40, struct_size 40 { client: 16, devices: 24, num_devices: 32, });
layout!(Program = 48, struct_size 48 { code: 16, code_size: 24, format: 32, format_size: 40, });
layout!(ClientCompileArgs = 56, struct_size 56 {
    client: 16, program: 24, compile_options: 32, compile_options_size: 40, executable: 48,
});
layout!(ClientBufferFromHostBufferArgs = 120, struct_size 120 {
    client: 16, data: 24, buffer_type: 32, dims: 40, num_dims: 48, byte_strides: 56,
    num_byte_strides: 64, host_buffer_semantics: 72, device: 80, memory: 88, device_layout: 96,
    done_with_host_buffer: 104, buffer: 112,
});
layout!(DeviceDescriptionIdArgs = 32, struct_size 28 { device_description: 16, id: 24, });
layout!(DeviceDescriptionProcessIndexArgs = 32, struct_size 28 {
    device_description: 16, process_index: 24,
});
layout!(DeviceDescriptionAttributesArgs = 40, struct_size 40 {
    device_description: 16, num_attributes: 24, attributes: 32,
});
layout!(DeviceDescriptionKindArgs = 40, struct_size 40 {
    device_description: 16, device_kind: 24, device_kind_size: 32,
});
layout!(DeviceGetDescriptionArgs = 32, struct_size 32 { device: 16, device_description: 24, });
layout!(DeviceIsAddressableArgs = 32, struct_size 25 { device: 16, is_addressable: 24, });
layout!(DeviceMemoryStatsArgs = 192, struct_size 185 {
    device: 16, bytes_in_use: 24, peak_bytes_in_use: 32, peak_bytes_in_use_is_set: 40,
    num_allocs: 48, num_allocs_is_set: 56, largest_alloc_size: 64, largest_alloc_size_is_set: 72,
    bytes_limit: 80, bytes_limit_is_set: 88, bytes_reserved: 96, bytes_reserved_is_set: 104,
    peak_bytes_reserved: 112, peak_bytes_reserved_is_set: 120, bytes_reservable_limit: 128,
    bytes_reservable_limit_is_set: 136, largest_free_block_bytes: 144,
    largest_free_block_bytes_is_set: 152, pool_bytes: 160, pool_bytes_is_set: 168,
    peak_pool_bytes: 176, peak_pool_bytes_is_set: 184,
});
layout!(ExecutableDestroyArgs = 24, struct_size 24 { executable: 16, });
layout!(ExecutableNameArgs = 40, struct_size 40 {
    executable: 16, executable_name: 24, executable_name_size: 32,
});
layout!(ExecutableNumPartitionsArgs = 32, struct_size 32 { executable: 16, num_partitions: 24, });
layout!(ExecutableNumOutputsArgs = 32, struct_size 32 { executable: 16, num_outputs: 24, });
layout!(ExecutableGetCostAnalysisArgs = 40, struct_size 40 {
    executable: 16, num_properties: 24, properties: 32,
});
layout!(ExecutableOptimizedProgramArgs = 32, struct_size 32 { executable: 16, program: 24, });
layout!(ExecutableSerializeArgs = 56, struct_size 56 {
    executable: 16, serialized_bytes: 24, serialized_bytes_size: 32, serialized_executable: 40,
    serialized_executable_deleter: 48,
});
layout!(ExecutableFingerprintArgs = 40, struct_size 40 {
    executable: 16, executable_fingerprint: 24, executable_fingerprint_size: 32,
});
layout!(ExecutableGetCompiledMemoryStatsArgs = 112, struct_size 112 {
    executable: 16, generated_code_size_in_bytes: 24, argument_size_in_bytes: 32,
    output_size_in_bytes: 40, alias_size_in_bytes: 48, temp_size_in_bytes: 56,
    host_generated_code_size_in_bytes: 64, host_argument_size_in_bytes: 72,
    host_output_size_in_bytes: 80, host_alias_size_in_bytes: 88, host_temp_size_in_bytes: 96,
    peak_memory_in_bytes: 104,
});
layout!(ExecutableOutputElementTypesArgs = 40, struct_size 40 {
    executable: 16, output_types: 24, num_output_types: 32,
});
layout!(ExecutableOutputDimensionsArgs = 48, struct_size 48 {
    executable: 16, num_outputs: 24, dims: 32, dim_sizes: 40,
});
layout!(LoadedExecutableDestroyArgs = 24, struct_size 24 { executable: 16, });
layout!(LoadedExecutableGetExecutableArgs = 32, struct_size 32 {
    loaded_executable: 16, executable: 24,
});
layout!(LoadedExecutableAddressableDevicesArgs = 40, struct_size 40 {
    executable: 16, addressable_devices: 24, num_addressable_devices: 32,
});
layout!(ExecuteOptions = 112, struct_size 112 {
    send_callbacks: 16, recv_callbacks: 24, num_send_ops: 32, num_recv_ops: 40, launch_id: 48,
    non_donatable_input_indices: 56, num_non_donatable_input_indices: 64, context: 72,
    call_location: 80, num_tasks: 88, task_ids: 96, incarnation_ids: 104,
});
layout!(LoadedExecutableExecuteArgs = 80, struct_size 80 {
    executable: 16, options: 24, argument_lists: 32, num_devices: 40, num_args: 48,
    output_lists: 56, device_complete_events: 64, execute_device: 72,
});
layout!(ExecutableDeserializeAndLoadArgs = 64, struct_size 64 {
    client: 16, serialized_executable: 24, serialized_executable_size: 32, loaded_executable: 40,
    overridden_serialized_compile_options: 48, overridden_serialized_compile_options_size: 56,
});
layout!(BufferDestroyArgs = 24, struct_size 24 { buffer: 16, });
layout!(BufferElementTypeArgs = 32, struct_size 28 { buffer: 16, buffer_type: 24, });
layout!(BufferDimensionsArgs = 40, struct_size 40 { buffer: 16, dims: 24, num_dims: 32, });
layout!(BufferDeviceArgs = 32, struct_size 32 { buffer: 16, device: 24, });
layout!(BufferIsDeletedArgs = 32, struct_size 25 { buffer: 16, is_deleted: 24, });
layout!(BufferCopyToDeviceArgs = 40, struct_size 40 {
    buffer: 16, dst_device: 24, dst_buffer: 32,
});
layout!(BufferToHostBufferArgs = 56, struct_size 56 {
    src: 16, host_layout: 24, dst: 32, dst_size: 40, event: 48,
});
layout!(TopologyCreateArgs = 56, struct_size 56 {
    topology_name: 16, topology_name_size: 24, create_options: 32, num_options: 40, topology: 48,
});
layout!(TopologyDestroyArgs = 24, struct_size 24 { topology: 16, });
layout!(TopologyPlatformNameArgs = 40, struct_size 40 {
    topology: 16, platform_name: 24, platform_name_size: 32,
});
layout!(TopologyPlatformVersionArgs = 40, struct_size 40 {
    topology: 16, platform_version: 24, platform_version_size: 32,
});
layout!(TopologyGetDeviceDescriptionsArgs = 40, struct_size 40 {
    topology: 16, descriptions: 24, num_descriptions: 32,
});
layout!(CompileArgs = 64, struct_size 64 {
    topology: 16, program: 24, compile_options: 32, compile_options_size: 40, client: 48,
    executable: 56,
});
layout!(NamedValue = 56, struct_size 56 {
    struct_size: 0, extension_start: 8, name: 16, name_size: 24, value_type: 32, value: 40,
    value_size: 48,
});
layout!(ApiVersion = 24 {
    struct_size: 0, extension_start: 8, major_version: 16, minor_version: 20,
});
layout!(Api = _ {
    struct_size: 0, extension_start: 8, pjrt_api_version: 16, PJRT_Error_Destroy: 40,
    PJRT_Error_Message: 48, PJRT_Error_GetCode: 56, PJRT_Plugin_Initialize: 64,
    PJRT_Plugin_Attributes: 72, PJRT_Event_Destroy: 80, PJRT_Event_IsReady: 88,
    PJRT_Event_Error: 96, PJRT_Event_Await: 104, PJRT_Event_OnReady: 112, PJRT_Client_Create: 120,
    PJRT_Client_Destroy: 128, PJRT_Client_PlatformName: 136, PJRT_Client_ProcessIndex: 144,
    PJRT_Client_PlatformVersion: 152, PJRT_Client_Devices: 160, PJRT_Client_AddressableDevices: 168,
    PJRT_Client_LookupDevice: 176, PJRT_Client_LookupAddressableDevice: 184,
    PJRT_Client_AddressableMemories: 192, PJRT_Client_Compile: 200,
    PJRT_Client_DefaultDeviceAssignment: 208, PJRT_Client_BufferFromHostBuffer: 216,
    PJRT_DeviceDescription_Id: 224, PJRT_DeviceDescription_ProcessIndex: 232,
    PJRT_DeviceDescription_Attributes: 240, PJRT_DeviceDescription_Kind: 248,
    PJRT_DeviceDescription_DebugString: 256, PJRT_DeviceDescription_ToString: 264,
    PJRT_Device_GetDescription: 272, PJRT_Device_IsAddressable: 280,
    PJRT_Device_LocalHardwareId: 288, PJRT_Device_AddressableMemories: 296,
    PJRT_Device_DefaultMemory: 304, PJRT_Device_MemoryStats: 312, PJRT_Memory_Id: 320,
    PJRT_Memory_Kind: 328, PJRT_Memory_DebugString: 336, PJRT_Memory_ToString: 344,
    PJRT_Memory_AddressableByDevices: 352, PJRT_Executable_Destroy: 360, PJRT_Executable_Name: 368,
    PJRT_Executable_NumReplicas: 376, PJRT_Executable_NumPartitions: 384,
    PJRT_Executable_NumOutputs: 392, PJRT_Executable_SizeOfGeneratedCodeInBytes: 400,
    PJRT_Executable_GetCostAnalysis: 408, PJRT_Executable_OutputMemoryKinds: 416,
    PJRT_Executable_OptimizedProgram: 424, PJRT_Executable_Serialize: 432,
    PJRT_LoadedExecutable_Destroy: 440, PJRT_LoadedExecutable_GetExecutable: 448,
    PJRT_LoadedExecutable_AddressableDevices: 456, PJRT_LoadedExecutable_Delete: 464,
    PJRT_LoadedExecutable_IsDeleted: 472, PJRT_LoadedExecutable_Execute: 480,
    PJRT_Executable_DeserializeAndLoad: 488, PJRT_LoadedExecutable_Fingerprint: 496,
    PJRT_Buffer_Destroy: 504, PJRT_Buffer_ElementType: 512, PJRT_Buffer_Dimensions: 520,
    PJRT_Buffer_UnpaddedDimensions: 528, PJRT_Buffer_DynamicDimensionIndices: 536,
    PJRT_Buffer_GetMemoryLayout: 544, PJRT_Buffer_OnDeviceSizeInBytes: 552, PJRT_Buffer_Device: 560,
    PJRT_Buffer_Memory: 568, PJRT_Buffer_Delete: 576, PJRT_Buffer_IsDeleted: 584,
    PJRT_Buffer_CopyToDevice: 592, PJRT_Buffer_ToHostBuffer: 600, PJRT_Buffer_IsOnCpu: 608,
    PJRT_Buffer_ReadyEvent: 616, PJRT_Buffer_UnsafePointer: 624,
    PJRT_Buffer_IncreaseExternalReferenceCount: 632,
    PJRT_Buffer_DecreaseExternalReferenceCount: 640, PJRT_Buffer_OpaqueDeviceMemoryDataPointer: 648,
    PJRT_CopyToDeviceStream_Destroy: 656, PJRT_CopyToDeviceStream_AddChunk: 664,
    PJRT_CopyToDeviceStream_TotalBytes: 672, PJRT_CopyToDeviceStream_GranuleSize: 680,
    PJRT_CopyToDeviceStream_CurrentBytes: 688, PJRT_TopologyDescription_Create: 696,
    PJRT_TopologyDescription_Destroy: 704, PJRT_TopologyDescription_PlatformName: 712,
    PJRT_TopologyDescription_PlatformVersion: 720,
    PJRT_TopologyDescription_GetDeviceDescriptions: 728, PJRT_TopologyDescription_Serialize: 736,
    PJRT_TopologyDescription_Attributes: 744, PJRT_Compile: 752,
    PJRT_Executable_OutputElementTypes: 760, PJRT_Executable_OutputDimensions: 768,
    PJRT_Buffer_CopyToMemory: 776, PJRT_Client_CreateViewOfDeviceBuffer: 784,
    PJRT_Executable_Fingerprint: 792, PJRT_Client_TopologyDescription: 800,
    PJRT_Executable_GetCompiledMemoryStats: 808,
});
