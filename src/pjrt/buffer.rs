//! Device buffers and PJRT's numbering of element types.
//!
//! [`Buffer`] is an array on a device, released with `PJRT_Buffer_Destroy` when dropped; its
//! host side is `crate::host::HostTensor`. Transfers copy exactly once: host -> device borrows
//! the host bytes until the plugin says it is done with them, device -> host writes straight into
//! the new tensor's storage.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::client::ClientInner;
use super::error::{Error, Result};
use super::ffi;
use super::plugin::Plugin;
use crate::host::{DType, HostTensor};

/// Each element type with its `PJRT_Buffer_Type` number (pjrt_c_api.h) and its
/// `xla.PrimitiveType` number (xla_data.proto): the two numberings differ.
const NUMBERING: [(DType, ffi::BufferType, i32); 12] = [
    (DType::Pred, 1, 1),
    (DType::S8, 2, 2),
    (DType::S32, 4, 4),
    (DType::S64, 5, 5),
    (DType::U8, 6, 6),
    (DType::U32, 8, 8),
    (DType::F16, 10, 10),
    (DType::F32, 11, 11),
    (DType::F64, 12, 12),
    (DType::BF16, 13, 16),
    (DType::F8E5M2, 16, 19),
    (DType::F8E4M3FN, 17, 20),
];

/// The `PJRT_Buffer_Type` number of `ty`.
pub(crate) fn to_raw(ty: DType) -> ffi::BufferType {
    NUMBERING.iter().find(|(t, _, _)| *t == ty).map(|(_, raw, _)| *raw).expect("every type is numbered")
}

/// The element type of a `PJRT_Buffer_Type` number.
pub(crate) fn from_raw(raw: ffi::BufferType) -> Result<DType> {
    NUMBERING
        .iter()
        .find(|(_, r, _)| *r == raw)
        .map(|(ty, _, _)| *ty)
        .ok_or_else(|| Error::invalid(format!("unsupported PJRT buffer type {raw}")))
}

/// The element type of an `xla.PrimitiveType` number (as in HLO protos).
pub(crate) fn from_xla_primitive(primitive: i32) -> Result<DType> {
    NUMBERING
        .iter()
        .find(|(_, _, p)| *p == primitive)
        .map(|(ty, _, _)| *ty)
        .ok_or_else(|| Error::invalid(format!("unsupported XLA element type {primitive}")))
}

/// A completion event; [`Event::wait`] blocks until the plugin signals it.
pub(crate) struct Event {
    plugin: Arc<Plugin>,
    raw: *mut ffi::Event,
}

impl Event {
    /// Takes ownership of `raw` (null means "already complete").
    pub(crate) fn new(plugin: Arc<Plugin>, raw: *mut ffi::Event) -> Event {
        Event { plugin, raw }
    }

    pub(crate) fn wait(self) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let mut args: ffi::EventAwaitArgs = ffi::args();
        args.event = self.raw;
        crate::pjrt_call!(self.plugin, PJRT_Event_Await, args)
        // Dropping `self` destroys the event.
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let mut args: ffi::EventDestroyArgs = ffi::args();
        args.event = self.raw;
        if let Err(e) = crate::pjrt_call!(self.plugin, PJRT_Event_Destroy, args) {
            tracing::warn!("destroying a PJRT event: {e}");
        }
    }
}

/// An array on one device.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::Buffer,
}

// PJRT buffers may be used from any thread.
// SAFETY: the PJRT C API may be called from any thread; the handle is not tied to the thread that made it.
unsafe impl Send for Buffer {}
// SAFETY: the plugin synchronizes concurrent calls on one handle itself (the PJRT C API is thread-safe); maxrs holds no
// unsynchronized state beside it.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn element_type(&self) -> Result<DType> {
        let mut args: ffi::BufferElementTypeArgs = ffi::args();
        args.buffer = self.raw;
        crate::pjrt_call!(self.client.plugin, PJRT_Buffer_ElementType, args)?;
        from_raw(args.buffer_type)
    }

    pub fn dims(&self) -> Result<Vec<i64>> {
        let mut args: ffi::BufferDimensionsArgs = ffi::args();
        args.buffer = self.raw;
        crate::pjrt_call!(self.client.plugin, PJRT_Buffer_Dimensions, args)?;
        Ok(if args.num_dims == 0 {
            Vec::new()
        } else {
            // SAFETY: the plugin returned this array with this many entries in the successful call above, owned by the
            // object, which is alive here.
            unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) }.to_vec()
        })
    }

    /// The id of the device holding the buffer.
    pub fn device_id(&self) -> Result<i32> {
        let mut args: ffi::BufferDeviceArgs = ffi::args();
        args.buffer = self.raw;
        crate::pjrt_call!(self.client.plugin, PJRT_Buffer_Device, args)?;
        super::client::device_id(&self.client.plugin, args.device)
    }

    /// True once the buffer was donated to an execution (its memory now belongs to an output).
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args: ffi::BufferIsDeletedArgs = ffi::args();
        args.buffer = self.raw;
        crate::pjrt_call!(self.client.plugin, PJRT_Buffer_IsDeleted, args)?;
        Ok(args.is_deleted)
    }

    /// Copies the buffer to `device` of the same client (`PJRT_Buffer_CopyToDevice`). Returns at
    /// once: the copy runs in the background, and a program that reads the new buffer waits for
    /// it. Dropping `self` meanwhile is safe: the plugin keeps the source memory until the copy
    /// is done.
    pub fn copy_to_device(&self, device: &super::Device) -> Result<Buffer> {
        let mut args: ffi::BufferCopyToDeviceArgs = ffi::args();
        args.buffer = self.raw;
        args.dst_device = device.raw;
        crate::pjrt_call!(self.client.plugin, PJRT_Buffer_CopyToDevice, args)?;
        Ok(Buffer { client: self.client.clone(), raw: args.dst_buffer })
    }

    /// Copies the buffer to host memory (waits for the copy to finish).
    pub fn to_host(&self) -> Result<HostTensor> {
        let ty = self.element_type()?;
        let dims = self.dims()?;
        let count: i64 = dims.iter().product();
        let mut data = vec![0u8; count as usize * ty.byte_size()];
        let mut args: ffi::BufferToHostBufferArgs = ffi::args();
        args.src = self.raw;
        args.dst = data.as_mut_ptr().cast();
        args.dst_size = data.len();
        crate::pjrt_call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, args)?;
        Event::new(self.client.plugin.clone(), args.event).wait()?;
        Ok(HostTensor { ty, dims, data })
    }
}

/// When a buffer's data became ready, recorded by the plugin's completion callback on whatever
/// thread the plugin signals from, so that the host can tell afterwards whether the device
/// waited for it.
pub struct ReadyTime {
    slot: Arc<Mutex<Option<Instant>>>,
    /// Kept until the time is read: the callback was registered on it.
    _event: Event,
}

impl ReadyTime {
    /// The instant the buffer became ready, once it has.
    pub fn get(&self) -> Option<Instant> {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the completion callback receives: where to write, and the plugin to destroy the error.
struct ReadyCallbackState {
    slot: Arc<Mutex<Option<Instant>>>,
    plugin: Arc<Plugin>,
}

/// Records the ready instant and frees the callback's state and error.
///
/// # Safety
/// `user_arg` is the `Box<ReadyCallbackState>` leaked by `Buffer::ready_time`, passed exactly
/// once; `error` is null or an error the plugin hands over.
unsafe extern "C" fn record_ready(error: *mut ffi::Error, user_arg: *mut c_void) {
    let now = Instant::now();
    // SAFETY: see the function's contract: the box is ours again, once.
    let state = unsafe { Box::from_raw(user_arg.cast::<ReadyCallbackState>()) };
    *state.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
    // SAFETY: the callback owns `error` (pjrt_c_api.h, PJRT_Event_OnReadyCallback).
    if let Err(e) = unsafe { state.plugin.check("PJRT_Event_OnReady callback", error) } {
        tracing::warn!("a step's output failed: {e}");
    }
}

impl Buffer {
    /// Starts recording when this buffer's data becomes ready (see [`ReadyTime`]).
    pub fn ready_time(&self) -> Result<ReadyTime> {
        let plugin = self.client.plugin.clone();
        let mut args: ffi::BufferReadyEventArgs = ffi::args();
        args.buffer = self.raw;
        crate::pjrt_call!(plugin, PJRT_Buffer_ReadyEvent, args)?;
        let event = Event::new(plugin.clone(), args.event);
        let slot = Arc::new(Mutex::new(None));
        let state = Box::new(ReadyCallbackState { slot: slot.clone(), plugin: plugin.clone() });
        let mut on_ready: ffi::EventOnReadyArgs = ffi::args();
        on_ready.event = event.raw;
        on_ready.callback = Some(record_ready);
        on_ready.user_arg = Box::into_raw(state).cast();
        if let Err(e) = crate::pjrt_call!(plugin, PJRT_Event_OnReady, on_ready) {
            // SAFETY: the plugin refused the callback, so the state is still ours alone.
            drop(unsafe { Box::from_raw(on_ready.user_arg.cast::<ReadyCallbackState>()) });
            return Err(e);
        }
        Ok(ReadyTime { slot, _event: event })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args: ffi::BufferDestroyArgs = ffi::args();
        args.buffer = self.raw;
        if let Err(e) = crate::pjrt_call!(self.client.plugin, PJRT_Buffer_Destroy, args) {
            tracing::warn!("destroying a PJRT buffer: {e}");
        }
    }
}
