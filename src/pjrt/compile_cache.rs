//! The persistent compilation cache: MaxText's `jax_cache_dir`, which MaxText hands to JAX's
//! `compilation_cache.set_cache_dir` (`src/maxtext/configs/pyconfig.py` at main e591f30;
//! default `~/jax_cache`). A program that took at least a second to compile is serialized into
//! the directory; a later compile of the same program on the same plugin, devices and
//! `XLA_FLAGS` loads it instead of compiling again. JAX's rules (`jax/_src/compiler.py`,
//! `config.py`, `cache_key.py` at jax-ml/jax cec06d1): only compiles of at least
//! `jax_persistent_cache_min_compile_time_secs` = 1 s are written (JAX's variable
//! `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` changes it), only by process 0, entries are
//! compressed, and a cache that cannot be read or written costs a warning, never the run.
//!
//! Like JAX's, the cache is process-wide: a run sets it from its config ([`configure`]) and
//! every [`Client::compile`](super::Client::compile) consults it, as does
//! [`Client::compile_serialized`](super::Client::compile_serialized) (a pipeline's stage
//! programs, whose bytes are loaded onto each stage). Deviceless (topology) compiles do not
//! (PJRT loads a serialized executable only onto a client's devices), nor does an AOT artifact's
//! compile ([`Client::compile_uncached`](super::Client::compile_uncached)), whose executable is
//! serialized again: a CPU executable loaded from its bytes does not serialize whole again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use sha2::{Digest, Sha256};

use super::{Client, CompileOptions, LoadedExecutable};

/// JAX's `jax_persistent_cache_min_compile_time_secs` (default 1 s; JAX reads it from
/// `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` too): quicker compiles are not written.
fn min_compile_time() -> Duration {
    const NAME: &str = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS";
    match std::env::var(NAME) {
        Err(_) => Duration::from_secs(1),
        Ok(text) => match text.trim().parse::<f64>().ok().and_then(|s| Duration::try_from_secs_f64(s).ok()) {
            Some(d) => d,
            None => {
                tracing::warn!("{NAME}={text:?} is not a number of seconds >= 0; using 1");
                Duration::from_secs(1)
            }
        },
    }
}

/// Bumped when what a cache entry holds changes, so older entries are never read as newer ones.
const FORMAT: &str = "maxrs compile cache v1";

static DIR: RwLock<Option<PathBuf>> = RwLock::new(None);

/// Sets the cache directory from `jax_cache_dir`: "" turns the cache off, a leading `~/` is the
/// home directory (MaxText expands it with `os.path.expanduser`). Local directories only.
pub fn configure(jax_cache_dir: &str) -> Result<()> {
    let dir = resolve(jax_cache_dir)?;
    *DIR.write().unwrap_or_else(|e| e.into_inner()) = dir;
    Ok(())
}

fn resolve(jax_cache_dir: &str) -> Result<Option<PathBuf>> {
    if jax_cache_dir.is_empty() {
        return Ok(None);
    }
    if jax_cache_dir.contains("://") {
        bail!(
            "jax_cache_dir={jax_cache_dir:?}: a remote compilation cache is not supported yet; give a local \
             directory, or \"\" for none"
        );
    }
    let home = || dirs::home_dir().filter(|h| !h.as_os_str().is_empty());
    match jax_cache_dir.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => match home() {
            Some(home) => Ok(Some(home.join(rest.trim_start_matches('/')))),
            None => bail!("jax_cache_dir={jax_cache_dir:?}: there is no home directory to expand ~ into; give an absolute path, or \"\" for none"),
        },
        _ => Ok(Some(PathBuf::from(jax_cache_dir))),
    }
}

fn dir() -> Option<PathBuf> {
    DIR.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Compiles `mlir` on `client` through the cache: a hit is loaded, a miss compiled (and kept
/// when it took long enough). `compile` is the uncached compile.
pub(crate) fn compile_through(
    client: &Client,
    mlir: &str,
    options: &CompileOptions,
    compile: impl FnOnce() -> super::Result<LoadedExecutable>,
) -> super::Result<LoadedExecutable> {
    through(client, mlir, options, |entry| load(client, entry), store, compile)
}

/// `compile_through` for an executable wanted as bytes (a pipeline stage's program, loaded onto
/// every stage that runs it): the cached bytes when the cache has them (checked by loading them
/// once), else `compile`'s, kept as `compile_through` keeps an executable. A CPU executable
/// loaded from bytes does not serialize whole again, so the bytes are what is shared.
pub(crate) fn serialized_through(
    client: &Client,
    mlir: &str,
    options: &CompileOptions,
    compile: impl FnOnce() -> super::Result<Vec<u8>>,
) -> super::Result<Vec<u8>> {
    let checked = |entry: &Path| match read(entry)? {
        Some(bytes) => client.deserialize(&bytes).map(|_| Some(bytes)).map_err(Into::into),
        None => Ok(None),
    };
    through(client, mlir, options, checked, |bytes: &Vec<u8>, entry| store_serialized(bytes, entry), compile)
}

/// The cache's rule for either form of a compiled program (`T`): `load` a hit, else `compile`
/// and `store` it when it took long enough (or replaced a broken entry), on process 0 only.
fn through<T>(
    client: &Client,
    mlir: &str,
    options: &CompileOptions,
    load: impl FnOnce(&Path) -> Result<Option<T>>,
    store: impl FnOnce(&T, &Path) -> Result<()>,
    compile: impl FnOnce() -> super::Result<T>,
) -> super::Result<T> {
    let Some(dir) = dir() else { return compile() };
    let entry = match key(client, mlir, options) {
        Ok(key) => dir.join(key),
        Err(e) => {
            tracing::warn!("compilation cache: cannot key this program ({e:#}); compiling it");
            return compile();
        }
    };
    // A broken entry is replaced whatever the compile takes: the program was worth keeping once.
    let broken = match load(&entry) {
        Ok(Some(compiled)) => {
            tracing::debug!("compilation cache: loaded {}", entry.display());
            return Ok(compiled);
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!("compilation cache: cannot use {} ({e:#}); compiling again", entry.display());
            true
        }
    };
    let start = Instant::now();
    let compiled = compile()?;
    if (broken || start.elapsed() >= min_compile_time()) && client.process_index().unwrap_or(0) == 0 {
        if let Err(e) = store(&compiled, &entry) {
            tracing::warn!("compilation cache: cannot write {} ({e:#})", entry.display());
        }
    }
    Ok(compiled)
}

/// What the compiled code depends on, hashed: the program and its compile options, the plugin
/// (file, size, modification time, platform version), the devices' kinds and processes, and
/// `XLA_FLAGS` (JAX's key has the same parts: module, jaxlib version, platform, flags, compile
/// options, accelerator config).
fn key(client: &Client, mlir: &str, options: &CompileOptions) -> Result<String> {
    let mut hash = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    part(FORMAT.as_bytes());
    let plugin = client.plugin().path();
    let (size, mtime_ns) = super::provision::size_and_mtime(plugin)?;
    part(plugin.as_os_str().as_encoded_bytes());
    part(&size.to_le_bytes());
    part(&mtime_ns.to_le_bytes());
    part(client.platform_name()?.as_bytes());
    part(client.platform_version()?.as_bytes());
    for device in client.devices()? {
        part(format!("{} {} {}", device.id, device.process_index, device.kind).as_bytes());
    }
    part(std::env::var("XLA_FLAGS").unwrap_or_default().as_bytes());
    part(&options.to_proto_bytes());
    part(mlir.as_bytes());
    Ok(super::provision::hex(&hash.finalize()))
}

/// The executable kept at `entry`, if there is one.
fn load(client: &Client, entry: &Path) -> Result<Option<LoadedExecutable>> {
    match read(entry)? {
        Some(serialized) => Ok(Some(client.deserialize(&serialized)?)),
        None => Ok(None),
    }
}

/// The serialized executable kept at `entry`, if there is one.
fn read(entry: &Path) -> Result<Option<Vec<u8>>> {
    let compressed = match std::fs::read(entry) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(Some(zstd::stream::decode_all(compressed.as_slice())?))
}

fn store(executable: &LoadedExecutable, entry: &Path) -> Result<()> {
    store_serialized(&executable.executable().serialize()?, entry)
}

fn store_serialized(serialized: &[u8], entry: &Path) -> Result<()> {
    let compressed = zstd::stream::encode_all(serialized, 1)?;
    if let Some(parent) = entry.parent() {
        std::fs::create_dir_all(parent)?;
    }
    crate::files::write_atomic(entry, |f| f.write_all(&compressed))
}

#[cfg(test)]
mod tests {
    use super::resolve;
    use std::path::PathBuf;

    #[test]
    fn jax_cache_dir_values() {
        assert_eq!(resolve("").unwrap(), None);
        assert_eq!(resolve("/tmp/c").unwrap(), Some(PathBuf::from("/tmp/c")));
        assert_eq!(resolve("rel/c").unwrap(), Some(PathBuf::from("rel/c")));
        let home = dirs::home_dir().unwrap();
        assert_eq!(resolve("~/jax_cache").unwrap(), Some(home.join("jax_cache")));
        assert_eq!(resolve("~").unwrap(), Some(home.clone()));
        assert_eq!(resolve("~user/c").unwrap(), Some(PathBuf::from("~user/c")));
        let e = resolve("gs://b/c").unwrap_err().to_string();
        assert!(e.contains("jax_cache_dir=\"gs://b/c\"") && e.contains("not supported yet"), "{e}");
    }
}
