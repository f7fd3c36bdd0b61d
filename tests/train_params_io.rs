//! safetensors round trip, dtype conversion, the one-error listing of every mismatch, and the
//! atomic save.

use std::path::PathBuf;

use half::bf16;
use maxrs::host::params_io::{load_parameters, save_safetensors, ParamSpec, Params, ParamsError};
use maxrs::host::{DType, HostTensor};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("maxrs-train-params-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec(name: &str, ty: DType, dims: &[i64]) -> ParamSpec {
    ParamSpec { name: name.into(), ty, dims: dims.to_vec() }
}

fn params() -> Params {
    let mut p = Params::new();
    p.insert("decoder.layers.mlp.wi_0".into(), HostTensor::from_f32(&[2, 3], &[1.0, -2.5, 3.25, 0.0, 1e-3, 7.0]));
    p.insert(
        "token_embedder.embedding".into(),
        HostTensor::from_bf16(&[2, 2], &[bf16::from_f32(0.5), bf16::ONE, bf16::ZERO, bf16::from_f32(-4.0)]),
    );
    p.insert("step".into(), HostTensor::from_i32(&[], &[7]));
    p
}

fn specs() -> Vec<ParamSpec> {
    vec![
        spec("decoder.layers.mlp.wi_0", DType::F32, &[2, 3]),
        spec("token_embedder.embedding", DType::BF16, &[2, 2]),
        spec("step", DType::S32, &[]),
    ]
}

#[test]
fn round_trip_and_atomic_overwrite() {
    let dir = temp_dir("round");
    let path = dir.join("params.safetensors");
    save_safetensors(&path, &params()).unwrap();
    assert_eq!(load_parameters(&path, &specs()).unwrap(), params());
    // The file is standard safetensors.
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("decoder.layers.mlp.wi_0").unwrap().shape(), [2, 3]);

    // Overwriting leaves no temporary file behind.
    let mut changed = params();
    changed.insert("step".into(), HostTensor::from_i32(&[], &[8]));
    save_safetensors(&path, &changed).unwrap();
    assert_eq!(load_parameters(&path, &specs()).unwrap()["step"].to_i32(), [8]);
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["params.safetensors"]);

    // A failed save (the target is a directory) keeps nothing half-written.
    let target_dir = dir.join("is_a_dir");
    std::fs::create_dir(&target_dir).unwrap();
    let e = save_safetensors(&target_dir, &params()).unwrap_err();
    assert!(matches!(e, ParamsError::Save { .. }), "{e}");
    assert!(e.to_string().contains("is_a_dir"), "{e}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn floats_convert_to_the_expected_dtype() {
    let dir = temp_dir("convert");
    let path = dir.join("p.safetensors");
    save_safetensors(&path, &params()).unwrap();
    let wanted = vec![
        spec("decoder.layers.mlp.wi_0", DType::BF16, &[2, 3]),
        spec("token_embedder.embedding", DType::F64, &[2, 2]),
        spec("step", DType::S32, &[]),
    ];
    let loaded = load_parameters(&path, &wanted).unwrap();
    let wi = &loaded["decoder.layers.mlp.wi_0"];
    assert_eq!(wi.ty, DType::BF16);
    let expected: Vec<f32> = [1.0f32, -2.5, 3.25, 0.0, 1e-3, 7.0].iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    assert_eq!(wi.to_f32(), expected);
    let emb = &loaded["token_embedder.embedding"];
    assert_eq!((emb.ty, emb.to_f64()), (DType::F64, vec![0.5, 1.0, 0.0, -4.0]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_error_lists_every_mismatch() {
    let dir = temp_dir("mismatch");
    let path = dir.join("p.safetensors");
    let mut file_params = params();
    file_params.insert("decoder.extra_bias".into(), HostTensor::from_f32(&[4], &[0.0; 4]));
    save_safetensors(&path, &file_params).unwrap();
    let wanted = vec![
        spec("decoder.layers.mlp.wi_0", DType::F32, &[3, 2]), // wrong shape
        spec("token_embedder.embedding", DType::BF16, &[2, 2]), // fine
        spec("step", DType::F32, &[]),                        // s32 does not convert to f32
        spec("decoder.norm.scale", DType::F32, &[2]),         // missing
    ];
    let e = load_parameters(&path, &wanted).unwrap_err();
    let ParamsError::Mismatch(m) = &e else { panic!("{e}") };
    assert_eq!(m.missing, [("decoder.norm.scale".to_string(), "f32[2]".to_string())]);
    assert_eq!(m.unexpected, [("decoder.extra_bias".to_string(), "f32[4]".to_string())]);
    assert_eq!(
        m.wrong,
        [
            ("decoder.layers.mlp.wi_0".to_string(), "f32[3,2]".to_string(), "f32[2,3]".to_string()),
            ("step".to_string(), "f32[]".to_string(), "s32[]".to_string()),
        ]
    );
    let text = e.to_string();
    for needle in [
        "p.safetensors",
        "missing (1):\n    decoder.norm.scale: expected f32[2]",
        "unexpected (1):\n    decoder.extra_bias: found f32[4]",
        "decoder.layers.mlp.wi_0: expected f32[3,2], found f32[2,3]",
        "step: expected f32[], found s32[]",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unreadable_files_say_why() {
    let dir = temp_dir("bad");
    let e = load_parameters(&dir.join("absent.safetensors"), &specs()).unwrap_err();
    assert!(matches!(e, ParamsError::Input(_)) && e.to_string().contains("absent.safetensors"), "{e}");

    let short = dir.join("short.safetensors");
    std::fs::write(&short, b"abc").unwrap();
    let e = load_parameters(&short, &specs()).unwrap_err();
    assert!(e.to_string().contains("not a safetensors file: 3 bytes"), "{e}");

    let huge_header = dir.join("huge.safetensors");
    std::fs::write(&huge_header, 1000u64.to_le_bytes()).unwrap();
    let e = load_parameters(&huge_header, &specs()).unwrap_err();
    assert!(e.to_string().contains("header length 1000 exceeds the file size 8"), "{e}");

    // A header promising more data than the file holds.
    let truncated = dir.join("truncated.safetensors");
    save_safetensors(&truncated, &params()).unwrap();
    let bytes = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 4]).unwrap();
    let e = load_parameters(&truncated, &specs()).unwrap_err();
    assert!(matches!(e, ParamsError::Format { .. }), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
