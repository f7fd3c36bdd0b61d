//! PJRT's cross-host transfers extension (`PJRT_Extension_Type_CrossHostTransfers`, type 12, in
//! openxla/xla `xla/pjrt/extensions/cross_host_transfers/pjrt_c_api_cross_host_transfers_extension.h`):
//! a device buffer sent to a device of another process of a multi-process client. In the CUDA
//! plugins `CrossHostSendBuffers` / `CrossHostReceiveBuffers` are an NCCL send/recv between the
//! two GPUs on the plugin's device-to-device streams, with the clique's NCCL id through the
//! client's key-value callbacks; sends and receives match by their order on the pair's
//! communicator (one per ordered device pair), not by key, so both sides must issue a pair's
//! transfers in one order (`train::pipeline::schedule::Schedule::transfers`).
//!
//! The extension has no version field and its argument structs changed between versions. The
//! layouts here are the ones the pinned plugins' own code reads (disassembled:
//! docs/design/cross-host-pipeline.md §1.3): jax-cuda12/13-pjrt 0.11.2 and 0.12.0.1 (PJRT C API
//! 0.115-0.116) and libtpu 0.0.52 (0.117); a plugin of another API version is not bound. Send
//! args end at `send_events` (struct_size 64), receive args at `buffers` (96), as callers older
//! than version 8's task lists, which every version since accepts. The CPU plugin has no such
//! extension.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use super::buffer::{to_raw, Buffer, Event};
use super::client::{Client, ClientInner, Device};
use super::error::{Error, Result};
use super::ffi;
use super::plugin::Plugin;
use crate::host::DType;

/// `PJRT_Extension_Type_CrossHostTransfers` in `pjrt_c_api.h`.
const CROSS_HOST_TRANSFERS: c_int = 12;

/// The PJRT C API minor versions of the plugins whose layouts were checked.
const CHECKED_MINOR_VERSIONS: std::ops::RangeInclusive<i32> = 115..=117;

type SendFn = unsafe extern "C" fn(args: *mut SendArgs) -> *mut ffi::Error;
type ReceiveFn = unsafe extern "C" fn(args: *mut ReceiveArgs) -> *mut ffi::Error;

#[repr(C)]
struct CrossHostExtension {
    header: super::plugin::ExtensionHeader,
    make_cross_host_receive_buffers: *const c_void,
    buffer_copy_to_remote_device: *const c_void,
    cross_host_receive_buffers: Option<ReceiveFn>,
    cross_host_send_buffers: Option<SendFn>,
}

/// `PJRT_Transfers_PJRT_Client_CrossHostSendBuffers_Args` up to `send_events`.
#[repr(C)]
struct SendArgs {
    struct_size: usize,
    extension_start: *mut ffi::ExtensionBase,
    client: *mut ffi::Client,
    num_buffers: usize,
    buffers: *mut *mut ffi::Buffer,
    dst_global_device_ids: *const i32,
    transfer_keys: *const i64,
    send_events: *mut *mut ffi::Event,
}

/// `PJRT_Transfers_PJRT_Client_CrossHostReceiveBuffers_Args` up to `buffers`.
#[repr(C)]
struct ReceiveArgs {
    struct_size: usize,
    extension_start: *mut ffi::ExtensionBase,
    client: *mut ffi::Client,
    num_shapes: usize,
    shape_num_dims: *mut usize,
    num_dims: *mut *const i64,
    element_types: *mut ffi::BufferType,
    layouts: *mut *mut c_void,
    device: *mut ffi::Device,
    src_global_device_ids: *const i32,
    transfer_keys: *const i64,
    buffers: *mut *mut ffi::Buffer,
}

// The offsets the pinned plugins read (docs/design/cross-host-pipeline.md §1.3).
const _: () = {
    assert!(std::mem::offset_of!(CrossHostExtension, cross_host_receive_buffers) == 40);
    assert!(std::mem::offset_of!(CrossHostExtension, cross_host_send_buffers) == 48);
    assert!(std::mem::offset_of!(SendArgs, client) == 0x10);
    assert!(std::mem::offset_of!(SendArgs, dst_global_device_ids) == 0x28);
    assert!(std::mem::offset_of!(SendArgs, transfer_keys) == 0x30);
    assert!(std::mem::offset_of!(SendArgs, send_events) == 0x38);
    assert!(std::mem::size_of::<SendArgs>() == 64);
    assert!(std::mem::offset_of!(ReceiveArgs, device) == 0x40);
    assert!(std::mem::offset_of!(ReceiveArgs, src_global_device_ids) == 0x48);
    assert!(std::mem::offset_of!(ReceiveArgs, transfer_keys) == 0x50);
    assert!(std::mem::offset_of!(ReceiveArgs, buffers) == 0x58);
    assert!(std::mem::size_of::<ReceiveArgs>() == 96);
};

/// The extension of one client's plugin.
#[derive(Clone)]
pub struct CrossHost {
    client: Arc<ClientInner>,
    send: SendFn,
    receive: ReceiveFn,
}

// SAFETY: the PJRT C API may be called from any thread; the function pointers belong to the
// plugin, which is never unloaded.
unsafe impl Send for CrossHost {}
// SAFETY: as above; the plugin synchronizes concurrent calls itself.
unsafe impl Sync for CrossHost {}

/// Whether `plugin` has the extension with the layouts checked here (see the module docs).
pub fn describe(plugin: &Plugin) -> std::result::Result<(), String> {
    find(plugin).map(|_| ())
}

fn find(plugin: &Plugin) -> std::result::Result<(SendFn, ReceiveFn), String> {
    let (major, minor) = plugin.api_version();
    let Some(header) = plugin.find_extension(CROSS_HOST_TRANSFERS) else {
        return Err(format!("the plugin (PJRT C API {major}.{minor}) has no cross-host transfers extension"));
    };
    if !CHECKED_MINOR_VERSIONS.contains(&minor) || major != 0 {
        return Err(format!(
            "the plugin's cross-host transfers extension (PJRT C API {major}.{minor}) has argument layouts maxrs has \
             not checked (checked: 0.{}-0.{})",
            CHECKED_MINOR_VERSIONS.start(),
            CHECKED_MINOR_VERSIONS.end()
        ));
    }
    // SAFETY: the header is the first field of the extension the plugin registered as this type;
    // its `struct_size` says how much of the struct the plugin fills, checked before reading.
    let extension = unsafe {
        if (*header).struct_size < std::mem::size_of::<CrossHostExtension>() {
            return Err("the plugin's cross-host transfers extension is shorter than its version 2".into());
        }
        &*header.cast::<CrossHostExtension>()
    };
    match (extension.cross_host_send_buffers, extension.cross_host_receive_buffers) {
        (Some(send), Some(receive)) => Ok((send, receive)),
        _ => Err("the plugin's cross-host transfers extension lacks CrossHostSendBuffers/ReceiveBuffers".into()),
    }
}

impl CrossHost {
    /// The extension of `client`'s plugin, or why it cannot be used.
    pub fn of(client: &Client) -> std::result::Result<CrossHost, String> {
        let (send, receive) = find(client.plugin())?;
        Ok(CrossHost { client: client.inner.clone(), send, receive })
    }

    /// Sends `buffers` (on this process's devices) to the devices `dst` (global ids, another
    /// process's), `keys` naming each transfer, and waits until every send is done.
    pub fn send(&self, buffers: &[&Buffer], dst: &[i32], keys: &[i64]) -> Result<()> {
        if buffers.len() != dst.len() || buffers.len() != keys.len() {
            return Err(Error::invalid("cross-host send: as many destinations and keys as buffers".to_string()));
        }
        let mut raw: Vec<*mut ffi::Buffer> = buffers.iter().map(|b| b.raw).collect();
        let mut events: Vec<*mut ffi::Event> = vec![std::ptr::null_mut(); buffers.len()];
        // SAFETY: zero bytes are valid for every field (pointers, integers).
        let mut args: SendArgs = unsafe { std::mem::zeroed() };
        args.struct_size = std::mem::size_of::<SendArgs>();
        args.client = self.client.raw;
        args.num_buffers = raw.len();
        args.buffers = raw.as_mut_ptr();
        args.dst_global_device_ids = dst.as_ptr();
        args.transfer_keys = keys.as_ptr();
        args.send_events = events.as_mut_ptr();
        // SAFETY: the function is the plugin's, its args a live struct of the checked layout whose
        // arrays all have `num_buffers` entries and outlive the call.
        let error = unsafe { (self.send)(&mut args) };
        // SAFETY: what the plugin just returned: null or a live error.
        unsafe { self.client.plugin.check("PJRT_Transfers_PJRT_Client_CrossHostSendBuffers", error) }?;
        // Each event is ours to destroy ([`Event`] does); waiting keeps the buffers alive until then.
        let events: Vec<Event> = events.into_iter().map(|e| Event::new(self.client.plugin.clone(), e)).collect();
        events.into_iter().try_for_each(Event::wait)
    }

    /// Receives one buffer per `(type, dims)` of `shapes` onto `device` (this process's) from the
    /// devices `src` (global ids, another process's), `keys` naming each transfer. Returns at
    /// once: a program that reads a buffer waits for its transfer.
    pub fn receive(
        &self,
        device: &Device,
        shapes: &[(DType, Vec<i64>)],
        src: &[i32],
        keys: &[i64],
    ) -> Result<Vec<Buffer>> {
        if shapes.len() != src.len() || shapes.len() != keys.len() {
            return Err(Error::invalid("cross-host receive: as many sources and keys as shapes".to_string()));
        }
        let mut ranks: Vec<usize> = shapes.iter().map(|(_, d)| d.len()).collect();
        let mut dims: Vec<*const i64> = shapes.iter().map(|(_, d)| d.as_ptr()).collect();
        let mut types: Vec<ffi::BufferType> = shapes.iter().map(|(t, _)| to_raw(*t)).collect();
        // Null is the default layout; the plugin reads one entry per shape.
        let mut layouts: Vec<*mut c_void> = vec![std::ptr::null_mut(); shapes.len()];
        let mut buffers: Vec<*mut ffi::Buffer> = vec![std::ptr::null_mut(); shapes.len()];
        // SAFETY: zero bytes are valid for every field (pointers, integers).
        let mut args: ReceiveArgs = unsafe { std::mem::zeroed() };
        args.struct_size = std::mem::size_of::<ReceiveArgs>();
        args.client = self.client.raw;
        args.num_shapes = shapes.len();
        args.shape_num_dims = ranks.as_mut_ptr();
        args.num_dims = dims.as_mut_ptr();
        args.element_types = types.as_mut_ptr();
        args.layouts = layouts.as_mut_ptr();
        args.device = device.raw;
        args.src_global_device_ids = src.as_ptr();
        args.transfer_keys = keys.as_ptr();
        args.buffers = buffers.as_mut_ptr();
        // SAFETY: the function is the plugin's, its args a live struct of the checked layout whose
        // arrays all have `num_shapes` entries and outlive the call.
        let error = unsafe { (self.receive)(&mut args) };
        // SAFETY: what the plugin just returned: null or a live error.
        unsafe { self.client.plugin.check("PJRT_Transfers_PJRT_Client_CrossHostReceiveBuffers", error) }?;
        Ok(buffers.into_iter().map(|raw| Buffer { client: self.client.clone(), raw }).collect())
    }
}
