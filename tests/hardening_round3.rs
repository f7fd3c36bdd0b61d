//! Issue 42's cases outside the data pipeline and the checkpoints: a command never writes over
//! a file the run reads (its config and model files, the tokenizer, the data) nor through a
//! symlink into maxrs's cache; locations, GPU descriptions and topologies that cannot be right
//! are refused in one line; waits on the network have a deadline that is printed and kept.
//! Each case runs the binary as a user would and checks the bytes already on disk.

use std::path::Path;

use crate::common::cli::{maxrs, refused};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn no_output_of_a_run_may_be_a_file_its_config_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("run.yml");
    std::fs::write(&config, "steps: 2\nper_device_batch_size: 1\n").unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let model = models.join("mine.yml");
    std::fs::write(&model, "base_num_decoder_layers: 1\n").unwrap();
    let (config_before, model_before) = (std::fs::read(&config).unwrap(), std::fs::read(&model).unwrap());
    let config_arg = config.to_str().unwrap();
    let out = |path: &Path| format!("compiled_trainstep_file={}", path.display());
    let e = refused(&["train-compile", config_arg, "--topology=cpu-1", &out(&config)], &[]);
    assert!(e.contains("is the same file as CONFIG=") && e.contains("give compiled_trainstep_file a path"), "{e}");
    let e = refused(&["train-compile", config_arg, "--topology=cpu-1", "model_name=mine", &out(&model)], &[]);
    assert!(e.contains("is the same file as model_name="), "{e}");
    let metrics = format!("metrics_file={}", config.display());
    let e = refused(&["train", config_arg, &metrics], &[]);
    assert!(e.contains("metrics_file=") && e.contains("is the same file as CONFIG="), "{e}");
    assert_eq!(std::fs::read(&config).unwrap(), config_before, "not a byte of the config may change");
    assert_eq!(std::fs::read(&model).unwrap(), model_before, "nor of the model file");
}

#[test]
fn no_output_of_a_run_may_be_its_tokenizer_or_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = dir.path().join("tok.model");
    std::fs::copy(format!("{}/tests/data/shakespeare-bpe512.model", env!("CARGO_MANIFEST_DIR")), &tokenizer).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let rows = data.join("b.jsonl");
    std::fs::write(&rows, "{\"text\": \"to be or not to be\"}\n").unwrap();
    let before = (std::fs::read(&tokenizer).unwrap(), std::fs::read(&rows).unwrap());
    // `maxrs train metrics_file=METRICS` reading `train_files` (and `extra`) with the tokenizer.
    let run = |metrics: &Path, train_files: String, extra: &[String]| {
        let mut args = vec![
            "train".to_string(),
            format!("metrics_file={}", metrics.display()),
            "dataset_type=hf".to_string(),
            format!("tokenizer_path={}", tokenizer.display()),
            format!("hf_train_files={train_files}"),
        ];
        args.extend(extra.iter().cloned());
        refused(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
    };
    let glob = format!("{}/*.jsonl", data.display());
    let e = run(&tokenizer, glob.clone(), &[]);
    assert!(e.contains("is the same file as tokenizer_path="), "{e}");
    let e = run(&rows, glob.clone(), &[]);
    assert!(e.contains(&format!("is the same file as hf_train_files={:?}", rows.display().to_string())), "{e}");
    // A component of a weighted mixture, and an eval file.
    let e = run(&rows, format!("{glob},0.5;{},0.5", rows.display()), &[]);
    assert!(e.contains("is the same file as hf_train_files="), "{e}");
    let other = data.join("a.txt");
    std::fs::write(&other, "to be\n").unwrap();
    let eval = [format!("hf_eval_files={}", rows.display()), "eval_interval=1".to_string()];
    let e = run(&rows, other.display().to_string(), &eval);
    assert!(e.contains("is the same file as hf_eval_files="), "{e}");
    assert_eq!((std::fs::read(&tokenizer).unwrap(), std::fs::read(&rows).unwrap()), before);
}

/// `plugins fetch --dest DIR` where DIR's plugin is a symlink into the cache: the link is
/// replaced by a copy, and the cache's file keeps every byte (it was truncated to 0 bytes).
#[test]
fn a_fetched_bundle_never_writes_through_a_symlink_into_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let out = maxrs(&["plugins", "fetch", "cpu", "--dest", cache.to_str().unwrap()], &[]);
    if !out.status.success() {
        return crate::common::provision::skip_offline(&format!("plugins fetch cpu: {}", text(&out.stderr)));
    }
    let member = "plugins/lammps-jax-pjrt-cpu-0.11.2/pjrt_c_api_cpu_plugin.so";
    let cached = cache.join(member);
    let size = std::fs::metadata(&cached).unwrap().len();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(bundle.join(member).parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&cached, bundle.join(member)).unwrap();
    let env = [("MAXRS_CACHE", cache.to_str().unwrap())];
    let out = maxrs(&["plugins", "fetch", "cpu", "--dest", bundle.to_str().unwrap()], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::metadata(&cached).unwrap().len(), size, "the cache's plugin keeps its bytes");
    let copy = std::fs::symlink_metadata(bundle.join(member)).unwrap();
    assert!(copy.is_file() && copy.len() == size, "the bundle holds a copy, not the link");
    // Both are intact: a run from either cache loads its plugin without fetching.
    for cache in [&cache, &bundle] {
        let env = [("MAXRS_CACHE", cache.to_str().unwrap()), ("MAXRS_PYPI_INDEX", "http://127.0.0.1:9/simple")];
        let out = maxrs(&["devices"], &env);
        assert!(out.status.success(), "{}: {}", cache.display(), text(&out.stderr));
    }
}

#[test]
fn a_location_with_a_slash_missing_is_refused_not_made_a_local_folder() {
    let dir = tempfile::tempdir().unwrap();
    for (key, value) in [("base_output_directory", "gs:/bkt/runs"), ("load_parameters_path", "gs:/bkt/ckpt/3")] {
        let mut cmd = crate::common::cli::command(&["train", &format!("{key}={value}")], &[]);
        cmd.current_dir(dir.path());
        let e = crate::common::cli::refused_by(cmd);
        assert!(e.contains(&format!("{key}: {value}: `gs:` followed by one slash is not a location")), "{e}");
        assert!(e.contains("write gs://BUCKET/PATH"), "{e}");
    }
    assert!(!dir.path().join("gs:").exists(), "nothing was written");
}

/// A Cloud Storage endpoint that accepts connections and never answers: each try gives up at
/// the printed request timeout, each retry is announced, and the error names the wait (it was
/// 5 silent tries of 300 s).
#[test]
fn a_storage_endpoint_that_never_answers_fails_at_the_printed_deadline() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().flatten().collect();
        drop(held);
    });
    let started = std::time::Instant::now();
    let env = [("STORAGE_EMULATOR_HOST", endpoint.as_str()), ("MAXRS_GCS_TIMEOUT", "0.5")];
    let out = maxrs(&["train", "load_parameters_path=gs://bkt/ckpt/3", "steps=1"], &env);
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && !stderr.contains("panicked"), "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
    assert!(stderr.contains("no answer within 0.5 s; try 2 of 5 in"), "each retry is announced:\n{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("gs://bkt/ckpt/3"), "{}", errors[0]);
    assert!(
        errors[0].contains("no answer within 0.5 s in each of 5 tries; MAXRS_GCS_TIMEOUT sets the wait"),
        "{}",
        errors[0]
    );
    let e = refused(&["train", "load_parameters_path=gs://bkt/ckpt/3"], &[("MAXRS_GCS_TIMEOUT", "soon")]);
    assert!(e.contains("MAXRS_GCS_TIMEOUT=\"soon\": give the seconds"), "{e}");
}

/// A step too large for this machine's memory on the CPU plugin is refused after the compile,
/// with both sizes and the keys that shrink it (it died of XLA's allocation error, which names
/// no key: deepseek3-tiny's defaults need 32 GB).
#[test]
fn a_cpu_step_larger_than_the_machine_is_refused_naming_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let output = format!("base_output_directory={}", dir.path().display());
    // [64, 4 heads, 16384, 16384] attention scores alone are 275 GB.
    let out = maxrs(&["train", &output, "per_device_batch_size=64", "max_target_length=16384", "steps=1"], &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && !stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
    let [e] = errors[..] else { panic!("one error line expected:\n{stderr}") };
    assert!(e.contains("out of memory: the train step needs") && e.contains("more than this machine's"), "{e}");
    assert!(e.contains("lower per_device_batch_size or max_target_length"), "{e}");
}

#[test]
fn a_gpu_description_for_a_target_that_is_no_gpu_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let description = dir.path().join("gpu.txtpb");
    std::fs::write(&description, include_str!("../src/aot/gpu_targets/h100-sxm.txtpb")).unwrap();
    let given = format!("gpu_target_config={}", description.display());
    let e = refused(&["train-compile", "--topology=cpu-2", &given], &[]);
    assert!(
        e.contains("describes the GPU of a deviceless CUDA compile, but compile_topology=cpu-2 is not a GPU"),
        "{e}"
    );
}
