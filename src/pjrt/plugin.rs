//! A loaded PJRT plugin: the shared library, its function table, and the one place where maxrs
//! calls into it ([`Plugin::call`]), which checks that the table has the function, runs it and
//! turns a returned `PJRT_Error` into [`Error`] (destroying the plugin's error object).
//!
//! A plugin is loaded and initialised once per process and never unloaded: XLA keeps global
//! state (flags, thread pools) that does not survive `dlclose`, and `PJRT_Plugin_Initialize`
//! must run once.

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::error::{Error, ErrorCode, Result};
use super::ffi;

/// A typed value in a PJRT named-value list (client-create options, attributes, topology options).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    I64(i64),
    I64List(Vec<i64>),
    F32(f32),
    Bool(bool),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::I64List(v) => write!(f, "{v:?}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// Named values laid out for the C API; owns every string and array the raw entries point to.
pub(crate) struct NamedValues {
    raw: Vec<ffi::NamedValue>,
    _names: Vec<CString>,
    _strings: Vec<CString>,
    _lists: Vec<Vec<i64>>,
}

impl NamedValues {
    pub(crate) fn new(values: &[(String, Value)]) -> Result<NamedValues> {
        let mut names = Vec::new();
        let mut strings = Vec::new();
        let mut lists = Vec::new();
        let mut raw = Vec::new();
        for (name, value) in values {
            let cname = CString::new(name.as_str())
                .map_err(|_| Error::invalid(format!("option name {name:?} contains a NUL byte")))?;
            let mut entry: ffi::NamedValue = ffi::args();
            entry.name = cname.as_ptr();
            entry.name_size = name.len();
            match value {
                Value::Str(s) => {
                    let c = CString::new(s.as_str())
                        .map_err(|_| Error::invalid(format!("option {name}: value contains a NUL byte")))?;
                    entry.value_type = ffi::NAMED_STRING;
                    entry.value.string_value = c.as_ptr();
                    entry.value_size = s.len();
                    strings.push(c);
                }
                Value::I64(v) => {
                    entry.value_type = ffi::NAMED_INT64;
                    entry.value.int64_value = *v;
                    entry.value_size = 1;
                }
                Value::I64List(v) => {
                    // The clone's heap block is what the entry points at; it moves with
                    // `lists` only as a Vec header, so the pointer stays valid.
                    lists.push(v.clone());
                    entry.value_type = ffi::NAMED_INT64_LIST;
                    entry.value.int64_array_value = lists.last().unwrap().as_ptr();
                    entry.value_size = v.len();
                }
                Value::F32(v) => {
                    entry.value_type = ffi::NAMED_FLOAT;
                    entry.value.float_value = *v;
                    entry.value_size = 1;
                }
                Value::Bool(v) => {
                    entry.value_type = ffi::NAMED_BOOL;
                    entry.value.bool_value = *v;
                    entry.value_size = 1;
                }
            }
            names.push(cname);
            raw.push(entry);
        }
        Ok(NamedValues { raw, _names: names, _strings: strings, _lists: lists })
    }

    pub(crate) fn as_ptr(&self) -> *const ffi::NamedValue {
        if self.raw.is_empty() {
            std::ptr::null()
        } else {
            self.raw.as_ptr()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }
}

/// Reads a plugin-owned named-value array into owned Rust values.
///
/// # Safety
/// `ptr` must point to `len` valid entries (or be null with `len == 0`).
pub(crate) unsafe fn read_named_values(ptr: *const ffi::NamedValue, len: usize) -> Vec<(String, Value)> {
    if ptr.is_null() {
        return Vec::new();
    }
    std::slice::from_raw_parts(ptr, len)
        .iter()
        .map(|nv| {
            let name = string_from(nv.name, nv.name_size);
            let value = match nv.value_type {
                ffi::NAMED_STRING => Value::Str(string_from(nv.value.string_value, nv.value_size)),
                ffi::NAMED_INT64 => Value::I64(nv.value.int64_value),
                ffi::NAMED_INT64_LIST => Value::I64List(if nv.value_size == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(nv.value.int64_array_value, nv.value_size).to_vec()
                }),
                ffi::NAMED_FLOAT => Value::F32(nv.value.float_value),
                _ => Value::Bool(nv.value.bool_value),
            };
            (name, value)
        })
        .collect()
}

/// Copies a plugin-owned (pointer, length) string.
///
/// # Safety
/// `PJRT_Extension_Base`: the header every extension in a plugin's chain starts with.
#[repr(C)]
pub(crate) struct ExtensionHeader {
    pub(crate) struct_size: usize,
    pub(crate) kind: std::ffi::c_int,
    pub(crate) next: *mut ExtensionHeader,
}

/// `ptr` must point to `len` readable bytes, or be null.
pub(crate) unsafe fn string_from(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    let bytes = std::slice::from_raw_parts(ptr as *const u8, len);
    String::from_utf8_lossy(bytes).into_owned()
}

pub struct Plugin {
    api: *const ffi::Api,
    path: PathBuf,
    // Kept so the code behind `api` stays mapped; never dropped before the process ends.
    _library: libloading::Library,
}

// The PJRT C API is thread-safe; the table itself is immutable after initialisation.
// SAFETY: the PJRT C API may be called from any thread; the handle is not tied to the thread that made it.
unsafe impl Send for Plugin {}
// SAFETY: the plugin synchronizes concurrent calls on one handle itself (the PJRT C API is thread-safe); maxrs holds no
// unsynchronized state beside it.
unsafe impl Sync for Plugin {}

static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<Plugin>>>> = OnceLock::new();

/// A plugin's set-up (loading, initialising, describing a topology) runs alone; compiles run
/// beside each other. Why: libtpu remaps its own code onto huge pages as it sets up, and a
/// subprocess another thread spawns meanwhile (the CUDA compiler runs ptxas) fails with EFAULT
/// ("cannot spawn child process: Bad address"), failing that compile. Only a process that
/// holds two plugins at once meets this (`maxrs topologies`, the tests).
static SET_UP_ALONE: RwLock<()> = RwLock::new(());

/// Held while a plugin sets up; see [`SET_UP_ALONE`].
pub(crate) fn setting_up() -> RwLockWriteGuard<'static, ()> {
    // A panic while holding it leaves nothing half-done that the lock protects.
    SET_UP_ALONE.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held while a plugin compiles; see [`SET_UP_ALONE`].
pub(crate) fn compiling() -> RwLockReadGuard<'static, ()> {
    SET_UP_ALONE.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Plugin {
    /// Loads and initialises the plugin at `path`, or returns the one already loaded from there.
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        let key =
            path.canonicalize().map_err(|e| Error::Load { path: path.display().to_string(), reason: e.to_string() })?;
        let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap();
        if let Some(plugin) = loaded.get(&key) {
            return Ok(plugin.clone());
        }
        let load_error = |reason: String| Error::Load { path: key.display().to_string(), reason };
        let _alone = setting_up();
        // SAFETY: loading runs the library's initialisers; maxrs loads PJRT plugins only (the GetPjrtApi symbol is
        // checked next) and never unloads them.
        let library = unsafe { libloading::Library::new(&key) }.map_err(|e| load_error(e.to_string()))?;
        // SAFETY: every PJRT plugin exports GetPjrtApi with this signature; it returns a pointer to its static function
        // table.
        let api = unsafe {
            let get_api: libloading::Symbol<ffi::GetPjrtApi> = library
                .get(b"GetPjrtApi\0")
                .map_err(|e| load_error(format!("no GetPjrtApi symbol ({e}); is this a PJRT plugin?")))?;
            get_api()
        };
        if api.is_null() {
            return Err(load_error("GetPjrtApi returned null".into()));
        }
        let plugin = Arc::new(Plugin { api, path: key.clone(), _library: library });
        let (major, minor) = plugin.api_version();
        if major != ffi::API_MAJOR {
            return Err(load_error(format!(
                "plugin implements PJRT C API {major}.{minor}; maxrs speaks {}.x",
                ffi::API_MAJOR
            )));
        }
        let mut args: ffi::PluginInitializeArgs = ffi::args();
        crate::pjrt_call!(plugin, PJRT_Plugin_Initialize, args)?;
        tracing::debug!(path = %key.display(), major, minor, "loaded PJRT plugin");
        loaded.insert(key, plugin.clone());
        Ok(plugin)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn api(&self) -> &ffi::Api {
        // Valid for the life of the process: the library is never unloaded.
        // SAFETY: `api` was checked non-null at load and points to the plugin's static table, which lives as long as
        // the library, which is never unloaded.
        unsafe { &*self.api }
    }

    /// The first of the plugin's extensions (`PJRT_Api.extension_start`, a chain of
    /// `PJRT_Extension_Base` headers), or null.
    /// The extension of type `kind` (`PJRT_Extension_Type`) in the plugin's chain, if it has one.
    pub(crate) fn find_extension(&self, kind: std::ffi::c_int) -> Option<*const ExtensionHeader> {
        let mut next = self.api().extension_start.cast_const().cast::<ExtensionHeader>();
        while !next.is_null() {
            // SAFETY: every extension starts with the `PJRT_Extension_Base` header, and the chain
            // belongs to the loaded plugin, which is never unloaded.
            let header = unsafe { &*next };
            if header.kind == kind {
                return Some(next);
            }
            next = header.next;
        }
        None
    }

    /// The PJRT C API version the plugin implements (major, minor).
    pub fn api_version(&self) -> (i32, i32) {
        let v = &self.api().pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    /// The plugin's attributes (`xla_version`, `stablehlo_current_version`, ...).
    pub fn attributes(&self) -> Result<Vec<(String, Value)>> {
        let mut args: ffi::PluginAttributesArgs = ffi::args();
        crate::pjrt_call!(self, PJRT_Plugin_Attributes, args)?;
        // SAFETY: the plugin filled this (pointer, length) in the successful call above; it points into the object,
        // which is alive here.
        Ok(unsafe { read_named_values(args.attributes, args.num_attributes) })
    }

    /// Calls the function stored at `offset` in the table, after checking the plugin's table is
    /// long enough to hold it and that it is not null. Use through [`pjrt_call!`].
    pub(crate) fn call<A>(
        &self,
        function: &'static str,
        offset: usize,
        slot: impl FnOnce(&ffi::Api) -> ffi::Fn<A>,
        args: &mut A,
    ) -> Result<()> {
        let api = self.api();
        let (major, minor) = self.api_version();
        if offset + std::mem::size_of::<usize>() > api.struct_size {
            return Err(Error::Unsupported { function, major, minor });
        }
        let f = slot(api).ok_or(Error::Unsupported { function, major, minor })?;
        // SAFETY: the table holds this slot (checked above) and `f` is its function, whose argument type is the slot's
        // args struct; `args` is a live value of that type.
        let error = unsafe { f(args) };
        // SAFETY: `error` is what the plugin just returned: null or a live error object.
        unsafe { self.check(function, error) }
    }

    /// Converts a `PJRT_Error*` returned by `function` into a Result, destroying the error.
    ///
    /// # Safety
    /// `error` must be null or an error object returned by this plugin and not yet destroyed.
    pub(crate) unsafe fn check(&self, function: &'static str, error: *mut ffi::Error) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        let api = self.api();
        let mut message_args: ffi::ErrorMessageArgs = ffi::args();
        message_args.error = error;
        let message = match api.PJRT_Error_Message {
            Some(f) => {
                f(&mut message_args);
                string_from(message_args.message, message_args.message_size)
            }
            None => String::from("(plugin gave no message)"),
        };
        let mut code_args: ffi::ErrorGetCodeArgs = ffi::args();
        code_args.error = error;
        let code = match api.PJRT_Error_GetCode {
            Some(f) => {
                // An error from GetCode itself would be a second error object; this API
                // returns null here in every plugin, and there is nothing better to report.
                let second = f(&mut code_args);
                if second.is_null() {
                    ErrorCode::from_raw(code_args.code)
                } else {
                    ErrorCode::Unknown
                }
            }
            None => ErrorCode::Unknown,
        };
        let mut destroy: ffi::ErrorDestroyArgs = ffi::args();
        destroy.error = error;
        if let Some(f) = api.PJRT_Error_Destroy {
            f(&mut destroy);
        }
        Err(Error::Plugin { function, code, message })
    }
}

/// Calls a PJRT function by name on a [`Plugin`], e.g. `pjrt_call!(plugin, PJRT_Client_Devices, args)`.
#[macro_export]
#[doc(hidden)]
macro_rules! pjrt_call {
    ($plugin:expr, $function:ident, $args:expr) => {
        $plugin.call(
            stringify!($function),
            std::mem::offset_of!($crate::pjrt::ffi::Api, $function),
            |api| api.$function,
            &mut $args,
        )
    };
}
