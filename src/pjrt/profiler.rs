//! The plugin's profiler (PJRT's profiler extension, `pjrt_c_api_profiler_extension.h`, and the
//! `PLUGIN_Profiler_Api` of `xla/backends/profiler/plugin/profiler_c_api.h`): what
//! `jax.profiler.start_trace` drives inside a JAX process. A session is created with serialized
//! `tensorflow.ProfileOptions`, started, stopped, and its trace collected as a serialized
//! `tensorflow.profiler.XSpace` (an `.xplane.pb` file, TensorBoard's profile format).

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use prost::Message;

use super::error::{Error, ErrorCode, Result};
use super::plugin::Plugin;

/// `PJRT_Extension_Type_Profiler` in `pjrt_c_api.h`'s `PJRT_Extension_Type`.
const PROFILER_EXTENSION_TYPE: c_int = 1;

#[repr(C)]
struct ProfilerExtension {
    header: super::plugin::ExtensionHeader,
    profiler_api: *const ProfilerApi,
    traceme_context_id: i64,
}

#[repr(C)]
struct ProfilerError {
    _private: [u8; 0],
}

#[repr(C)]
struct RawProfiler {
    _private: [u8; 0],
}

#[repr(C)]
struct ErrorDestroyArgs {
    struct_size: usize,
    private: *mut c_void,
    error: *mut ProfilerError,
}

#[repr(C)]
struct ErrorMessageArgs {
    struct_size: usize,
    private: *mut c_void,
    error: *const ProfilerError,
    message: *const c_char,
    message_size: usize,
}

#[repr(C)]
struct CreateArgs {
    struct_size: usize,
    options: *const c_char,
    options_size: usize,
    profiler: *mut RawProfiler,
}

/// The args of destroy, start and stop.
#[repr(C)]
struct ProfilerArgs {
    struct_size: usize,
    profiler: *mut RawProfiler,
}

#[repr(C)]
struct CollectDataArgs {
    struct_size: usize,
    profiler: *mut RawProfiler,
    buffer: *mut u8,
    buffer_size_in_bytes: usize,
}

type Call<A> = Option<unsafe extern "C" fn(args: *mut A) -> *mut ProfilerError>;

#[repr(C)]
struct ProfilerApi {
    struct_size: usize,
    private: *mut c_void,
    error_destroy: Option<unsafe extern "C" fn(args: *mut ErrorDestroyArgs)>,
    error_message: Option<unsafe extern "C" fn(args: *mut ErrorMessageArgs)>,
    error_get_code: Option<unsafe extern "C" fn(args: *mut c_void) -> *mut ProfilerError>,
    create: Call<CreateArgs>,
    destroy: Call<ProfilerArgs>,
    start: Call<ProfilerArgs>,
    stop: Call<ProfilerArgs>,
    collect_data: Call<CollectDataArgs>,
}

/// `tensorflow.ProfileOptions` (`tsl/profiler/protobuf/profiler_options.proto`): the fields a
/// trace of host and device activity needs.
#[derive(Clone, PartialEq, Message)]
struct ProfileOptions {
    #[prost(uint32, tag = "5")]
    version: u32,
    #[prost(uint32, tag = "2")]
    host_tracer_level: u32,
    #[prost(uint32, tag = "3")]
    device_tracer_level: u32,
    #[prost(uint32, tag = "4")]
    python_tracer_level: u32,
    #[prost(bool, tag = "7")]
    enable_hlo_proto: bool,
}

/// `tensorflow.profiler.XSpace` (`tsl/profiler/protobuf/xplane.proto`), as far as maxrs reads it:
/// the planes' ids and names (a device or the host each) and the hosts.
#[derive(Clone, PartialEq, Message)]
pub struct XSpace {
    #[prost(message, repeated, tag = "1")]
    pub planes: Vec<XPlane>,
    #[prost(string, repeated, tag = "4")]
    pub hostnames: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct XPlane {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(string, tag = "2")]
    pub name: String,
}

/// A running profiling session of one plugin.
pub struct Profiler {
    plugin: Arc<Plugin>,
    api: *const ProfilerApi,
    raw: *mut RawProfiler,
}

// SAFETY: the session is only driven through `&mut self` (one thread at a time), and the plugin
// profiler is not tied to the thread that created it.
unsafe impl Send for Profiler {}

impl Profiler {
    /// Whether `plugin` has a profiler.
    pub fn available(plugin: &Plugin) -> bool {
        find_profiler_api(plugin).is_some()
    }

    /// Creates a session of `plugin`'s profiler and starts tracing: host activity at level 2 and
    /// device activity at level 1, with HLO protos (the options `jax.profiler.start_trace` uses).
    pub fn start(plugin: &Arc<Plugin>) -> Result<Profiler> {
        let api = find_profiler_api(plugin).ok_or_else(|| Error::Unsupported {
            function: "the profiler extension",
            major: plugin.api_version().0,
            minor: plugin.api_version().1,
        })?;
        let options = ProfileOptions {
            version: 1,
            host_tracer_level: 2,
            device_tracer_level: 1,
            python_tracer_level: 0,
            enable_hlo_proto: true,
        }
        .encode_to_vec();
        let mut args = CreateArgs {
            struct_size: size_of::<CreateArgs>(),
            options: options.as_ptr().cast(),
            options_size: options.len(),
            profiler: std::ptr::null_mut(),
        };
        let mut profiler = Profiler { plugin: plugin.clone(), api, raw: std::ptr::null_mut() };
        // SAFETY: `api` is the plugin's profiler table, valid for the process; `args` is a
        // fully initialized struct of the header's layout that outlives the call.
        profiler.check("PLUGIN_Profiler_Create", unsafe { profiler.table().create.map(|f| f(&mut args)) })?;
        profiler.raw = args.profiler;
        profiler.call("PLUGIN_Profiler_Start", |t| t.start)?;
        Ok(profiler)
    }

    /// Stops tracing and returns the trace: a serialized `tensorflow.profiler.XSpace`.
    pub fn stop(mut self) -> Result<Vec<u8>> {
        self.call("PLUGIN_Profiler_Stop", |t| t.stop)?;
        let mut args = CollectDataArgs {
            struct_size: size_of::<CollectDataArgs>(),
            profiler: self.raw,
            buffer: std::ptr::null_mut(),
            buffer_size_in_bytes: 0,
        };
        // SAFETY: as in `start`. Called with a null buffer, the plugin serializes the trace into
        // memory of its own session and points `buffer` at it (XLA's `PluginTracer::CollectData`
        // reads it the same way); it stays valid until the session is destroyed.
        self.check("PLUGIN_Profiler_CollectData", unsafe { self.table().collect_data.map(|f| f(&mut args)) })?;
        let mut data = match (args.buffer.is_null(), args.buffer_size_in_bytes) {
            (_, 0) | (true, _) => Vec::new(),
            // SAFETY: see above; the bytes are copied before `self` (the session) is dropped.
            (false, n) => unsafe { std::slice::from_raw_parts(args.buffer, n) }.to_vec(),
        };
        // XLA's plugin profiler allocates one byte more than the XSpace and reports it (a zero,
        // which no protobuf parser accepts as a tag): keep only what parses.
        if XSpace::decode(data.as_slice()).is_err() && data.last() == Some(&0) {
            data.pop();
        }
        XSpace::decode(data.as_slice()).map_err(|e| Error::Plugin {
            function: "PLUGIN_Profiler_CollectData",
            code: ErrorCode::DataLoss,
            message: format!("the trace is not a serialized XSpace: {e}"),
        })?;
        Ok(data)
    }

    fn table(&self) -> &ProfilerApi {
        // SAFETY: found in the plugin's extension chain; plugins are never unloaded.
        unsafe { &*self.api }
    }

    fn call(&mut self, function: &'static str, slot: impl FnOnce(&ProfilerApi) -> Call<ProfilerArgs>) -> Result<()> {
        let mut args = ProfilerArgs { struct_size: size_of::<ProfilerArgs>(), profiler: self.raw };
        // SAFETY: a session created by this table, and args of the header's layout.
        let error = unsafe { slot(self.table()).map(|f| f(&mut args)) };
        self.check(function, error)
    }

    /// `Ok` for a null error; otherwise the error's message (the error is destroyed).
    fn check(&self, function: &'static str, error: Option<*mut ProfilerError>) -> Result<()> {
        let (major, minor) = self.plugin.api_version();
        let error = error.ok_or(Error::Unsupported { function, major, minor })?;
        if error.is_null() {
            return Ok(());
        }
        let table = self.table();
        let mut message = ErrorMessageArgs {
            struct_size: size_of::<ErrorMessageArgs>(),
            private: std::ptr::null_mut(),
            error,
            message: std::ptr::null(),
            message_size: 0,
        };
        let text = match table.error_message {
            // SAFETY: `error` came from this table; the message lives as long as the error.
            Some(f) => unsafe {
                f(&mut message);
                String::from_utf8_lossy(std::slice::from_raw_parts(message.message.cast::<u8>(), message.message_size))
                    .into_owned()
            },
            None => "(no message)".to_string(),
        };
        if let Some(destroy) = table.error_destroy {
            let mut args =
                ErrorDestroyArgs { struct_size: size_of::<ErrorDestroyArgs>(), private: std::ptr::null_mut(), error };
            // SAFETY: destroys the error returned to us, once.
            unsafe { destroy(&mut args) };
        }
        Err(Error::Plugin { function, code: ErrorCode::Unknown, message: text })
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        if let Err(e) = self.call("PLUGIN_Profiler_Destroy", |t| t.destroy) {
            tracing::warn!("destroying the profiler session: {e}");
        }
    }
}

/// The profiler table in `plugin`'s extension chain, if it has one.
fn find_profiler_api(plugin: &Plugin) -> Option<*const ProfilerApi> {
    let extension = plugin.find_extension(PROFILER_EXTENSION_TYPE)?;
    // SAFETY: an extension of the profiler type has the profiler extension's layout, and the
    // plugin that holds it is never unloaded.
    let api = unsafe { (*extension.cast::<ProfilerExtension>()).profiler_api };
    (!api.is_null()).then_some(api)
}
