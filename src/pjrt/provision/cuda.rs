//! The CUDA compile toolchain a GPU plugin needs to compile on a machine without CUDA: a folder
//! with `bin/ptxas` and `nvvm/libdevice/libdevice.10.bc`, named by `--xla_gpu_cuda_data_dir`.
//! Taken from a local CUDA install of the same major release, else from pip's NVIDIA wheels, else
//! assembled in the cache from the pinned NVIDIA wheels.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, Result};

use super::command::stdout_within;
use super::wheel::Mode;
use super::{python, Provisioner, WheelPin};

const PTXAS: &str = "bin/ptxas";
const LIBDEVICE: &str = "nvvm/libdevice/libdevice.10.bc";
/// The files of a toolchain folder.
pub(super) const TOOLCHAIN_FILES: [&str; 2] = [PTXAS, LIBDEVICE];

/// A CUDA major release; a plugin needs the toolchain of the release it was built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaMajor {
    Cuda12,
    Cuda13,
}

impl CudaMajor {
    fn number(self) -> u32 {
        match self {
            Self::Cuda12 => 12,
            Self::Cuda13 => 13,
        }
    }

    /// Each toolchain file: the pinned wheel and its path there, the path in the toolchain folder,
    /// and its mode. CUDA 12 ships both files in one wheel; CUDA 13 split libdevice into `nvidia-nvvm`.
    fn pieces(self) -> [(WheelPin, &'static str, Mode); 2] {
        match self {
            Self::Cuda12 => {
                let nvcc = |member| WheelPin { package: "nvidia-cuda-nvcc-cu12", version: "12.9.86", member };
                [
                    (nvcc("nvidia/cuda_nvcc/bin/ptxas"), PTXAS, Mode::Executable),
                    (nvcc("nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc"), LIBDEVICE, Mode::Library),
                ]
            }
            Self::Cuda13 => [
                (
                    WheelPin { package: "nvidia-cuda-nvcc", version: "13.0.88", member: "nvidia/cu13/bin/ptxas" },
                    PTXAS,
                    Mode::Executable,
                ),
                (
                    WheelPin {
                        package: "nvidia-nvvm",
                        version: "13.0.88",
                        member: "nvidia/cu13/nvvm/libdevice/libdevice.10.bc",
                    },
                    LIBDEVICE,
                    Mode::Library,
                ),
            ],
        }
    }

    /// Where pip's NVIDIA wheels put the toolchain inside site-packages; it already has the layout.
    fn pip_dir(self) -> &'static str {
        match self {
            Self::Cuda12 => "nvidia/cuda_nvcc",
            Self::Cuda13 => "nvidia/cu13",
        }
    }
}

impl fmt::Display for CudaMajor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CUDA {}", self.number())
    }
}

/// A folder for `--xla_gpu_cuda_data_dir` holding `bin/ptxas` and `nvvm/libdevice/libdevice.10.bc`
/// for `cuda`, provisioned (downloaded on first use) with the settings from the environment.
pub fn cuda_toolchain_dir(cuda: CudaMajor) -> Result<PathBuf> {
    Provisioner::from_env().cuda_toolchain(cuda)
}

impl Provisioner {
    /// See [`cuda_toolchain_dir`].
    pub fn cuda_toolchain(&self, cuda: CudaMajor) -> Result<PathBuf> {
        if self.use_installed {
            if let Some(dir) = local_install(&local_candidates(cuda), cuda) {
                return Ok(dir);
            }
            if let Some(dir) = python::site_dirs().iter().map(|d| d.join(cuda.pip_dir())).find(|d| has_toolchain(d)) {
                return Ok(dir);
            }
        }
        let pieces = cuda.pieces();
        let dir = self.toolchain_dir(cuda);
        let missing: Vec<(WheelPin, PathBuf, Mode)> = pieces
            .into_iter()
            .map(|(pin, rel, mode)| (pin, dir.join(rel), mode))
            .filter(|(_, dest, _)| !super::verified::is_intact(dest))
            .collect();
        // Each wheel once, with every missing file it holds (CUDA 12 has both in one wheel).
        let mut fetched: Vec<&str> = Vec::new();
        for (pin, ..) in &missing {
            if fetched.contains(&pin.package) {
                continue;
            }
            fetched.push(pin.package);
            let members: Vec<(&str, &Path, Mode)> = missing
                .iter()
                .filter(|(other, ..)| other.package == pin.package)
                .map(|(other, dest, mode)| (other.member, dest.as_path(), *mode))
                .collect();
            self.fetch(pin, &members).map_err(|e| {
                anyhow!(
                    "could not provision the {cuda} compile toolchain (ptxas, libdevice) that the GPU plugin \
                     needs to compile: {e:#}\nInstall it by hand with `pip install {reqs}`, or install the \
                     CUDA {n} toolkit and set CUDA_HOME to it.",
                    reqs = requirements(cuda),
                    n = cuda.number(),
                )
            })?;
        }
        Ok(dir)
    }

    /// The cache's toolchain folder for `cuda`: `<cache>/cuda/cuda<N>-<version>`.
    pub(super) fn toolchain_dir(&self, cuda: CudaMajor) -> PathBuf {
        self.cache.join("cuda").join(format!("cuda{}-{}", cuda.number(), cuda.pieces()[0].0.version))
    }
}

/// The pip requirements of the toolchain wheels, each once.
fn requirements(cuda: CudaMajor) -> String {
    let mut reqs: Vec<String> = cuda.pieces().iter().map(|(pin, ..)| pin.requirement()).collect();
    reqs.dedup();
    reqs.join(" ")
}

/// Local CUDA installs to try, most specific first.
fn local_candidates(cuda: CudaMajor) -> Vec<PathBuf> {
    let from_env = ["CUDA_HOME", "CUDA_PATH"]
        .into_iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    from_env
        .chain([format!("/usr/local/cuda-{}", cuda.number()), "/usr/local/cuda".to_string()].map(PathBuf::from))
        .collect()
}

/// The first candidate with both files whose `ptxas` reports the wanted major release (a
/// different release's ptxas may reject the PTX the plugin emits).
fn local_install(candidates: &[PathBuf], cuda: CudaMajor) -> Option<PathBuf> {
    candidates.iter().find(|dir| has_toolchain(dir) && ptxas_major(&dir.join(PTXAS)) == Some(cuda.number())).cloned()
}

fn has_toolchain(dir: &Path) -> bool {
    dir.join(PTXAS).is_file() && dir.join(LIBDEVICE).is_file()
}

/// The major release from `ptxas --version` ("Cuda compilation tools, release 12.9, V12.9.86").
fn ptxas_major(ptxas: &Path) -> Option<u32> {
    let mut cmd = Command::new(ptxas);
    cmd.arg("--version");
    let out = stdout_within(cmd, Duration::from_secs(10))?;
    let release = out.split("release ").nth(1)?;
    release.split('.').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake CUDA install whose ptxas prints the version line of `release`.
    #[cfg(unix)]
    fn fake_cuda(release: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::create_dir_all(dir.path().join("nvvm/libdevice")).unwrap();
        let script = dir.path().join("ptxas.sh");
        std::fs::write(&script, format!("#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n"))
            .unwrap();
        // Other tests start processes meanwhile: see `place_executable`.
        crate::files::place_executable(&script, &dir.path().join(PTXAS)).unwrap();
        std::fs::write(dir.path().join(LIBDEVICE), b"bc").unwrap();
        dir
    }

    #[cfg(unix)]
    #[test]
    fn local_install_needs_both_files_and_matching_release() {
        let cuda12 = fake_cuda("12.9");
        let cuda13 = fake_cuda("13.0");
        let empty = tempfile::tempdir().unwrap();
        let candidates = [empty.path().to_path_buf(), cuda12.path().to_path_buf(), cuda13.path().to_path_buf()];
        assert_eq!(local_install(&candidates, CudaMajor::Cuda12).as_deref(), Some(cuda12.path()));
        assert_eq!(local_install(&candidates, CudaMajor::Cuda13).as_deref(), Some(cuda13.path()));
        std::fs::remove_file(cuda12.path().join(LIBDEVICE)).unwrap();
        assert_eq!(local_install(&candidates[..2], CudaMajor::Cuda12), None);
    }

    /// Downloads the real wheels (CUDA 12: ~40 MB) and checks the assembled folder; a second call
    /// finds it in the cache.
    fn provisions_real_toolchain(cuda: CudaMajor) {
        let cache = tempfile::tempdir().unwrap();
        let provisioner = Provisioner::isolated(cache.path().to_path_buf());
        let dir = provisioner.cuda_toolchain(cuda).unwrap();
        assert!(has_toolchain(&dir), "{} lacks ptxas or libdevice", dir.display());
        assert_eq!(ptxas_major(&dir.join(PTXAS)), Some(cuda.number()));
        let again = provisioner.cuda_toolchain(cuda).unwrap();
        assert_eq!(again, dir);
        let leftovers: Vec<_> = std::fs::read_dir(cache.path().join("downloads")).unwrap().collect();
        assert!(leftovers.is_empty(), "downloaded wheels must be deleted after unpacking");
    }

    #[test]
    fn every_toolchain_wheel_is_locked() {
        for cuda in [CudaMajor::Cuda12, CudaMajor::Cuda13] {
            for (pin, ..) in cuda.pieces() {
                for arch in ["x86_64", "aarch64"] {
                    assert!(pin.locked_wheel(arch).is_some(), "{} for {arch} is not in the lock", pin.requirement());
                }
            }
        }
    }

    #[test]
    fn provisions_cuda12_toolchain_from_pypi() {
        provisions_real_toolchain(CudaMajor::Cuda12);
    }

    #[test]
    #[ignore = "downloads ~100 MB of NVIDIA wheels from PyPI; run with --ignored"]
    fn provisions_cuda13_toolchain_from_pypi() {
        provisions_real_toolchain(CudaMajor::Cuda13);
    }
}
