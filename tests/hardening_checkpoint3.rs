//! Issue 42's checkpoint and conversion cases: a manifest naming files outside its checkpoint's
//! folder, slices that overlap or leave a gap, an fp8 run's scaling state dropped on resume,
//! `checkpoint-check --verify-only` with nothing to verify, integer tensors converted as
//! weights, float16 overflow and NaN/inf weights converted without a word, and a manifest's
//! numbers taken at their word (each was a silent wrong state, a silent success or a panic).
//! The checkpoints are made by the library (`dir::save`, `write_part`) or by
//! `maxrs checkpoint-check`, so no case compiles an XLA program.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use maxrs::checkpoint::dir::{self, manifest_of, write_manifest, write_part, Expected, Share, Snapshot};
use maxrs::checkpoint::shards::HostArray;
use maxrs::checkpoint::tensor_file::{read_safetensors, write_safetensors};
use maxrs::checkpoint::Checkpoints;
use maxrs::files::Location;
use maxrs::host::{block_of, DType, HostTensor};
use serde_json::json;

use crate::common::cli::{maxrs, refused};

/// `params.w` `[512, 4]`, every value the step (so a restore shows which step's bytes it read),
/// and the optimizer's count.
fn state(step: u64) -> Vec<(String, HostTensor)> {
    vec![
        ("params.w".to_string(), HostTensor::from_f32(&[512, 4], &[step as f32; 2048])),
        ("opt_state.count".to_string(), HostTensor::from_i32(&[], &[step as i32 + 1])),
    ]
}

fn expected() -> Vec<Expected> {
    state(0).into_iter().map(|(name, t)| Expected { name, ty: t.ty, dims: t.dims }).collect()
}

/// Saves the state after `step` into `ckpts/<step>`, as a run's checkpoint.
fn save_step(ckpts: &Path, step: u64) {
    let snapshot = Snapshot {
        step: Some(step),
        arrays: state(step),
        model: BTreeMap::new(),
        data: Some(json!({"next_step": step + 1})),
    };
    dir::save(&Location::Local(ckpts.join(step.to_string())), &snapshot).unwrap();
}

/// Rewrites the manifest of the checkpoint folder `dir` through `change`.
fn edit_manifest(dir: &Path, change: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    change(&mut manifest);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

/// Why the checkpoint folder `dir` does not restore `expected()`, on one line.
fn refusal(dir: &Path) -> String {
    let e = dir::load(&Location::Local(dir.to_path_buf()), &expected(), &BTreeMap::new(), false).err();
    let e = format!("{:#}", e.expect("the checkpoint must be refused"));
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

/// Step 3's manifest replaced by step 2's, edited to step 3 and with every file name passed
/// through `name`: a consistent manifest (sizes, checksums) whose files are step 2's.
fn step_3_reads_step_2(ckpts: &Path, name: impl Fn(&str) -> String) {
    std::fs::copy(ckpts.join("2/manifest.json"), ckpts.join("3/manifest.json")).unwrap();
    edit_manifest(&ckpts.join("3"), |m| {
        m["step"] = 3.into();
        m["data"]["next_step"] = 4.into();
        for file in m["files"].as_array_mut().unwrap() {
            file["name"] = name(file["name"].as_str().unwrap()).into();
        }
        for array in m["arrays"].as_array_mut().unwrap() {
            for slice in array["slices"].as_array_mut().unwrap() {
                slice["file"] = name(slice["file"].as_str().unwrap()).into();
            }
        }
    });
}

#[test]
fn a_manifest_cannot_name_files_outside_its_checkpoint_folder() {
    let base = tempfile::tempdir().unwrap();
    let ckpts = base.path().join("checkpoints");
    save_step(&ckpts, 2);
    save_step(&ckpts, 3);
    let checkpoints = Checkpoints::new(Location::Local(ckpts.clone()));
    let restored = || {
        let loaded = checkpoints.restore_latest(&expected(), &BTreeMap::new()).unwrap().unwrap();
        (loaded.manifest.step, loaded.arrays["params.w"].to_f32()[0])
    };
    assert_eq!(restored(), (Some(3), 3.0));
    let manifest = ckpts.join("3/manifest.json");
    let step_2 = ckpts.join("2").canonicalize().unwrap();
    // Relative and absolute names of step 2's files: refused, naming the manifest and the entry;
    // the run falls back to step 2 itself (it resumed "from step 3" with step 2's bytes).
    for prefix in ["../2/".to_string(), format!("{}/", step_2.display())] {
        step_3_reads_step_2(&ckpts, |f| format!("{prefix}{f}"));
        let shown = format!("{:?}", format!("{prefix}opt_state.safetensors"));
        let e = refusal(&ckpts.join("3"));
        assert!(
            e.starts_with(&format!(
                "{}: files[0].name = {shown}: not a file of the checkpoint folder; a manifest names its files by \
                 plain file names such as params.safetensors",
                manifest.display()
            )),
            "{e}"
        );
        assert_eq!(restored(), (Some(2), 2.0));
    }
    // Plain names, but the file a symlink to step 2's.
    step_3_reads_step_2(&ckpts, |f| f.to_string());
    std::fs::remove_file(ckpts.join("3/params.safetensors")).unwrap();
    std::os::unix::fs::symlink("../2/params.safetensors", ckpts.join("3/params.safetensors")).unwrap();
    let e = refusal(&ckpts.join("3"));
    assert!(
        e.starts_with(&format!(
            "{}: files[1].name = \"params.safetensors\": a symlink to {:?}, outside the checkpoint folder",
            manifest.display(),
            step_2.join("params.safetensors")
        )),
        "{e}"
    );
    assert_eq!(restored(), (Some(2), 2.0));
}

/// A checkpoint of step 3 whose `params.w` is written as two slices, rows 0-255 and 256-511.
fn two_slice_checkpoint(dir: &Path) {
    let w = HostTensor::from_f32(&[512, 4], &(0..2048).map(|i| i as f32).collect::<Vec<_>>());
    let rows = |start: i64| vec![(start, 256), (0, 4)];
    let count = HostTensor::from_i32(&[], &[4]);
    let share = Share {
        step: Some(3),
        arrays: vec![
            HostArray {
                name: "params.w".into(),
                ty: DType::F32,
                dims: vec![512, 4],
                blocks: vec![(rows(0), block_of(&w, &rows(0))), (rows(256), block_of(&w, &rows(256)))],
            },
            HostArray::whole("opt_state.count", count),
        ],
        model: BTreeMap::new(),
        data: Some(json!({"next_step": 4})),
    };
    let at = Location::Local(dir.to_path_buf());
    let part = write_part(&at, &share, 0, 1).unwrap();
    write_manifest(&at, &manifest_of(&share, 1, vec![part]).unwrap()).unwrap();
}

#[test]
fn the_slices_of_an_array_must_tile_it_exactly_on_read() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("3");
    two_slice_checkpoint(&dir);
    let manifest = dir.join("manifest.json");
    let w_slices = |m: &mut serde_json::Value| -> Vec<serde_json::Value> {
        let arrays = m["arrays"].as_array_mut().unwrap();
        let w = arrays.iter_mut().find(|a| a["name"] == "params.w").unwrap();
        w["slices"].as_array().unwrap().clone()
    };
    let set_w_slices = |m: &mut serde_json::Value, slices: Vec<serde_json::Value>| {
        let arrays = m["arrays"].as_array_mut().unwrap();
        arrays.iter_mut().find(|a| a["name"] == "params.w").unwrap()["slices"] = slices.into();
    };
    // Rows 0-255 listed twice, 256-511 nowhere: it restored rows 256-511 as zeros.
    edit_manifest(&dir, |m| {
        let slices = w_slices(m);
        set_w_slices(m, vec![slices[0].clone(), slices[0].clone()]);
    });
    assert_eq!(
        refusal(&dir),
        format!("{}: params.w [512, 4]: the slices [0:256,0:4] and [0:256,0:4] overlap", manifest.display())
    );
    // Rows 256-511 alone left out.
    two_slice_checkpoint(&dir);
    edit_manifest(&dir, |m| {
        let slices = w_slices(m);
        set_w_slices(m, vec![slices[0].clone()]);
    });
    assert_eq!(refusal(&dir), format!("{}: params.w [512, 4]: no slice holds [256:512,0:4]", manifest.display()));
    // Overlapping by half.
    two_slice_checkpoint(&dir);
    edit_manifest(&dir, |m| {
        let mut slices = w_slices(m);
        slices[1]["start"] = json!([128, 0]);
        set_w_slices(m, slices);
    });
    assert_eq!(
        refusal(&dir),
        format!("{}: params.w [512, 4]: the slices [0:256,0:4] and [128:384,0:4] overlap", manifest.display())
    );
}

/// A checkpoint of step 1 holding the state `run` (`quantization=...` over the small model)
/// expects, all zeros.
fn zero_checkpoint(ckpts: &Path, quantization: &str) {
    let c = maxrs::config::load(None, &crate::checkpoint_resume::small(&[quantization])).unwrap();
    let model = maxrs::model::Model::from_config(&c).unwrap();
    let arrays = crate::checkpoint_resume::state_expected(&c)
        .into_iter()
        .map(|e| (e.name, HostTensor::zeros(e.ty, &e.dims)))
        .collect();
    let snapshot =
        Snapshot { step: Some(1), arrays, model: maxrs::checkpoint::manifest::model_keys(&c, &model), data: None };
    dir::save(&Location::Local(ckpts.join("1")), &snapshot).unwrap();
}

/// Why a run with `quantization` over the small model does not resume from `ckpts`.
fn resume_refusal(ckpts: &Path, quantization: &str) -> String {
    let c = maxrs::config::load(None, &crate::checkpoint_resume::small(&[quantization])).unwrap();
    let model = maxrs::checkpoint::manifest::model_keys(&c, &maxrs::model::Model::from_config(&c).unwrap());
    let checkpoints = Checkpoints::new(Location::Local(ckpts.to_path_buf()));
    let e = checkpoints.restore_latest(&crate::checkpoint_resume::state_expected(&c), &model).err();
    format!("{:#}", e.unwrap_or_else(|| panic!("{quantization}: the resume must be refused")))
}

#[test]
fn resuming_across_fp8_and_other_quantizations_is_refused_naming_both() {
    let base = tempfile::tempdir().unwrap();
    let fp8 = base.path().join("fp8");
    zero_checkpoint(&fp8, "quantization=fp8");
    // Without fp8 the run would drop the 42 arrays of scales and amax histories.
    for run in ["quantization=", "quantization=te_fp8_currentscaling"] {
        let e = resume_refusal(&fp8, run);
        assert!(
            e.contains(&format!(
                "checkpoint {} does not fit this run: it holds quantization=fp8's scaling state (42 arrays \
                 fp8.…), which this run (quantization is not fp8) would drop: resume with quantization=fp8, or start \
                 another run_name from its parameters (load_parameters_path)",
                fp8.join("1").display()
            )),
            "{run}: {e}"
        );
    }
    // The reverse: an fp8 run from a checkpoint without the state it needs.
    let plain = base.path().join("plain");
    zero_checkpoint(&plain, "quantization=");
    let e = resume_refusal(&plain, "quantization=fp8");
    assert!(
        e.contains(
            "does not fit this run: it holds no fp8 scaling state (it was saved without quantization=fp8), which \
             this run (quantization=fp8) needs (42 arrays fp8.…): resume without quantization=fp8 (or with \
             te_fp8_currentscaling, which keeps no state), or start another run_name from its parameters \
             (load_parameters_path)"
        ),
        "{e}"
    );
}

/// `maxrs checkpoint-check` in `base` (run `r`, one process of 4 devices) with `extra`.
fn checkpoint_check(base: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "checkpoint-check".to_string(),
        format!("base_output_directory={}", base.display()),
        "run_name=r".into(),
        "--step-ms=0".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn checkpoint_check_verify_only_fails_without_a_checkpoint() {
    let base = tempfile::tempdir().unwrap();
    let ckpts = base.path().join("r/checkpoints");
    let e = refused(&strs(&checkpoint_check(base.path(), &["--verify-only"])), &[]);
    assert_eq!(
        e,
        format!(
            "error: --verify-only: no checkpoint in {} to verify (committed step folders such as {}/3 with a \
             manifest.json, as checkpoint-check saves them for this base_output_directory and run_name)",
            ckpts.display(),
            ckpts.display()
        )
    );
    // With one it verifies and succeeds.
    let out = maxrs(&strs(&checkpoint_check(base.path(), &["steps=2", "checkpoint_period=1"])), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = maxrs(&strs(&checkpoint_check(base.path(), &["--verify-only"])), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("restored the checkpoint of step 1"));
}

/// The worst numbers a manifest can give (checked against a `checkpoint-check` checkpoint): a
/// slice as long as `i64::MAX` panicked in debug builds (an overflow) and wrapped in release
/// ones; one of another rank, or a repeated array entry read as something else than what was
/// checked. Each is now refused as the manifest is read, naming the entry.
#[test]
fn a_manifests_numbers_are_checked_before_they_are_used() {
    let base = tempfile::tempdir().unwrap();
    let out = maxrs(&strs(&checkpoint_check(base.path(), &["steps=1", "checkpoint_period=1"])), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = base.path().join("r/checkpoints/0");
    let original = std::fs::read(dir.join("manifest.json")).unwrap();
    let verify = |change: &dyn Fn(&mut serde_json::Value)| {
        std::fs::write(dir.join("manifest.json"), &original).unwrap();
        edit_manifest(&dir, change);
        let e = refused(&strs(&checkpoint_check(base.path(), &["--verify-only"])), &[]);
        // A refused checkpoint is one of "none of the 1 checkpoints can be restored".
        let prefix =
            format!("error: {}: none of the 1 checkpoints can be restored (step 0: ", dir.parent().unwrap().display());
        assert!(e.starts_with(&prefix), "{e}");
        e[prefix.len()..].to_string()
    };
    let manifest = format!("{}", dir.join("manifest.json").display());
    let embedding = "params.token_embedder.embedding [128, 64]";
    fn first_slice(m: &mut serde_json::Value) -> &mut serde_json::Value {
        let arrays = m["arrays"].as_array_mut().unwrap();
        let e = arrays.iter_mut().find(|a| a["name"] == "params.token_embedder.embedding").unwrap();
        &mut e["slices"][0]
    }
    let e = verify(&|m| first_slice(m)["shape"] = json!([i64::MAX, 64]));
    assert!(
        e.starts_with(&format!("{manifest}: {embedding}: the slice [0:{},0:64] lies outside the array", i64::MAX)),
        "{e}"
    );
    let e = verify(&|m| first_slice(m)["start"] = json!([-32, 0]));
    assert!(e.starts_with(&format!("{manifest}: {embedding}: the slice [-32:0,0:64] lies outside the array")), "{e}");
    let e = verify(&|m| {
        first_slice(m)["start"] = json!([0]);
        first_slice(m)["shape"] = json!([32]);
    });
    assert!(e.starts_with(&format!("{manifest}: {embedding}: the slice [0:32] has 1 dimensions, the array 2")), "{e}");
    let e = verify(&|m| {
        let arrays = m["arrays"].as_array_mut().unwrap();
        let mut twice = arrays[0].clone();
        twice["shape"] = json!([1i64 << 40, 1i64 << 40]);
        arrays.push(twice);
    });
    assert!(e.starts_with(&format!("{manifest}: arrays[6]: params.token_embedder.embedding is listed twice")), "{e}");
    let e = verify(&|m| first_slice(m)["file"] = "other.safetensors".into());
    assert!(
        e.starts_with(&format!(
            "{manifest}: {embedding}: slices[0].file = \"other.safetensors\" is not one of the manifest's files"
        )),
        "{e}"
    );
}

/// A Hugging Face checkpoint in `root/hf` (the small Llama of tests/convert_hf.rs, two shards)
/// with `change` applied to its tensors' values first.
fn hf_checkpoint(root: &Path, change: impl FnOnce(&mut BTreeMap<String, (Vec<usize>, Vec<f32>)>)) -> PathBuf {
    let hf = root.join("hf");
    let mut tensors = crate::convert_hf::random_checkpoint(42);
    change(&mut tensors);
    crate::convert_hf::write_hf(&hf, &tensors, false);
    hf
}

/// Rewrites the tensor `name` of the safetensors file `path` through `change`.
fn rewrite_tensor(path: &Path, name: &str, change: impl FnOnce(HostTensor) -> HostTensor) {
    let mut file = read_safetensors(&mut std::fs::File::open(path).unwrap(), "test").unwrap();
    let t = file.tensors.remove(name).unwrap();
    file.tensors.insert(name.to_string(), change(t));
    let list: Vec<(&str, &HostTensor)> = file.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    write_safetensors(&mut std::fs::File::create(path).unwrap(), &list, &file.metadata).unwrap();
}

/// The shard of the Hugging Face checkpoint `hf` holding `name`.
fn shard_of(hf: &Path, name: &str) -> PathBuf {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("model.safetensors.index.json")).unwrap()).unwrap();
    hf.join(index["weight_map"][name].as_str().unwrap())
}

#[test]
fn integer_tensors_are_not_converted_as_weights() {
    let root = tempfile::tempdir().unwrap();
    let hf = hf_checkpoint(root.path(), |_| {});
    let name = "model.layers.0.input_layernorm.weight";
    let shard = shard_of(&hf, name);
    for (ty, dtype) in [(DType::S32, "I32"), (DType::Pred, "BOOL"), (DType::S64, "I64")] {
        rewrite_tensor(&shard, name, |t| HostTensor::zeros(ty, &t.dims));
        let out = root.path().join("out");
        let e = refused(&["convert", "from-hf", hf.to_str().unwrap(), out.to_str().unwrap()], &[]);
        assert_eq!(
            e,
            format!(
                "error: {}: tensor {name} is {dtype} [64]: maxrs converts weights stored as F16, BF16 or F32",
                shard.display()
            )
        );
        assert!(!out.exists());
    }
}

/// `maxrs convert args`, which must succeed; its stderr.
fn convert_ok(args: &[&str]) -> String {
    let out = maxrs(&[&["convert"], args].concat(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "convert {args:?}: {stderr}");
    stderr
}

#[test]
fn float16_conversions_refuse_values_beyond_its_range() {
    let root = tempfile::tempdir().unwrap();
    let name = "model.layers.1.mlp.down_proj.weight";
    let hf = hf_checkpoint(root.path(), |t| {
        let values = &mut t.get_mut(name).unwrap().1;
        values[3] = -70000.0;
        values[5] = 65519.0; // rounds to float16's largest, 65504
    });
    let ours = root.path().join("ours");
    convert_ok(&["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap()]);
    let back = root.path().join("back");
    let e = refused(&["convert", "to-hf", ours.to_str().unwrap(), back.to_str().unwrap(), "--dtype", "float16"], &[]);
    // Named as maxrs's parameter (the layers stacked: model.layers.*.mlp.down_proj.weight).
    let want = "error: converting to float16: decoder.layers.mlp.wo.kernel holds values up to 70000 in magnitude, \
                beyond float16's largest 65504 (they would become inf): convert with --dtype bfloat16 or float32";
    assert_eq!(e, want);
    assert!(!back.exists());
    // The same from Hugging Face's side.
    let half = root.path().join("half");
    let e = refused(&["convert", "from-hf", hf.to_str().unwrap(), half.to_str().unwrap(), "--dtype", "float16"], &[]);
    assert_eq!(e, want);
    assert!(!half.exists());
    // bfloat16 holds them.
    convert_ok(&["to-hf", ours.to_str().unwrap(), back.to_str().unwrap(), "--dtype", "bfloat16"]);
}

#[test]
fn nan_and_infinite_weights_are_converted_with_a_warning_naming_them() {
    let root = tempfile::tempdir().unwrap();
    let name = "model.layers.0.self_attn.q_proj.weight";
    let hf = hf_checkpoint(root.path(), |t| {
        let values = &mut t.get_mut(name).unwrap().1;
        values[..3].fill(f32::NAN);
        values[7] = f32::INFINITY;
    });
    // Named as maxrs's parameter (model.layers.*.self_attn.q_proj.weight, stacked), once each way.
    let warning = "decoder.layers.self_attention.query.kernel holds 3 NaN and 1 infinite values, converted as they are";
    let ours = root.path().join("ours");
    let back = root.path().join("back");
    for args in [
        ["from-hf", hf.to_str().unwrap(), ours.to_str().unwrap()],
        ["to-hf", ours.to_str().unwrap(), back.to_str().unwrap()],
    ] {
        let stderr = convert_ok(&args);
        assert!(stderr.contains(warning), "{args:?}: {stderr}");
        assert_eq!(stderr.matches("converted as they are").count(), 1, "{args:?}: {stderr}");
    }
}
