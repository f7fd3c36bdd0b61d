//! The plugin build a run that loads a compiled step uses: exactly the one the step's header
//! names (an XLA executable only loads into the build that compiled it), found as
//! `pjrt::provision` finds builds, or a one-line refusal naming both builds and the ways out.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

use super::read_header;
use crate::config::Config;
use crate::pjrt::provision::{check_build, check_name, missing_build, PluginSpec, Provisioner};

/// The plugin file a run of `c` must load for the step in `c.compiled_trainstep_file`; `None`
/// without such a file, or when its header records no build (then `c.plugin` as chosen, and
/// the header's plugin identity is checked when the step loads). Prints which file it is.
pub fn plugin_for_step(c: &Config) -> Result<Option<PathBuf>> {
    if c.compiled_trainstep_file.is_empty() {
        return Ok(None);
    }
    let artifact = Path::new(&c.compiled_trainstep_file);
    let Some(wanted) = read_header(artifact)?.plugin_build else { return Ok(None) };
    let spec: PluginSpec = c.plugin.parse().map_err(|e| anyhow!("{e} (given by plugin=)"))?;
    let provisioner = Provisioner::from_env();
    let resolved = match spec {
        PluginSpec::Path(_) => {
            let resolved = provisioner.resolve(&spec, "plugin=")?;
            check_build(artifact, &resolved, &wanted)?;
            resolved
        }
        PluginSpec::Name(chosen) => {
            let name = check_name(artifact, chosen, &wanted)?;
            match provisioner.plugin_build(name, &wanted.version) {
                Ok(Some(resolved)) => resolved,
                Ok(None) => return Err(missing_build(artifact, name, &wanted, &provisioner.builds_here(name))),
                Err(download) => {
                    let line = missing_build(artifact, name, &wanted, &provisioner.builds_here(name));
                    let why = format!("{download:#}");
                    return Err(anyhow!("{line} (the download failed: {})", why.lines().next().unwrap_or_default()));
                }
            }
        }
    };
    println!(
        "plugin: {wanted}, {} (from {}): the build {} was compiled with",
        resolved.path.display(),
        resolved.source,
        artifact.display()
    );
    Ok(Some(resolved.path))
}
