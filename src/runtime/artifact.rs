//! The file `compiled_trainstep_file=PATH` holds: a header describing what the executable was
//! compiled for, then the plugin's serialized executable.
//!
//! Layout: the 8-byte magic `MAXRSAOT`, a little-endian u64 header length, the header as JSON
//! (readable with `head -c`), then the executable bytes to the end of the file. The header holds
//! the sha256 of the executable bytes, checked before they reach the plugin: a damaged
//! executable can crash the plugin or, worse, load and compute something else.
//!
//! Loading compares the header with what the current run would compile: differing shapes,
//! topology or configuration are an error listing every differing key with both values; a
//! different plugin build is an error (XLA executables only load into the build that made
//! them); different XLA flags are a warning, because the flags were baked in at compile time.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::registry::{self, Families, Role};
use crate::config::Config;
use crate::files;
use crate::ir::Program;
use crate::model::Model;
use crate::pjrt::provision::Build;
use crate::pjrt::Plugin;

mod plugin;

pub use plugin::plugin_for_step;

const MAGIC: &[u8; 8] = b"MAXRSAOT";
const NOT_AOT: &str = "not a maxrs compiled train step (no MAXRSAOT header); make one with `maxrs train-compile`";
const RECOMPILE: &str = "recompile it with `maxrs train-compile` and the same settings";
/// Far more than any header (a few hundred KB for the largest models' argument lists).
const MAX_HEADER: u64 = 64 << 20;

/// One argument of the compiled step: its name in the parameter tree, element type, global
/// shape and sharding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentSpec {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<i64>,
    pub sharding: String,
}

/// What an executable was compiled for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactHeader {
    pub maxrs_version: String,
    /// Plugin package and version (`jax-cuda12-pjrt 0.12.0.1`), or the plugin file's name.
    pub plugin: String,
    /// The platform version the plugin reports (part of the build identity).
    pub platform_version: String,
    /// The plugin's package and version when known: `maxrs train` loads exactly this build
    /// (`artifact::plugin`). Absent in files from before it, and for a plugin file of unknown origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_build: Option<Build>,
    pub topology: String,
    pub num_devices: usize,
    /// Configuration values that change the compiled program (`per_device_batch_size`, ...).
    pub config: BTreeMap<String, String>,
    pub arguments: Vec<ArgumentSpec>,
    /// [`program_fingerprint`] of the lowered step (empty in files from before it existed).
    #[serde(default)]
    pub program_fingerprint: String,
    pub xla_flags: String,
    /// The device ids of each host (process), in process order: the device assignment the step
    /// was compiled with. Empty in files written before multi-host runs (then not checked).
    #[serde(default)]
    pub device_ids_per_host: Vec<Vec<i64>>,
    /// sha256 of the executable bytes, hex; set by [`write`]. Files from before it have none.
    #[serde(default)]
    pub executable_sha256: Option<String>,
    /// A pipelined step (`ici_pipeline_parallelism > 1`): its schedule and the executables the
    /// file holds one after the other. Absent for the one-executable step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineSection>,
}

/// What a pipelined step's file holds besides the common header (written by `aot::pipeline`,
/// read by `train::pipeline::aot`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineSection {
    /// The schedule as it runs: e.g. `1f1b`, 4 stages x 2 repeats, 8 microbatches.
    pub schedule: String,
    /// Each stage's tasks in order (`F3.0` = forward of chunk 3 on microbatch 0).
    pub tasks: Vec<Vec<String>>,
    /// The executables, in file order: name and length in bytes.
    pub executables: Vec<(String, u64)>,
}

/// A mismatch between a saved executable and the current run.
#[derive(Debug, Default, PartialEq)]
pub struct Differences {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

impl ArtifactHeader {
    /// Compares the header `saved` in a file with `self`, the header of the current run.
    pub fn differences(&self, saved: &ArtifactHeader) -> Differences {
        let mut diff = Differences::default();
        let mut differ = |errors: bool, key: &str, saved: &str, current: &str| {
            if saved != current {
                let line = format!("{key}: compiled with {saved}, this run has {current}");
                if errors {
                    diff.errors.push(line)
                } else {
                    diff.warnings.push(line)
                }
            }
        };
        differ(true, "topology", &saved.topology, &self.topology);
        differ(true, "number of devices", &saved.num_devices.to_string(), &self.num_devices.to_string());
        differ(true, "plugin", &saved.plugin, &self.plugin);
        if !saved.device_ids_per_host.is_empty() && !self.device_ids_per_host.is_empty() {
            let show = |hosts: &[Vec<i64>]| hosts.iter().map(|ids| id_ranges(ids)).collect::<Vec<_>>().join(" | ");
            differ(
                true,
                "device ids per host (process)",
                &show(&saved.device_ids_per_host),
                &show(&self.device_ids_per_host),
            );
        }
        // The platform version is informative only: the plugin identity already pins the build, and
        // a deviceless topology and a real client may word it differently.
        differ(false, "plugin platform version", &saved.platform_version, &self.platform_version);
        let keys: std::collections::BTreeSet<&String> = saved.config.keys().chain(self.config.keys()).collect();
        for key in keys {
            let value = |map: &BTreeMap<String, String>| map.get(key).cloned().unwrap_or_else(|| "(unset)".into());
            differ(true, key, &value(&saved.config), &value(&self.config));
        }
        // A few arguments say what changed; all of them differ when the devices do (40 lines).
        let describe = |a: &ArgumentSpec| format!("{} {}{:?} {}", a.name, a.dtype, a.shape, same_sharding(&a.sharding));
        let describe_at =
            |args: &[ArgumentSpec], i: usize| args.get(i).map(describe).unwrap_or_else(|| "(none)".into());
        let differing: Vec<usize> = (0..saved.arguments.len().max(self.arguments.len()))
            .filter(|&i| describe_at(&saved.arguments, i) != describe_at(&self.arguments, i))
            .collect();
        for &i in differing.iter().take(ARGUMENTS_SHOWN) {
            differ(true, &format!("argument {i}"), &describe_at(&saved.arguments, i), &describe_at(&self.arguments, i));
        }
        let more_arguments = differing.len().checked_sub(ARGUMENTS_SHOWN).filter(|n| *n > 0);
        // The keys and arguments above name what differs; the fingerprint also catches a setting
        // that changes the step without being listed.
        if !saved.program_fingerprint.is_empty() {
            differ(true, "traced program (StableHLO sha256)", &saved.program_fingerprint, &self.program_fingerprint);
        }
        match (&saved.pipeline, &self.pipeline) {
            (Some(saved), Some(current)) => {
                differ(true, "pipeline schedule", &saved.schedule, &current.schedule);
                let names =
                    |p: &PipelineSection| p.executables.iter().map(|e| e.0.clone()).collect::<Vec<_>>().join(", ");
                differ(true, "pipeline programs", &names(saved), &names(current));
                differ(true, "pipeline tasks", &format!("{:?}", saved.tasks), &format!("{:?}", current.tasks));
            }
            (None, None) => {}
            (saved, _) => {
                let describe = |p: Option<&PipelineSection>| {
                    p.map_or_else(|| "no pipeline".to_string(), |p| format!("pipeline {}", p.schedule))
                };
                differ(true, "pipeline", &describe(saved.as_ref()), &describe(self.pipeline.as_ref()));
            }
        }
        differ(false, "XLA flags", &format!("{:?}", saved.xla_flags), &format!("{:?}", self.xla_flags));
        differ(false, "maxrs version", &saved.maxrs_version, &self.maxrs_version);
        if let Some(more) = more_arguments {
            let (noun, verb) = if more == 1 { ("argument", "differs") } else { ("arguments", "differ") };
            diff.errors.push(format!("and {more} more {noun} {verb}"));
        }
        diff
    }
}

/// Differing arguments listed one by one; the rest are counted.
const ARGUMENTS_SHOWN: usize = 4;

/// A sharding as compared: one that splits no dimension (`P(None, None)`) is `replicated`, as
/// a one-device run writes it.
fn same_sharding(sharding: &str) -> &str {
    let splits_nothing = sharding
        .strip_prefix("P(")
        .and_then(|rest| rest.strip_suffix(')'))
        .is_some_and(|dims| dims.split(',').all(|d| matches!(d.trim(), "None" | "")));
    if splits_nothing {
        "replicated"
    } else {
        sharding
    }
}

/// `[0, 1, 2, 5]` as `0-2,5`.
fn id_ranges(ids: &[i64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", ids[i], ids[j]) } else { ids[i].to_string() });
        i = j + 1;
    }
    parts.join(",")
}

/// A digest of the lowered program: equal exactly when the two sides traced the same step, so a
/// setting that changes the step without being a listed key is caught too.
pub fn program_fingerprint(mlir: &str) -> String {
    sha256_hex(mlir.as_bytes())
}

/// The devices a step runs on, in a form both sides can compute: the compiling side from its
/// target topology, the running side from its client.
pub fn describe_devices(hosts: usize, devices_per_host: usize, device_kind: &str) -> String {
    format!("{} x {} {device_kind}", crate::config::plural(hosts, "host"), devices_per_host)
}

/// A plugin build's identity: file name, size and PJRT API version (an executable only loads
/// into the build that compiled it; the size tells builds of one package name apart cheaply).
pub fn plugin_identity(plugin: &Plugin) -> String {
    let path = plugin.path();
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let (major, minor) = plugin.api_version();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name} ({size} bytes, PJRT API {major}.{minor})")
}

/// Where a step is compiled for, or runs: both sides describe it the same way.
pub struct Platform {
    /// [`describe_devices`].
    pub devices: String,
    pub num_devices: usize,
    /// [`plugin_identity`].
    pub plugin: String,
    /// The platform version the plugin reports.
    pub platform_version: String,
    /// The plugin's package and version, when known (the compiling side records it).
    pub build: Option<Build>,
}

/// The header of the train step `program` (of `model`, lowered to `mlir`) compiled from
/// `config` for `platform`.
pub fn header(config: &Config, model: &Model, program: &Program, mlir: &str, platform: Platform) -> ArtifactHeader {
    let values = serde_json::to_value(config).expect("the config serializes");
    // The model's keys, and those of the training setup compiled into the step besides (batch and
    // sequence, initialization, the optimizer and schedule constants, mesh sizes).
    let setup = registry::keys_with(Role::Step).filter(|k| k.families == Families::None).map(|k| k.name);
    let keys: Vec<&str> = model.config_keys().into_iter().chain(setup).collect();
    let config = keys
        .iter()
        .map(|&key| {
            let value = match &values[key] {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (key.to_string(), value)
        })
        .collect();
    let arguments = program
        .inputs
        .iter()
        .map(|input| ArgumentSpec {
            name: input.name.clone(),
            dtype: input.ty.dtype.to_string(),
            shape: input.ty.shape.to_vec(),
            sharding: input.sharding.as_ref().map_or_else(|| "replicated".to_string(), |s| s.to_string()),
        })
        .collect();
    ArtifactHeader {
        maxrs_version: env!("CARGO_PKG_VERSION").to_string(),
        plugin: platform.plugin,
        platform_version: platform.platform_version,
        plugin_build: platform.build,
        topology: platform.devices,
        num_devices: platform.num_devices,
        config,
        arguments,
        program_fingerprint: program_fingerprint(mlir),
        xla_flags: std::env::var("XLA_FLAGS").unwrap_or_default(),
        device_ids_per_host: Vec::new(),
        executable_sha256: None,
        pipeline: None,
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    crate::pjrt::provision::hex(&Sha256::digest(bytes))
}

/// Writes header + executable to `path` atomically ([`files::write_atomic`]), so an
/// interrupted write never leaves a truncated file where a good one was. The header gets the
/// executable's checksum.
pub fn write(path: &Path, header: &ArtifactHeader, executable: &[u8]) -> Result<()> {
    let header = ArtifactHeader { executable_sha256: Some(sha256_hex(executable)), ..header.clone() };
    let json = serde_json::to_vec_pretty(&header)?;
    files::write_atomic(path, |file| {
        file.write_all(MAGIC)?;
        file.write_all(&(json.len() as u64).to_le_bytes())?;
        file.write_all(&json)?;
        file.write_all(executable)
    })
    .with_context(|| format!("writing compiled train step to {}", path.display()))
}

/// Reads a file written by [`write`]: the header, and the executable bytes once their checksum
/// matches the header's.
pub fn read(path: &Path) -> Result<(ArtifactHeader, Vec<u8>)> {
    let bytes = crate::input::read("compiled_trainstep_file", path, crate::input::COMPILED)?;
    parse(&bytes).map_err(|e| anyhow!("compiled_trainstep_file={}: {e}", path.display()))
}

/// The header of the file at `path` alone (the executable is not read).
pub fn read_header(path: &Path) -> Result<ArtifactHeader> {
    let what = |e: String| anyhow!("compiled_trainstep_file={}: {e}", path.display());
    let mut file = crate::input::open("compiled_trainstep_file", path)?;
    let mut start = [0u8; 16];
    file.read_exact(&mut start).map_err(|_| what(NOT_AOT.to_string()))?;
    if &start[..8] != MAGIC {
        return Err(what(NOT_AOT.to_string()));
    }
    let len = u64::from_le_bytes(start[8..].try_into().expect("8 bytes"));
    let mut json = Vec::new();
    file.take(len.min(MAX_HEADER)).read_to_end(&mut json).map_err(|e| what(e.to_string()))?;
    serde_json::from_slice(&json).map_err(|e| what(format!("damaged file: the header is not valid ({e}); {RECOMPILE}")))
}

/// Splits and checks the bytes of a compiled-train-step file (see the module docs).
pub fn parse(bytes: &[u8]) -> Result<(ArtifactHeader, Vec<u8>)> {
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        bail!("{NOT_AOT}");
    }
    let header_len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let body = usize::try_from(header_len).ok().and_then(|n| 16usize.checked_add(n)).filter(|&end| end <= bytes.len());
    let Some(body) = body else {
        bail!(
            "truncated or damaged: its header claims {header_len} bytes but the file has {}; {RECOMPILE}",
            bytes.len()
        );
    };
    let header: ArtifactHeader = serde_json::from_slice(&bytes[16..body])
        .map_err(|e| anyhow!("damaged file: the header is not valid ({e}); {RECOMPILE}"))?;
    let executable = &bytes[body..];
    match &header.executable_sha256 {
        None => bail!("the header has no checksum of the executable (written by an older maxrs); {RECOMPILE}"),
        Some(expected) if *expected != sha256_hex(executable) => bail!(
            "damaged file: the executable's sha256 does not match the one in its header, so it was changed \
             after it was written; {RECOMPILE}"
        ),
        Some(_) => Ok((header, executable.to_vec())),
    }
}

/// Reads `path` and checks it against `current`: returns the executable bytes, logging
/// warnings, or an error listing every difference.
pub fn load_matching(path: &Path, current: &ArtifactHeader) -> Result<Vec<u8>> {
    let (saved, executable) = read(path)?;
    check_matching(path, &saved, current)?;
    Ok(executable)
}

/// Checks the header `saved` read from `path` against `current`: logs warnings, or returns an
/// error listing every difference.
pub fn check_matching(path: &Path, saved: &ArtifactHeader, current: &ArtifactHeader) -> Result<()> {
    let diff = current.differences(saved);
    for warning in &diff.warnings {
        tracing::warn!("{}: {warning} (the compiled values are used)", path.display());
    }
    if !diff.errors.is_empty() {
        bail!(
            "{} was compiled for a different run:\n  {}\nrecompile with `maxrs train-compile` and the same settings as this run",
            path.display(),
            diff.errors.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> ArtifactHeader {
        ArtifactHeader {
            maxrs_version: "0.1.0".into(),
            plugin: "lammps-jax-pjrt-cpu 0.11.2".into(),
            platform_version: "cpu".into(),
            plugin_build: None,
            topology: "cpu-8".into(),
            num_devices: 8,
            config: [("per_device_batch_size", "4"), ("max_target_length", "128")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            arguments: vec![ArgumentSpec {
                name: "params.embed".into(),
                dtype: "f32".into(),
                shape: vec![256, 64],
                sharding: "[{\"fsdp\"}, {}]".into(),
            }],
            program_fingerprint: "0f".into(),
            xla_flags: String::new(),
            device_ids_per_host: vec![(0..8).collect()],
            executable_sha256: None,
            pipeline: None,
        }
    }

    #[test]
    fn round_trip_and_mismatch_report() {
        let dir = std::env::temp_dir().join(format!("maxrs-aot-{}", std::process::id()));
        let path = dir.join("step.aot");
        write(&path, &header(), b"executable bytes").unwrap();
        assert_eq!(load_matching(&path, &header()).unwrap(), b"executable bytes");

        let mut other = header();
        other.config.insert("per_device_batch_size".into(), "8".into());
        other.topology = "cpu-4".into();
        other.xla_flags = "--xla_cpu_enable_fast_math=false".into();
        let err = load_matching(&path, &other).unwrap_err().to_string();
        assert!(err.contains("per_device_batch_size: compiled with 4, this run has 8"), "{err}");
        assert!(err.contains("topology: compiled with cpu-8, this run has cpu-4"), "{err}");
        assert!(!err.contains("XLA flags"), "flags only warn: {err}");

        let mut two_hosts = header();
        two_hosts.device_ids_per_host = vec![(0..4).collect(), (4..8).collect()];
        let err = load_matching(&path, &two_hosts).unwrap_err().to_string();
        assert!(err.contains("device ids per host (process): compiled with 0-7, this run has 0-3 | 4-7"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_different_program_is_refused_even_when_no_listed_key_differs() {
        let mut other = header();
        other.program_fingerprint = "1e".into();
        let err = other.differences(&header()).errors.join("\n");
        assert!(err.contains("traced program (StableHLO sha256): compiled with 0f, this run has 1e"), "{err}");
        // Files from before the fingerprint existed are judged by their keys alone.
        let mut old = header();
        old.program_fingerprint.clear();
        assert!(other.differences(&old).errors.is_empty());
    }

    /// A step compiled for 2 devices loaded by a 1-device run: the real differences and a count,
    /// not 40 argument lines of which many were the same sharding written two ways.
    #[test]
    fn argument_differences_are_counted_past_a_few_and_unsplit_equals_replicated() {
        let argument = |i: usize, sharding: &str| ArgumentSpec {
            name: format!("params.w{i}"),
            dtype: "f32".into(),
            shape: vec![4, 4],
            sharding: sharding.into(),
        };
        let mut saved = header();
        saved.arguments =
            (0..10).map(|i| argument(i, if i % 2 == 0 { "P(None, None)" } else { "P('fsdp', None)" })).collect();
        let mut current = header();
        current.arguments = (0..10).map(|i| argument(i, "replicated")).collect();
        let errors = current.differences(&saved).errors;
        let arguments: Vec<&String> = errors.iter().filter(|e| e.starts_with("argument ")).collect();
        assert_eq!(arguments.len(), ARGUMENTS_SHOWN, "{errors:?}");
        assert!(arguments[0].starts_with("argument 1: compiled with params.w1 f32[4, 4] P('fsdp', None), this run has"));
        assert_eq!(errors.last().unwrap(), "and 1 more argument differs", "5 of 10 differ: {errors:?}");
        saved.arguments.retain(|a| a.sharding == "P(None, None)");
        current.arguments =
            saved.arguments.iter().map(|a| ArgumentSpec { sharding: "replicated".into(), ..a.clone() }).collect();
        assert!(current.differences(&saved).errors.is_empty());
    }

    #[test]
    fn foreign_and_truncated_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("maxrs-aot-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let foreign = dir.join("foreign");
        std::fs::write(&foreign, b"not an artifact at all").unwrap();
        assert!(read(&foreign).unwrap_err().to_string().contains("not a maxrs compiled train step"));
        let truncated = dir.join("truncated");
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&1000u64.to_le_bytes());
        bytes.extend_from_slice(b"{}");
        std::fs::write(&truncated, bytes).unwrap();
        assert!(read(&truncated).unwrap_err().to_string().contains("truncated"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every single-bit flip in the executable bytes is caught before the bytes are returned.
    #[test]
    fn damaged_executables_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("step.aot");
        let executable: Vec<u8> = (0..64u8).collect();
        write(&path, &header(), &executable).unwrap();
        let good = std::fs::read(&path).unwrap();
        let start = good.len() - executable.len();
        for bit in 0..executable.len() * 8 {
            let mut bad = good.clone();
            bad[start + bit / 8] ^= 1 << (bit % 8);
            let e = parse(&bad).unwrap_err().to_string();
            assert!(e.contains("damaged file") && e.contains("maxrs train-compile"), "bit {bit}: {e}");
        }
        let mut old = header();
        old.executable_sha256 = None;
        let json = serde_json::to_vec(&old).unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&json);
        assert!(parse(&bytes).unwrap_err().to_string().contains("no checksum"));
    }
}
