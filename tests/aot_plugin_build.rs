//! Issue 28 on this CPU-only machine: a compiled step records its plugin build, and `maxrs
//! train` loads exactly that build or refuses another in one line naming both; `maxrs plugins
//! fetch` fills a folder that an offline run uses through `MAXRS_CACHE` with the package index
//! pointed at a closed loopback port; `train-compile --topology=h100-1` works with
//! `jax-cuda13-pjrt==0.11.2`, a build that embeds no GPU description. The CUDA cases download
//! their plugins (see `skip_offline` in tests/common/provision.rs).

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use crate::common::cli::{maxrs, refused};
use crate::common::provision::{provisioned, skip_offline};
use maxrs::aot::topology::lookup;

const RUN: &[&str] = &["per_device_batch_size=1", "max_target_length=32", "steps=3", "cpu_device_count=2"];

/// The tests' tiniest decoder on top of `RUN`: what is checked is which plugin build a step
/// records and loads, not the model (the default model's compiles were most of these tests' CPU).
const MODEL: &[&str] = crate::common::TINY_DECODER;

/// An index URL on a loopback port nothing listens on: any download fails at once.
fn closed_index() -> String {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}/simple")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn compile(topology: &str, file: &Path, extra: &[&str]) -> String {
    let file = format!("compiled_trainstep_file={}", file.display());
    let mut args = vec!["train-compile", topology, file.as_str()];
    args.extend(RUN);
    args.extend(MODEL);
    args.extend(extra);
    let out = maxrs(&args, &[]);
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

fn train_args<'a>(file: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train", file];
    args.extend(RUN);
    args.extend(MODEL);
    args.extend(extra);
    args
}

#[test]
fn a_fetched_bundle_serves_an_offline_run_and_without_it_the_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let out = maxrs(&["plugins", "fetch", "cpu", "--dest", bundle.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let so = bundle.join("plugins/lammps-jax-pjrt-cpu-0.11.2/pjrt_c_api_cpu_plugin.so");
    assert!(so.is_file() && so.with_extension("so.sha256").is_file(), "{}", text(&out.stdout));

    let step = dir.path().join("step.aot");
    compile("--topology=cpu-2", &step, &[]);
    let file = format!("compiled_trainstep_file={}", step.display());
    let index = closed_index();
    let offline =
        |cache: &Path| vec![("MAXRS_CACHE", cache.to_str().unwrap().to_string()), ("MAXRS_PYPI_INDEX", index.clone())];
    let env = offline(&bundle);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = maxrs(&train_args(&file, &[]), &env);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let loaded = format!("plugin: lammps-jax-pjrt-cpu 0.11.2, {} (from the maxrs cache)", so.display());
    assert!(stdout.contains(&loaded), "{stdout}");
    assert!(stdout.contains("loaded the compiled train step") && stdout.contains("completed step: 2"), "{stdout}");

    let empty = dir.path().join("empty");
    let env = offline(&empty);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let e = refused(&train_args(&file, &[]), &env);
    assert!(
        e.contains("was compiled with lammps-jax-pjrt-cpu 0.11.2, but this machine has no lammps-jax-pjrt-cpu build"),
        "{e}"
    );
    assert!(
        e.contains("maxrs plugins fetch cpu --version 0.11.2 --dest DIR") && e.contains("the download failed"),
        "{e}"
    );
    // A run naming another plugin than the step's.
    let e = refused(&train_args(&file, &["hardware=gpu", "plugin=cuda12"]), &[]);
    assert!(e.contains("(plugin=cpu), but this run uses plugin=cuda12; set plugin=cpu"), "{e}");
}

/// `jax-cuda13-pjrt 0.11.2` (what JAX 0.11.2 installs), fetched by maxrs into a bundle; `None`
/// when the test skips offline.
fn cuda13_0_11_2(dest: &Path) -> Option<PathBuf> {
    let out = maxrs(&["plugins", "fetch", "cuda13", "--version", "0.11.2", "--dest", dest.to_str().unwrap()], &[]);
    if !out.status.success() {
        skip_offline(&format!("maxrs plugins fetch cuda13 --version 0.11.2: {}", text(&out.stderr)));
        return None;
    }
    assert!(dest.join("cuda").is_dir(), "the CUDA compile tools come with a GPU plugin");
    Some(dest.join("plugins/jax-cuda13-pjrt-0.11.2/xla_cuda_plugin.so"))
}

#[test]
fn h100_steps_compile_with_either_cuda13_build_and_load_only_into_their_own() {
    let target = lookup("h100-1", 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    if !provisioned(&target) {
        return;
    }
    let Some(old) = cuda13_0_11_2(&dir.path().join("bundle")) else { return };
    let old_plugin = format!("plugin={}", old.display());
    // 0.11.2 embeds no H100 description: maxrs's copy is used, and the step records the build.
    let old_step = dir.path().join("old.aot");
    let stdout = compile("--topology=h100-1", &old_step, &[old_plugin.as_str()]);
    assert!(
        stdout.contains("GPU description (NVIDIA H100 80GB HBM3): maxrs's copy from jax-cuda13-pjrt 0.12.0.1"),
        "{stdout}"
    );
    let header = maxrs::runtime::artifact::read_header(&old_step).unwrap();
    assert_eq!(header.plugin_build.unwrap().to_string(), "jax-cuda13-pjrt 0.11.2");
    // The pinned build embeds it.
    let new_step = dir.path().join("new.aot");
    let stdout = compile("--topology=h100-1", &new_step, &["plugin=cuda13"]);
    assert!(stdout.contains("GPU description (NVIDIA H100 80GB HBM3): the plugin file"), "{stdout}");

    // Each loaded with the other build: refused in one line naming both, before any device.
    let file = format!("compiled_trainstep_file={}", new_step.display());
    let e = refused(&train_args(&file, &["hardware=gpu", old_plugin.as_str()]), &[]);
    let both = format!(
        "was compiled with jax-cuda13-pjrt 0.12.0.1, but this machine has only jax-cuda13-pjrt 0.11.2 ({})",
        old.display()
    );
    assert!(e.contains(&both), "{e}");
    // A cache holding the pinned build only (linked to the real one), with no way to download.
    let pinned = maxrs::pjrt::provision::cache_dir().join("plugins/jax-cuda13-pjrt-0.12.0.1");
    let only_new = dir.path().join("only-new/plugins/jax-cuda13-pjrt-0.12.0.1");
    std::fs::create_dir_all(&only_new).unwrap();
    for file in ["xla_cuda_plugin.so", "xla_cuda_plugin.so.sha256"] {
        std::os::unix::fs::symlink(pinned.join(file), only_new.join(file)).unwrap();
    }
    let file = format!("compiled_trainstep_file={}", old_step.display());
    let cache = dir.path().join("only-new");
    let env = [("MAXRS_CACHE", cache.to_str().unwrap()), ("MAXRS_PYPI_INDEX", &closed_index())];
    let e = refused(&train_args(&file, &["hardware=gpu", "plugin=cuda13"]), &env);
    let both = format!(
        "was compiled with jax-cuda13-pjrt 0.11.2, but this machine has only jax-cuda13-pjrt 0.12.0.1 ({})",
        only_new.join("xla_cuda_plugin.so").display()
    );
    assert!(e.contains(&both), "{e}");
}
