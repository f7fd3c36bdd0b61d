//! Fuzzing the readers of untrusted bytes with proptest: config YAML and `key=value` text, the
//! compiled-train-step file (AOT header), the token file reader, the safetensors parameter
//! reader and MaxText's Orbax checkpoints (OCDBT manifest, B+tree and zarr chunk bytes, the
//! PyTree metadata). Each gets arbitrary bytes and small mutations of a valid input (bit flips,
//! truncation, splices), and must answer with a value or an error, never a panic.
//!
//! CI runs `CASES` cases per target (seeded, so a run is reproducible); set `PROPTEST_CASES`
//! for a longer local run, e.g. `PROPTEST_CASES=100000 cargo test --release --test fuzz`.
//! A failing case is saved under `proptest-regressions/` and replayed first next time.

use std::path::Path;

use maxrs::checkpoint::orbax::Checkpoint;
use maxrs::config;
use maxrs::data::tokens::TokensBatches;
use maxrs::data::TokensFile;
use maxrs::files::Location;
use maxrs::host::params_io::{load_parameters, save_safetensors, ParamSpec, Params};
use maxrs::host::{DType, HostTensor};
use maxrs::runtime::artifact::{self, ArtifactHeader};
use proptest::prelude::*;

/// Cases per target in CI: all the targets together take seconds in a debug build.
const CASES: u32 = 256;

fn cases() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(CASES);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// A mutation of `valid`: flip bits, truncate, or overwrite a span with arbitrary bytes.
fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len();
    prop_oneof![
        prop::collection::vec(0..len * 8, 1..8).prop_map({
            let valid = valid.clone();
            move |bits| {
                let mut bytes = valid.clone();
                for bit in bits {
                    bytes[bit / 8] ^= 1 << (bit % 8);
                }
                bytes
            }
        }),
        (0..len).prop_map({
            let valid = valid.clone();
            move |n| valid[..n].to_vec()
        }),
        (0..len, prop::collection::vec(any::<u8>(), 1..16)).prop_map(move |(at, patch)| {
            let mut bytes = valid.clone();
            for (i, b) in patch.into_iter().enumerate() {
                if let Some(slot) = bytes.get_mut(at + i) {
                    *slot = b;
                }
            }
            bytes
        }),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// YAML made of real keys with arbitrary values, plus plain arbitrary text.
fn yaml_text() -> impl Strategy<Value = String> {
    let keys: Vec<String> = config::key_names().map(String::from).collect();
    let value = prop_oneof![
        "[-+]?[0-9]{0,40}(\\.[0-9]*)?([eE][-+]?[0-9]{1,4})?",
        Just(".inf".to_string()),
        Just(".nan".to_string()),
        Just("-.inf".to_string()),
        Just("~".to_string()),
        Just("[[a, [b]], c]".to_string()),
        "[a-z_ \\[\\],:'\"{}&*!|>-]{0,24}",
    ];
    let line = (prop::sample::select(keys), value).prop_map(|(k, v)| format!("{k}: {v}"));
    prop_oneof![prop::collection::vec(line, 0..6).prop_map(|lines| lines.join("\n")), any::<String>(),]
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn config_yaml_never_panics(text in yaml_text()) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "fuzz.yml", text.as_bytes());
        if let Ok(c) = config::load(Some(&path), &[]) {
            if config::check(&c).is_ok() {
                let _ = config::validate(&c, 8, 1);
            }
        }
    }

    #[test]
    fn config_arguments_never_panic(args in prop::collection::vec("[a-z_]{1,30}=[-+0-9a-z_.,\\[\\]' ]{0,30}", 0..4)) {
        let with_real_keys: Vec<String> = args
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let key = config::key_names().nth(a.len() * 7 % config::key_names().count()).unwrap();
                if i % 2 == 0 { format!("{key}={}", a.split_once('=').unwrap().1) } else { a.clone() }
            })
            .collect();
        if let Ok(c) = config::load(None, &with_real_keys) {
            if config::check(&c).is_ok() {
                let _ = config::validate(&c, 4, 2);
            }
        }
    }

    #[test]
    fn aot_file_reader_never_panics(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        mutated(valid_artifact()),
    ]) {
        if let Ok((header, executable)) = artifact::parse(&bytes) {
            // Only an unchanged executable passes the checksum.
            prop_assert_eq!(executable, b"serialized executable".to_vec());
            let _ = header.differences(&sample_header());
        }
    }

    #[test]
    fn token_file_reader_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        seq in prop_oneof![0usize..16, Just(usize::MAX / 2), Just(usize::MAX)],
        vocab in 0u32..70000,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "tokens.bin", &bytes);
        if let Ok(file) = TokensFile::open(&path, seq, vocab) {
            for row in 0..file.num_rows().min(8) {
                let _ = file.row(row);
            }
            let mut batches = TokensBatches::new(file, 2, 0..2, Some(7), 0);
            let _ = batches.next_batch();
        }
    }

    #[test]
    fn safetensors_reader_never_panics(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        mutated(valid_safetensors()),
        safetensors_header_json(),
    ]) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "params.safetensors", &bytes);
        let _ = load_parameters(&path, &expected_params());
    }

    #[test]
    fn orbax_checkpoint_reader_never_panics((file, bytes) in prop_oneof![
        mutated(orbax_file("manifest.ocdbt")).prop_map(|b| ("manifest.ocdbt", b)),
        mutated(orbax_file(ORBAX_DATA)).prop_map(|b| (ORBAX_DATA, b)),
        mutated(orbax_file("_METADATA")).prop_map(|b| ("_METADATA", b)),
    ]) {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&orbax_item(), dir.path());
        std::fs::write(dir.path().join(file), &bytes).unwrap();
        if let Ok(ckpt) = Checkpoint::open(&Location::Local(dir.path().to_path_buf())) {
            let names: Vec<String> = ckpt.names().map(str::to_string).collect();
            for name in names {
                let _ = ckpt.read(&name);
            }
        }
    }
}

/// A MaxText parameter-only checkpoint's item folder (tests/data/orbax/README.md): one data file
/// holds its B+tree nodes and zarr chunks.
fn orbax_item() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orbax/nnx_params/0/items")
}

const ORBAX_DATA: &str = "d/3c2f216ca779fe3ec52aaa09bbdf62f0";

fn orbax_file(name: &str) -> Vec<u8> {
    std::fs::read(orbax_item().join(name)).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn sample_header() -> ArtifactHeader {
    ArtifactHeader {
        maxrs_version: "0.1.0".into(),
        plugin: "pjrt_c_api_cpu_plugin.so (1 bytes, PJRT API 0.81)".into(),
        platform_version: "cpu".into(),
        plugin_build: None,
        topology: "1 host x 8 cpu".into(),
        num_devices: 8,
        config: [("per_device_batch_size".to_string(), "4".to_string())].into_iter().collect(),
        arguments: vec![],
        xla_flags: String::new(),
        program_fingerprint: "0f".into(),
        device_ids_per_host: vec![(0..8).collect()],
        pipeline: None,
        executable_sha256: None,
    }
}

fn valid_artifact() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("step.aot");
    artifact::write(&path, &sample_header(), b"serialized executable").unwrap();
    std::fs::read(path).unwrap()
}

fn expected_params() -> Vec<ParamSpec> {
    vec![
        ParamSpec { name: "w".into(), ty: DType::F32, dims: vec![2, 3] },
        ParamSpec { name: "e".into(), ty: DType::BF16, dims: vec![4] },
    ]
}

fn valid_safetensors() -> Vec<u8> {
    let mut params = Params::new();
    params.insert("w".into(), HostTensor::from_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    params.insert("e".into(), HostTensor::from_f32(&[4], &[0.5, -1.0, 2.0, 0.0]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.safetensors");
    save_safetensors(&path, &params).unwrap();
    std::fs::read(path).unwrap()
}

/// A well-formed length prefix with a JSON header of hostile shapes and offsets.
fn safetensors_header_json() -> impl Strategy<Value = Vec<u8>> {
    let dim = prop_oneof![0u64..8, Just(u64::MAX), Just(1 << 40), Just(u32::MAX as u64)];
    let offset = prop_oneof![0u64..64, Just(u64::MAX), Just(usize::MAX as u64 - 3)];
    let dtype = prop::sample::select(vec!["F32", "BF16", "F16", "F64", "I32", "U8", "BOOL", "F8_E4M3", "X"]);
    (prop::collection::vec(dim, 0..4), dtype, offset.clone(), offset, prop::collection::vec(any::<u8>(), 0..64))
        .prop_map(|(shape, dtype, begin, end, data)| {
            let json = format!(r#"{{"w":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{begin},{end}]}}}}"#);
            let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(json.as_bytes());
            bytes.extend_from_slice(&data);
            bytes
        })
}
