//! MaxText's Orbax checkpoints (issue 47), on the checkpoints MaxText e591f30 wrote itself
//! (tests/data/orbax, see its README and tools/orbax_fixture.py): every array reads bit for bit
//! as Orbax's own restore reads it (`values/*.safetensors`), and a run with
//! `load_parameters_path=` a MaxText checkpoint starts from those parameters. The way back,
//! `maxrs convert to-maxtext`, writes what MaxText writes and resumes from
//! (`to_maxtext*_losses.json`, tools/maxtext_resume.py), with the NNX random streams MaxText's
//! model tree has for each family and layout (`nnx_streams.json`, tools/maxtext_nnx_streams.py).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use maxrs::checkpoint::orbax::ocdbt::Ocdbt;
use maxrs::checkpoint::orbax::write::nnx_aux;
use maxrs::checkpoint::orbax::{incomplete_steps, to_maxtext, Checkpoint};
use maxrs::checkpoint::Checkpoints;
use maxrs::config;
use maxrs::files::Location;
use maxrs::host::DType;
use maxrs::model::Model;
use maxrs::pjrt::cpu_client;
use maxrs::train::run::{train, RunReport};
use safetensors::{Dtype, SafeTensors};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orbax").join(rel)
}

/// What Orbax read back, by tree path: (type, dims, little-endian bytes).
fn orbax_values(name: &str) -> BTreeMap<String, (DType, Vec<i64>, Vec<u8>)> {
    let bytes = std::fs::read(fixture(&format!("values/{name}.safetensors"))).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let ty = match view.dtype() {
                Dtype::F32 => DType::F32,
                Dtype::BF16 => DType::BF16,
                Dtype::I32 => DType::S32,
                Dtype::U32 => DType::U32,
                other => panic!("{name}: {other:?}"),
            };
            let dims = view.shape().iter().map(|&d| d as i64).collect();
            (name, (ty, dims, view.data().to_vec()))
        })
        .collect()
}

#[test]
fn every_array_reads_as_orbax_reads_it() {
    for (values, folder) in
        [("nnx_step1", "nnx/checkpoints/1"), ("nnx_params", "nnx_params/0/items"), ("linen_params", "linen_params/0")]
    {
        let golden = orbax_values(values);
        let ckpt = Checkpoint::open(&Location::Local(fixture(folder))).unwrap();
        let names: Vec<&str> = ckpt.names().collect();
        assert_eq!(names, golden.keys().map(String::as_str).collect::<Vec<_>>(), "{folder}");
        for (name, (ty, dims, data)) in &golden {
            let tensor = ckpt.read(name).unwrap();
            assert_eq!((tensor.ty, &tensor.dims), (*ty, dims), "{folder}: {name}");
            assert!(tensor.data == *data, "{folder}: {name} differs from Orbax's read");
        }
    }
}

/// The fixture's model in maxrs's keys (the MaxText keys it was trained with, see the README),
/// and two of MaxText's defaults that maxrs's `default` model file changes (models/default.yml:
/// `learning_rate: 1.e-3`, `synthetic_progression: true`).
fn run(extra: &[String]) -> anyhow::Result<RunReport> {
    run_on(1, extra)
}

/// [`run`] on `devices` CPU devices.
fn run_on(devices: usize, extra: &[String]) -> anyhow::Result<RunReport> {
    let model = [
        "base_num_decoder_layers=3",
        "base_emb_dim=16",
        "base_mlp_dim=32",
        "base_num_query_heads=2",
        "base_num_kv_heads=2",
        "head_dim=8",
        "vocab_size=64",
        "max_target_length=16",
        "per_device_batch_size=1",
        "weight_dtype=float32",
        "dtype=float32",
        "attention=dot_product",
        "dataset_type=synthetic",
        "learning_rate_schedule_steps=4",
        "learning_rate=3e-5",
        "synthetic_progression=false",
    ];
    let mut args: Vec<String> = model.iter().map(|s| s.to_string()).collect();
    args.extend(extra.iter().cloned());
    train(&config::load(None, &args)?, &cpu_client(devices)?)
}

/// One step from the parameters at `path`.
fn load(path: &Path) -> Vec<String> {
    vec![format!("load_parameters_path={}", path.display()), "steps=1".into()]
}

/// MaxText's own losses continuing a run from step 1's checkpoint, by step: the fixture's
/// (`losses.json`) or maxrs's converted (`to_maxtext_losses.json`).
fn maxtext_losses(file: &str) -> BTreeMap<u64, f64> {
    let text = std::fs::read_to_string(fixture(file)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["loss_by_step"].as_object().unwrap().iter().map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap())).collect()
}

#[test]
fn a_run_starts_from_a_maxtext_checkpoints_parameters() {
    // The parameters Orbax read from step 1's state, as a safetensors file of maxrs's keys and
    // layout (the parameter file format maxrs already loads): the scanned layers' parameters
    // with their layer axis (MaxText's `param_scan_axis`, 1) moved first; the values as they are
    // (the query kernel holds 1/sqrt(head_dim) in both).
    let dir = tempfile::tempdir().unwrap();
    let golden = orbax_values("nnx_step1");
    let file = dir.path().join("params.safetensors");
    let params: Vec<(String, Vec<usize>, Vec<u8>)> = golden
        .iter()
        .filter_map(|(name, (_, dims, data))| {
            let key = name.strip_prefix("params/params/")?.replace('/', ".");
            let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            if !key.starts_with("decoder.layers.") {
                return Some((key, dims, data.clone()));
            }
            // Element [a, l, rest] of the checkpoint is element [l, a, rest] of maxrs's.
            let (a, layers, rest) = (dims[0], dims[1], dims[2..].iter().product::<usize>() * 4);
            let mut moved = vec![0u8; data.len()];
            for (index, element) in data.chunks(rest).enumerate() {
                let (i, l) = (index / layers, index % layers);
                moved[(l * a + i) * rest..][..rest].copy_from_slice(element);
            }
            Some((key, [&[layers, a][..], &dims[2..]].concat(), moved))
        })
        .collect();
    let views: Vec<(&str, safetensors::tensor::TensorView)> = params
        .iter()
        .map(|(key, dims, data)| {
            (key.as_str(), safetensors::tensor::TensorView::new(Dtype::F32, dims.clone(), data).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, &None, &file).unwrap();

    let from_file = run(&load(&file)).unwrap();
    // MaxText's llama2 function of these parameters on this (threefry) batch, in f64:
    // `tools/maxtext_llama_loss.py --prng threefry2x32` gives 4.667259.
    assert!((from_file.losses[0] - 4.667259).abs() < 2e-5, "{}", from_file.losses[0]);
    let fresh = run(&["steps=1".into()]).unwrap();
    assert_ne!(fresh.losses[0], from_file.losses[0], "the checkpoint's parameters are not the init's");
    // A step folder and its item folder both load, to the same first loss as the file.
    for folder in ["nnx/checkpoints/1", "nnx/checkpoints/1/items"] {
        let from_orbax = run(&load(&fixture(folder))).unwrap();
        assert_eq!(from_orbax.losses[0], from_file.losses[0], "{folder}");
    }
    // Sharded over 2 devices (tensor), the same batch of one sequence: each device's block of
    // each parameter is read by ranges and put on it, to the same loss.
    let mut sharded = load(&fixture("nnx/checkpoints/1"));
    sharded.extend(["ici_tensor_parallelism=2".into(), "per_device_batch_size=0.5".into()]);
    let sharded = run_on(2, &sharded).unwrap();
    assert!((sharded.losses[0] - from_file.losses[0]).abs() < 1e-6, "{} vs {}", sharded.losses[0], from_file.losses[0]);

    // The NNX parameter-only checkpoint of the same state (bfloat16): the same values rounded,
    // so a first loss near the f32 parameters'. The Linen one (another run's) loads too.
    let nnx = run(&load(&fixture("nnx_params/0/items"))).unwrap();
    assert!((nnx.losses[0] - from_file.losses[0]).abs() < 1e-2, "{} vs {}", nnx.losses[0], from_file.losses[0]);
    assert_ne!(nnx.losses[0], from_file.losses[0], "bfloat16 parameters");
    let linen = run(&load(&fixture("linen_params/0/items"))).unwrap();
    assert_ne!(linen.losses[0], fresh.losses[0]);

    // Another model: the refusal names the parameter and both shapes.
    let mut wider = load(&fixture("nnx_params/0/items"));
    wider.push("base_mlp_dim=48".into());
    let e = format!("{:#}", run(&wider).err().unwrap());
    assert!(e.contains("load_parameters_path="), "{e}");
    assert!(e.contains("/kernel/value is bf16[") && e.contains("but the model's decoder.layers.mlp."), "{e}");
    assert!(e.contains("48"), "{e}");
}

#[test]
fn a_run_resumes_a_maxtext_train_state() {
    let params = run(&load(&fixture("nnx/checkpoints/1"))).unwrap();
    for folder in ["nnx/checkpoints/1", "nnx/checkpoints/1/items"] {
        let state = format!("load_full_state_path={}", fixture(folder).display());
        let resumed = run(&[state, "steps=4".into()]).unwrap();
        // The checkpoint's `step` is 2 (two updates applied): MaxText's step 2 comes next.
        assert_eq!((resumed.first_step, resumed.losses.len()), (2, 2), "{folder}");
        // The same parameters on the same batch (MaxText's synthetic batch is fed at every step).
        assert_eq!(resumed.losses[0], params.losses[0], "{folder}");
    }
    // A parameter-only checkpoint holds no optimizer state.
    let state = format!("load_full_state_path={}", fixture("linen_params/0").display());
    let e = format!("{:#}", run(&[state, "steps=4".into()]).err().unwrap());
    assert!(e.contains("load_full_state_path=") && e.contains("use load_parameters_path"), "{e}");
}

/// Issue 47's check: resumed from MaxText's checkpoint on MaxText's batch, maxrs's losses are
/// MaxText's own continued run's: the same parameters, AdamW state and query convention (both
/// keep `1/sqrt(head_dim)` in the query kernel, so AdamW updates the same parameter). The batch
/// is given as a token file because MaxText's trainer draws its synthetic batch with `unsafe_rbg`
/// (`trainers/pre_train/train.py` at e591f30 sets `jax_default_prng_impl`), maxrs's synthetic
/// data with threefry (tests/data/orbax/README.md says how the file was made).
#[test]
fn a_resumed_run_continues_with_maxtexts_losses() {
    let maxtext = maxtext_losses("losses.json");
    let state = format!("load_full_state_path={}", fixture("nnx/checkpoints/1").display());
    let batch = format!("dataset_path={}", fixture("maxtext_batch.tokens").display());
    let resumed = run(&[state, batch, "dataset_type=tokens".into(), "steps=4".into()]).unwrap();
    assert_eq!(resumed.losses.len(), 2);
    for (loss, step) in resumed.losses.iter().zip(2..) {
        assert!((loss - maxtext[&step]).abs() < 1e-5, "step {step}: maxrs {loss} vs MaxText {}", maxtext[&step]);
    }
}

/// The same reads from `gs://` (the GCS emulator): the step folder uploaded as it is.
#[test]
fn reads_from_gcs() {
    let Some(_emulator) = crate::common::gcs_emulator::start(&["maxrs-orbax-test"]) else { return };
    let local = fixture("nnx/checkpoints/1");
    let remote = Location::parse("gs://maxrs-orbax-test/checkpoints/1").unwrap();
    let mut folders = vec![local.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else {
                let rel = path.strip_prefix(&local).unwrap().to_str().unwrap().to_string();
                maxrs::storage::write(&remote.join(&rel), &std::fs::read(&path).unwrap()).unwrap();
            }
        }
    }
    let golden = orbax_values("nnx_step1");
    let ckpt = Checkpoint::open(&remote).unwrap();
    // Without the commit file Orbax writes last there, a GCS item is incomplete.
    let incomplete = Location::parse("gs://maxrs-orbax-test/incomplete/1").unwrap();
    for file in ["items/_METADATA", "items/manifest.ocdbt"] {
        maxrs::storage::write(&incomplete.join(file), &std::fs::read(local.join(file)).unwrap()).unwrap();
    }
    let e = format!("{:#}", Checkpoint::open(&incomplete).err().unwrap());
    assert!(e.contains("an incomplete Orbax checkpoint (no commit_success.txt"), "{e}");
    assert_eq!(ckpt.names().count(), golden.len());
    for (name, (_, _, data)) in &golden {
        assert!(ckpt.read(name).unwrap().data == *data, "{name}");
    }

    // As a run's checkpoints folder: the committed step is a resume candidate next to maxrs's own;
    // the uncommitted one is named as incomplete, skipped, and left for MaxText to clean up.
    let run_dir = Checkpoints::new(Location::parse("gs://maxrs-orbax-test/checkpoints").unwrap());
    assert_eq!(run_dir.steps().unwrap(), [1]);
    let restored = run_dir.restore_latest_by(|dir, _| Ok(Checkpoint::open(dir)?.location().clone())).unwrap();
    assert_eq!(restored, Some(remote.join("items")));
    let unfinished = Checkpoints::new(Location::parse("gs://maxrs-orbax-test/incomplete").unwrap());
    assert_eq!((unfinished.steps().unwrap(), incomplete_steps(&unfinished.dir).unwrap()), (vec![], vec!["1".into()]));
    for dir in [&run_dir, &unfinished] {
        dir.remove_incomplete().unwrap();
    }
    assert!(maxrs::storage::is_file(&incomplete.join("items/_METADATA")).unwrap());
    assert!(maxrs::storage::is_file(&remote.join("items/_METADATA")).unwrap());
}

/// Copies the folder `from` to `to`, as it is.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        match path.is_dir() {
            true => copy_tree(&path, &target),
            false => drop(std::fs::copy(&path, &target).unwrap()),
        }
    }
}

/// A run given a MaxText run's output (`base_output_directory` + `run_name`, checkpointing on)
/// resumes from its newest complete step as Orbax's CheckpointManager finds it (a folder still
/// under Orbax's temporary name is skipped), saves its own next, and the newest step wins
/// whichever wrote it; a broken newest step falls back; a checkpoints folder given as
/// `load_full_state_path` is refused, naming a step.
#[test]
fn a_run_resumes_from_a_maxtext_runs_checkpoints_folder() {
    let base = tempfile::tempdir().unwrap();
    let checkpoints = base.path().join("mt/checkpoints");
    for step in ["0", "1"] {
        copy_tree(&fixture(&format!("nnx/checkpoints/{step}")), &checkpoints.join(step));
    }
    copy_tree(&fixture("nnx/checkpoints/1"), &checkpoints.join("5.orbax-checkpoint-tmp-1795860391"));
    let dir = Location::Local(checkpoints.clone());
    assert_eq!(incomplete_steps(&dir).unwrap(), ["5.orbax-checkpoint-tmp-1795860391"]);
    assert_eq!(Checkpoints::new(dir.clone()).steps().unwrap(), [0, 1]);

    // MaxText restores load_full_state_path as one checkpoint (checkpointing.py at MaxText e591f30).
    let whole = format!("load_full_state_path={}", checkpoints.display());
    let e = format!("{:#}", run(&[whole, "steps=3".into()]).err().unwrap());
    let newest = format!("load_full_state_path={}", checkpoints.join("1").display());
    assert!(e.contains("a run's checkpoints folder, not one checkpoint") && e.contains(&newest), "{e}");

    let params = run(&load(&fixture("nnx/checkpoints/1"))).unwrap();
    let output = |steps: u64| {
        let at = format!("base_output_directory={}", base.path().display());
        vec![at, "run_name=mt".into(), "enable_checkpointing=true".into(), format!("steps={steps}")]
    };
    // Folder 1 holds `step` 2: step 2 runs on step 1's parameters, then maxrs saves folder 2.
    let resumed = run(&output(3)).unwrap();
    assert_eq!((resumed.first_step, resumed.losses.len()), (2, 1));
    assert_eq!(resumed.losses[0], params.losses[0]);
    assert!(checkpoints.join("2").join(maxrs::checkpoint::manifest::MANIFEST_FILE).is_file());
    // A newer Orbax step without its item is refused; maxrs's step 2 is the newest good one.
    copy_tree(&fixture("nnx/checkpoints/1"), &checkpoints.join("6"));
    std::fs::remove_dir_all(checkpoints.join("6/items")).unwrap();
    let again = run(&output(4)).unwrap();
    assert_eq!((again.first_step, again.losses.len()), (3, 1));
    assert!(checkpoints.join("6").is_dir(), "a refused checkpoint is left as it is");
    let e = format!("{:#}", Checkpoint::open(&Location::Local(checkpoints.join("6"))).err().unwrap());
    assert!(e.contains("an Orbax step without its item items/"), "{e}");
    // Another model: every step is refused, MaxText's naming its array and both shapes.
    let wider = [&output(5)[..], &["base_mlp_dim=48".into()]].concat();
    let e = format!("{:#}", run(&wider).err().unwrap());
    assert!(e.contains("none of the 5 checkpoints can be restored"), "{e}");
    let step1 = e.split("step 1: ").nth(1).unwrap();
    let want = "mlp/wi_0/kernel is f32[16,3,32] (f32[3,16,32] with the layers first) but the run's \
                params.decoder.layers.mlp.wi_0.kernel is f32[3,16,48]";
    assert!(
        step1.starts_with(&format!("{}: params/params/decoder/layers/{want}", checkpoints.join("1/items").display())),
        "{e}"
    );
}

/// maxrs's array of shape `dims` (a scanned layer's `[layers, a, ...]`) in MaxText's layout,
/// `[a, layers, ...]`: element `[l, i, rest]` goes to `[i, l, rest]`.
fn layers_second(dims: &[usize], data: &[u8]) -> (Vec<usize>, Vec<u8>) {
    let (layers, a) = (dims[0], dims[1]);
    let row = data.len() / (layers * a);
    let mut out = vec![0u8; data.len()];
    for (index, element) in data.chunks(row).enumerate() {
        let (l, i) = (index / a, index % a);
        out[(i * layers + l) * row..][..row].copy_from_slice(element);
    }
    ([&[a, layers][..], &dims[2..]].concat(), out)
}

fn json_file(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Issue 47, the way back: a maxrs run (2 steps of the fixture's model on MaxText's batch)
/// converted by `to_maxtext` holds maxrs's arrays bit for bit in MaxText's tree and layout, is
/// laid out as MaxText's own checkpoint of the same model (tests/data/orbax/nnx/checkpoints/1:
/// the same files, `_METADATA` tree, zarr metadata, array metadata), and continues with the
/// losses MaxText itself had resuming from it (`to_maxtext_losses.json`, tools/maxtext_resume.py).
#[test]
fn a_maxrs_state_converts_to_what_maxtext_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let batch = [format!("dataset_path={}", fixture("maxtext_batch.tokens").display()), "dataset_type=tokens".into()];
    let at = format!("base_output_directory={}", dir.path().display());
    let save = [at, "run_name=mx".into(), "enable_checkpointing=true".into(), "steps=2".into()];
    run(&[&batch[..], &save[..]].concat()).unwrap();
    let out = dir.path().join("converted");
    let written = to_maxtext(&Location::Local(dir.path().join("mx")), &Location::Local(out.clone()), false).unwrap();
    assert_eq!((written.step_dir, written.next_step), (Location::Local(out.join("1")), Some(2)));
    let e = format!(
        "{:#}",
        to_maxtext(&Location::Local(dir.path().join("mx")), &Location::Local(out.clone()), false).err().unwrap()
    );
    assert!(e.contains(&format!("{}: already exists", out.display())), "{e}");
    let e = format!(
        "{:#}",
        to_maxtext(&Location::Local(fixture("nnx")), &Location::Local(dir.path().join("x")), false).err().unwrap()
    );
    assert!(e.contains("not a maxrs checkpoint"), "{e}");

    // Every array as maxrs saved it (its safetensors files), in MaxText's names and layout.
    let ckpt = Checkpoint::open(&Location::Local(out.join("1"))).unwrap();
    let saved = dir.path().join("mx/checkpoints/1");
    let mut compared = 0;
    for file in ["params", "opt_state"] {
        let bytes = std::fs::read(saved.join(format!("{file}.safetensors"))).unwrap();
        for (key, view) in SafeTensors::deserialize(&bytes).unwrap().tensors() {
            let name = match (file, key.split_once('.')) {
                ("params", _) => format!("params/params/{}", key.replace('.', "/")),
                (_, Some((group, rest))) => format!("opt_state/0/{group}/params/{}", rest.replace('.', "/")),
                (_, None) => format!("opt_state/0/{key}"),
            };
            let (dims, data) = match key.contains("decoder.layers.") {
                true => layers_second(view.shape(), view.data()),
                false => (view.shape().to_vec(), view.data().to_vec()),
            };
            let read = ckpt.read(&name).unwrap();
            let read_dims: Vec<usize> = read.dims.iter().map(|&d| d as usize).collect();
            assert!((read_dims, read.data) == (dims, data), "{name} differs from maxrs's {file}.safetensors {key}");
            compared += 1;
        }
    }
    assert_eq!(compared, 37);
    for name in ["step", "opt_state/0/count", "opt_state/2/count"] {
        assert_eq!(ckpt.read(name).unwrap().data, 2i32.to_le_bytes(), "{name}");
    }

    // MaxText's own checkpoint of this model has the same files (but `_sharding`, the devices'
    // layout, and `ocdbt.process_0/`, the per-process database Orbax merges), the same leaves,
    // zarr metadata and array metadata.
    let (ours, theirs) = (out.join("1"), fixture("nnx/checkpoints/1"));
    for file in ["_CHECKPOINT_METADATA", "commit_success.txt", "items/commit_success.txt", "items/manifest.ocdbt"] {
        assert!(ours.join(file).is_file() && theirs.join(file).is_file(), "{file}");
    }
    for file in ["items/_METADATA", "items/array_metadatas/process_0"] {
        let sorted = |path: &Path| {
            let mut json = json_file(path);
            if let Some(list) = json.get_mut("array_metadatas").and_then(|l| l.as_array_mut()) {
                list.sort_by_key(|m| m["array_metadata"]["param_name"].to_string());
            }
            json
        };
        assert_eq!(sorted(&ours.join(file)), sorted(&theirs.join(file)), "{file}");
    }
    let (step_ours, step_theirs) =
        (json_file(&ours.join("_CHECKPOINT_METADATA")), json_file(&theirs.join("_CHECKPOINT_METADATA")));
    let keys = |j: &serde_json::Value| j.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&step_ours), keys(&step_theirs));
    for key in ["item_handlers", "custom_metadata"] {
        assert_eq!(step_ours[key], step_theirs[key], "_CHECKPOINT_METADATA {key}");
    }
    let (db_ours, db_theirs) =
        (Ocdbt::open(&ckpt.location().clone()).unwrap(), Ocdbt::open(&Location::Local(theirs.join("items"))).unwrap());
    assert_eq!(db_ours.keys().collect::<Vec<_>>(), db_theirs.keys().collect::<Vec<_>>());
    for name in ckpt.names() {
        let key = format!("{}/zarr.json", name.replace('/', "."));
        let zarr = |db: &Ocdbt| serde_json::from_slice::<serde_json::Value>(&db.read(key.as_bytes()).unwrap()).unwrap();
        assert_eq!(zarr(&db_ours), zarr(&db_theirs), "{key}");
    }

    // The parameters alone (`--params-only`): the same arrays at `0/items`, each leaf as in
    // MaxText's parameter-only checkpoint of this model (tests/data/orbax/linen_params, whose
    // `step` and empty `opt_state` MaxText's `load_parameters_path` does not read).
    let params_out = dir.path().join("params");
    let written =
        to_maxtext(&Location::Local(dir.path().join("mx")), &Location::Local(params_out.clone()), true).unwrap();
    assert_eq!((written.next_step, written.arrays), (None, 12));
    let params_only = Checkpoint::open(&Location::Local(params_out.join("0"))).unwrap();
    let names: Vec<&str> = ckpt.names().filter(|n| n.starts_with("params/")).collect();
    assert_eq!(params_only.names().collect::<Vec<_>>(), names);
    for name in names {
        assert_eq!(params_only.read(name).unwrap(), ckpt.read(name).unwrap(), "{name}");
    }
    let linen = json_file(&fixture("linen_params/0/items/_METADATA"));
    let mut want = linen["tree_metadata"].as_object().unwrap().clone();
    want.retain(|key, _| key.starts_with("('params'"));
    assert_eq!(json_file(&params_out.join("0/items/_METADATA"))["tree_metadata"], serde_json::Value::Object(want));

    // maxrs continuing from the converted checkpoint: MaxText's losses from it, the first also
    // MaxText's from the parameters alone.
    let maxtext = maxtext_losses("to_maxtext_losses.json");
    let text = std::fs::read_to_string(fixture("to_maxtext_losses.json")).unwrap();
    let from_params =
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["params_only_loss_by_step"]["0"].as_f64().unwrap();
    let state = format!("load_full_state_path={}", out.join("1/items").display());
    let resumed = run(&[&batch[..], &[state, "steps=4".into()]].concat()).unwrap();
    assert_eq!((resumed.first_step, resumed.losses.len()), (2, 2));
    for (loss, step) in resumed.losses.iter().zip(2..) {
        assert!((loss - maxtext[&step]).abs() < 1e-5, "step {step}: maxrs {loss} vs MaxText {}", maxtext[&step]);
    }
    assert!((resumed.losses[0] - from_params).abs() < 1e-5, "maxrs {} vs MaxText {from_params}", resumed.losses[0]);
}

/// Issue 47: the NNX random streams `to_maxtext` writes for a train state (`nnx_aux`, where the
/// model says MaxText keeps them) are MaxText's own, leaf by leaf (path, shape, dtype, PRNG key
/// or count), for every decoder block and layout MaxText built its abstract train state of
/// (tests/data/orbax/nnx_streams.json, tools/maxtext_nnx_streams.py: the same model files with a
/// few layers, scanned and unscanned; Llama 4 and Gemma 4 with and without experts in a block's
/// first layer, which then hold the layers' shared `Rngs`). A layout whose streams maxrs does not
/// know has none, so `to_maxtext` refuses its train state: scanned Gemma 4, whose local layers'
/// streams MaxText stacks over two axes (`gemma4.rs`); its table entries hold what MaxText has.
#[test]
fn nnx_streams_are_maxtexts_for_every_family_and_layout() {
    let table = json_file(&fixture("nnx_streams.json"));
    let mut compared = 0;
    for (block, entry) in table["blocks"].as_object().unwrap() {
        for scan in ["true", "false"] {
            let want = entry[format!("scan_layers={scan}")].as_object().unwrap();
            let mut args = vec![format!("model_name={}", entry["model_name"].as_str().unwrap())];
            args.push("override_model_config=true".into());
            args.extend(entry["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_string()));
            args.push(format!("scan_layers={scan}"));
            let c = config::load(None, &args).unwrap_or_else(|e| panic!("{block} {args:?}: {e:#}"));
            // `<decoder_block>` or `<decoder_block>/<model file>` (another model of the block).
            let decoder_block = block.split('/').next().unwrap();
            assert_eq!(c.decoder_block.as_str(), decoder_block);
            let model = Model::from_config(&c).unwrap_or_else(|e| panic!("{block} {args:?}: {e:#}"));
            if (decoder_block, scan) == ("gemma4", "true") {
                assert!(nnx_aux(&model, 7).is_none(), "{block} scan_layers={scan}");
                continue;
            }
            let leaves = nnx_aux(&model, 7).unwrap_or_else(|| panic!("{block}: no streams"));
            let got: BTreeMap<String, serde_json::Value> = leaves
                .iter()
                .map(|(path, t, key)| {
                    assert_eq!(t.ty, DType::U32);
                    (path.join("/"), serde_json::json!({"shape": t.dims, "dtype": "uint32", "key": key}))
                })
                .collect();
            let want: BTreeMap<String, serde_json::Value> = want.clone().into_iter().collect();
            assert_eq!(got, want, "{block} scan_layers={scan}");
            compared += got.len();
        }
    }
    assert!(compared > 1000, "{compared}");
}

/// Issue 47, the way back beyond the fixture's scanned llama2: the fixture's model with the keys
/// of a case of tools/maxtext_resume.py `--case` (whose MaxText losses are in `file`). maxrs
/// trains it 2 steps on MaxText's batch, `to_maxtext` converts step 1 with the random streams
/// MaxText's tree has there (`holder` is the module holding its layers' shared ones), and maxrs
/// continued from the converted state has the losses MaxText had resuming from it, the first
/// also MaxText's from the parameters alone.
fn converts_to_what_maxtext_resumes(case: &[&str], file: &str, holder: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut keys: Vec<String> = case.iter().map(|k| k.to_string()).collect();
    keys.extend([format!("dataset_path={}", fixture("maxtext_batch.tokens").display()), "dataset_type=tokens".into()]);
    let at = format!("base_output_directory={}", dir.path().display());
    let save = [at, "run_name=mx".into(), "enable_checkpointing=true".into(), "steps=2".into()];
    run(&[&keys[..], &save[..]].concat()).unwrap();
    let out = dir.path().join("converted");
    let written = to_maxtext(&Location::Local(dir.path().join("mx")), &Location::Local(out.clone()), false).unwrap();
    assert_eq!(written.next_step, Some(2), "{case:?}");
    let ckpt = Checkpoint::open(&Location::Local(out.join("1"))).unwrap();
    let key = format!("nnx_aux/model/{holder}/rngs/dropout/key");
    assert!(ckpt.names().any(|n| n == key), "{case:?}: {key}");

    let json = json_file(&fixture(file));
    let loss = |key: &str, step: u64| json[key][step.to_string()].as_f64().unwrap();
    let state = format!("load_full_state_path={}", out.join("1/items").display());
    let resumed = run(&[&keys[..], &[state, "steps=4".into()]].concat()).unwrap();
    assert_eq!((resumed.first_step, resumed.losses.len()), (2, 2), "{case:?}");
    for (got, step) in resumed.losses.iter().zip(2..) {
        let want = loss("loss_by_step", step);
        assert!((got - want).abs() < 1e-5, "{case:?} step {step}: maxrs {got} vs MaxText {want}");
    }
    let from_params = loss("params_only_loss_by_step", 0);
    let first = resumed.losses[0];
    assert!((first - from_params).abs() < 1e-5, "{case:?}: maxrs {first} vs MaxText {from_params}");
}

/// [`converts_to_what_maxtext_resumes`] unscanned (a module per layer, the decoder's random
/// streams held by layer 0's attention op), as a scanned Mixtral (a MoE block holding each
/// layer's) and as a Gemma 2 (its layer module holding them).
#[test]
fn unscanned_mixtral_and_gemma2_states_convert_to_what_maxtext_resumes() {
    let unscanned = "decoder/layers_0/self_attention/attention_op";
    converts_to_what_maxtext_resumes(&["scan_layers=false"], "to_maxtext_unscanned_losses.json", unscanned);
    let mixtral = [
        "decoder_block=mixtral",
        "num_experts=4",
        "num_experts_per_tok=2",
        "base_moe_mlp_dim=32",
        "sparse_matmul=false",
    ];
    converts_to_what_maxtext_resumes(&mixtral, "to_maxtext_mixtral_losses.json", "decoder/layers/MoeBlock_0");
    let gemma2 = [
        "decoder_block=gemma2",
        "mlp_activations=[gelu,linear]",
        "normalization_layer_epsilon=1e-6",
        "logits_via_embedding=true",
        "final_logits_soft_cap=30.0",
        "attn_logits_soft_cap=50.0",
        "sliding_window_size=8",
        "use_post_attn_norm=true",
        "use_post_ffw_norm=true",
    ];
    converts_to_what_maxtext_resumes(&gemma2, "to_maxtext_gemma2_losses.json", "decoder/layers");
}

/// [`converts_to_what_maxtext_resumes`] with stacks of other shapes: a Gemma 3 of 8 layers (one
/// scanned block of 6 sub-layers, and the remainder block of 2 built outside the scan, holding
/// the decoder's streams) and a DeepSeek (a scanned dense stack and a scanned MoE stack).
#[test]
fn gemma3_and_deepseek_states_convert_to_what_maxtext_resumes() {
    // MaxText's gemma3 scales its queries by its model name's rule: gemma3-4b's file, shrunk.
    let gemma3 =
        ["model_name=gemma3-4b", "override_model_config=true", "base_num_decoder_layers=8", "sliding_window_size=8"];
    converts_to_what_maxtext_resumes(&gemma3, "to_maxtext_gemma3_losses.json", "decoder/layers_remainder/layers_0");
    let deepseek = [
        "decoder_block=deepseek",
        "attention_type=mla",
        "q_lora_rank=8",
        "kv_lora_rank=8",
        "qk_nope_head_dim=8",
        "qk_rope_head_dim=8",
        "v_head_dim=8",
        "num_experts=4",
        "num_experts_per_tok=2",
        "shared_experts=1",
        "base_moe_mlp_dim=32",
        "first_num_dense_layers=1",
        "routed_score_func=sigmoid",
        "routed_bias=true",
        "sparse_matmul=false",
    ];
    let holder = "decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0";
    converts_to_what_maxtext_resumes(&deepseek, "to_maxtext_deepseek_losses.json", holder);
}
