//! Unpacking one file of a wheel (a zip) into place atomically: it is written under a temporary
//! name next to its destination and renamed, so an interrupted run never leaves a partial file
//! under the name that later runs take as a finished one. Its sha256, taken while unpacking from
//! the verified wheel, is recorded next to it (`verified`).

use std::fs::File;
use std::io;
use std::path::Path;

use anyhow::{anyhow, Result};

use super::verified;

/// Permissions of an unpacked file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// A shared library or data file (0644).
    Library,
    /// A program such as `ptxas` (0755).
    Executable,
}

/// Copies `member` of the wheel file `wheel` (named `wheel_name` in messages) to `dest`.
/// The zip reader checks the member's CRC-32, so a corrupt entry is an error, not a file.
pub(super) fn extract_member(wheel: &Path, wheel_name: &str, member: &str, dest: &Path, mode: Mode) -> Result<()> {
    let file =
        File::open(wheel).map_err(|e| anyhow!("cannot open downloaded {wheel_name} at {}: {e}", wheel.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| anyhow!("{wheel_name} is not a valid wheel (zip): {e}"))?;
    let mut entry = archive
        .by_name(member)
        .map_err(|e| anyhow!("{wheel_name} has no file `{member}` ({e}); the pinned wheel layout changed"))?;
    let dir = dest.parent().ok_or_else(|| anyhow!("destination {} has no parent folder", dest.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| anyhow!("cannot create {}: {e}", dir.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".unpack-")
        .tempfile_in(dir)
        .map_err(|e| anyhow!("cannot create a temporary file in {}: {e}", dir.display()))?;
    let mut hashing = verified::HashingWriter::new(&mut tmp);
    io::copy(&mut entry, &mut hashing)
        .map_err(|e| anyhow!("unpacking `{member}` from {wheel_name} to {} failed: {e}", dir.display()))?;
    let sha256 = hashing.finish();
    match mode {
        Mode::Library => {
            set_mode(tmp.as_file(), 0o644)?;
            // Data must be on disk before the rename makes the file visible under its final name.
            tmp.as_file().sync_all().map_err(|e| anyhow!("cannot flush {}: {e}", tmp.path().display()))?;
            tmp.persist(dest)
                .map_err(|e| anyhow!("cannot move unpacked `{member}` to {}: {}", dest.display(), e.error))?;
        }
        // A program must be placed so that it can be run at once (see `place_executable`).
        Mode::Executable => {
            let unpacked = tmp.into_temp_path();
            crate::files::place_executable(&unpacked, dest)?;
        }
    }
    // What later runs check the cached file against (see `verified`).
    verified::record(dest, &sha256).map_err(|e| anyhow!("cannot record the checksum of {}: {e:#}", dest.display()))?;
    Ok(())
}

#[cfg(unix)]
fn set_mode(file: &File, bits: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(bits))
        .map_err(|e| anyhow!("cannot set permissions {bits:o} on unpacked file: {e}"))
}

#[cfg(not(unix))]
fn set_mode(_file: &File, _bits: u32) -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tiny_wheel(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("demo-1.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("demo/bin/tool", options).unwrap();
        zip.write_all(b"#!/bin/sh\necho hi\n").unwrap();
        zip.finish().unwrap();
        path
    }

    #[test]
    fn extracts_member_with_mode_and_no_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = tiny_wheel(dir.path());
        let dest = dir.path().join("out/bin/tool");
        extract_member(&wheel, "demo", "demo/bin/tool", &dest, Mode::Executable).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"#!/bin/sh\necho hi\n");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777, 0o755);
        }
        let mut names: Vec<_> =
            std::fs::read_dir(dest.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["tool", "tool.sha256"].map(std::ffi::OsString::from), "no temporary files left");
    }

    /// The CI failure "Text file busy": a program unpacked while other threads start processes
    /// must run at once (before `place_executable`, 19 of 300 such runs failed on 2 cores).
    #[test]
    fn an_unpacked_program_runs_at_once_while_other_threads_start_processes() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = tiny_wheel(dir.path());
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::process::Command::new("true").status().unwrap();
                    }
                });
            }
            let busy = (0..100)
                .filter(|i| {
                    let dest = dir.path().join(format!("bin{i}/tool"));
                    extract_member(&wheel, "demo", "demo/bin/tool", &dest, Mode::Executable).unwrap();
                    match std::process::Command::new(&dest).output() {
                        Ok(out) => {
                            assert_eq!(out.stdout, b"hi\n");
                            false
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => true,
                        Err(e) => panic!("running {}: {e}", dest.display()),
                    }
                })
                .count();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(busy, 0, "runs refused with ETXTBSY");
        });
    }

    #[test]
    fn missing_member_names_wheel_and_member() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = tiny_wheel(dir.path());
        let err =
            extract_member(&wheel, "demo-1.0", "demo/lib.so", &dir.path().join("lib.so"), Mode::Library).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("demo-1.0") && msg.contains("demo/lib.so"), "{msg}");
        assert!(!dir.path().join("lib.so").exists());
    }

    /// The real CPU plugin wheel, when a copy lies at the path noted in the task (offline check).
    #[test]
    fn unpacks_cpu_plugin_from_local_wheel_copy() {
        let wheel = Path::new("/tmp/wheels/lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl");
        if !wheel.is_file() {
            eprintln!("skipped: no local copy of the CPU wheel at {}", wheel.display());
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("pjrt_c_api_cpu_plugin.so");
        let pin = crate::pjrt::provision::PluginName::Cpu.pin();
        extract_member(wheel, "cpu wheel", pin.member, &dest, Mode::Library).unwrap();
        let mut head = [0u8; 4];
        io::Read::read_exact(&mut File::open(&dest).unwrap(), &mut head).unwrap();
        assert_eq!(&head, b"\x7fELF");
    }
}
