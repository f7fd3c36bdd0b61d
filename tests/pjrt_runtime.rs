//! The PJRT runtime against the real CPU plugin: SPMD over 8 devices, serialization,
//! transfers of every element type, donation, and the errors maxrs raises before the plugin.

use half::bf16;
use maxrs::host::{DType, HostTensor};
use maxrs::pjrt::{cpu_client, Buffer, Client, CompileOptions, Error, LoadedExecutable};

/// `a * b + 1` on a [16, 4] array sharded by rows over 8 devices, plus the sum of all elements
/// (which needs a cross-device all-reduce). `b` is donated to the first output.
const SHARDED_MLIR: &str = r#"
sdy.mesh @mesh = <["x"=8]>
func.func @main(%a: tensor<16x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>},
                %b: tensor<16x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>, tf.aliasing_output = 0 : i32})
    -> (tensor<16x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, tensor<f32>) {
  %one = stablehlo.constant dense<1.0> : tensor<16x4xf32>
  %0 = stablehlo.multiply %a, %b : tensor<16x4xf32>
  %1 = stablehlo.add %0, %one : tensor<16x4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
  return %1, %s : tensor<16x4xf32>, tensor<f32>
}
"#;

fn global_inputs() -> (Vec<f32>, Vec<f32>) {
    let a: Vec<f32> = (0..64).map(|i| (i as f32) * 0.25 - 3.0).collect();
    let b: Vec<f32> = (0..64).map(|i| ((i * 7 % 11) as f32) - 4.5).collect();
    (a, b)
}

/// Rows 2d..2d+2 of a [16, 4] array: device d's shard.
fn shard(values: &[f32], d: usize) -> HostTensor {
    HostTensor::from_f32(&[2, 4], &values[d * 8..(d + 1) * 8])
}

fn run_sharded(client: &Client, exe: &LoadedExecutable) -> (Vec<f32>, f32) {
    let (a, b) = global_inputs();
    let devices = exe.addressable_devices();
    let upload = |values: &[f32]| -> Vec<Buffer> {
        devices.iter().enumerate().map(|(d, dev)| client.to_device(&shard(values, d), dev).unwrap()).collect()
    };
    let (a_bufs, b_bufs) = (upload(&a), upload(&b));
    let args: Vec<Vec<&Buffer>> = a_bufs.iter().zip(&b_bufs).map(|(x, y)| vec![x, y]).collect();
    let outputs = exe.execute(&args).unwrap();
    assert_eq!(outputs.len(), 8);
    let mut gathered = Vec::new();
    for device_outputs in &outputs {
        gathered.extend(device_outputs[0].to_host().unwrap().to_f32());
    }
    let total = outputs[5][1].to_host().unwrap().to_f32()[0];
    (gathered, total)
}

fn expected() -> (Vec<f32>, f32) {
    let (a, b) = global_inputs();
    let out: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y + 1.0).collect();
    let total = out.iter().sum();
    (out, total)
}

#[test]
fn sharded_program_runs_on_eight_devices() {
    let client = cpu_client(8).unwrap();
    assert_eq!(client.addressable_devices().unwrap().len(), 8);
    let exe = client.compile(SHARDED_MLIR, &CompileOptions::spmd(8)).unwrap();
    // Per-device signature: each device holds 2 of the 16 rows.
    assert_eq!(exe.signature().unwrap().parameters, vec![(DType::F32, vec![2, 4]); 2]);
    let (out, total) = run_sharded(&client, &exe);
    let (want, want_total) = expected();
    assert_eq!(out, want);
    assert!((total - want_total).abs() < 1e-3, "{total} vs {want_total}");
}

#[test]
fn serialized_executable_gives_the_same_result() {
    let client = cpu_client(8).unwrap();
    // Compiled past the compilation cache, as an executable that is serialized again must be
    // (`pjrt::compile_cache`): once another test of the process has configured the cache, a
    // `compile` can load this module from an earlier run's entry, and a CPU executable loaded from
    // its bytes does not serialize whole again (the copy then fails with "Function
    // broadcast_add_fusion not found", seen in full-suite reruns over a warm cache, never alone).
    let exe = client.compile_uncached(SHARDED_MLIR, &CompileOptions::spmd(8)).unwrap();
    let bytes = exe.executable().serialize().unwrap();
    assert!(!bytes.is_empty());
    let reloaded = client.deserialize(&bytes).unwrap();
    assert_eq!(reloaded.signature().unwrap(), exe.signature().unwrap());
    assert_eq!(run_sharded(&client, &reloaded), run_sharded(&client, &exe));
}

#[test]
fn donated_argument_is_consumed_and_others_survive() {
    let client = cpu_client(8).unwrap();
    let exe = client.compile(SHARDED_MLIR, &CompileOptions::spmd(8)).unwrap();
    let stats = exe.executable().compiled_memory_stats().unwrap();
    assert_eq!(stats.alias_bytes, 2 * 4 * 4, "b's shard aliases the first output");
    let devices = exe.addressable_devices();
    let (a, b) = global_inputs();
    let a_bufs: Vec<Buffer> =
        devices.iter().enumerate().map(|(d, dev)| client.to_device(&shard(&a, d), dev).unwrap()).collect();
    let b_bufs: Vec<Buffer> =
        devices.iter().enumerate().map(|(d, dev)| client.to_device(&shard(&b, d), dev).unwrap()).collect();
    let args: Vec<Vec<&Buffer>> = a_bufs.iter().zip(&b_bufs).map(|(x, y)| vec![x, y]).collect();
    exe.execute(&args).unwrap();
    assert!(b_bufs.iter().all(|b| b.is_deleted().unwrap()));
    assert!(a_bufs.iter().all(|a| !a.is_deleted().unwrap()));
    assert_eq!(a_bufs[3].to_host().unwrap(), shard(&a, 3));
}

#[test]
fn every_element_type_round_trips_through_a_device() {
    let client = cpu_client(1).unwrap();
    let device = &client.addressable_devices().unwrap()[0];
    let tensors = [
        HostTensor::from_f32(&[2, 3], &[1.5, -2.0, 3.25, 0.0, 1e-3, -7.0]),
        HostTensor::from_f64(&[3], &[1.0 / 3.0, -2.5e100, 4.0]),
        HostTensor::from_bf16(
            &[2, 2],
            &[bf16::from_f32(1.5), bf16::from_f32(-0.375), bf16::from_f32(256.0), bf16::from_f32(3e-3)],
        ),
        HostTensor::from_f16(&[2], &[half::f16::from_f32(0.5), half::f16::from_f32(-65504.0)]),
        HostTensor::from_i8(&[3], &[-128, 0, 127]),
        HostTensor::from_i32(&[2], &[i32::MIN, 42]),
        HostTensor::from_i64(&[2], &[i64::MAX, -1]),
        HostTensor::from_u8(&[2], &[0, 255]),
        HostTensor::from_u32(&[2], &[u32::MAX, 7]),
        HostTensor::from_bool(&[3], &[true, false, true]),
        HostTensor::from_f32(&[], &[9.0]),
    ];
    for tensor in tensors {
        let buffer = client.to_device(&tensor, device).unwrap();
        assert_eq!(buffer.element_type().unwrap(), tensor.ty);
        assert_eq!(buffer.dims().unwrap(), tensor.dims);
        assert_eq!(buffer.to_host().unwrap(), tensor, "{}", tensor.shape_string());
    }
}

#[test]
fn bf16_program_computes_in_bf16() {
    let client = cpu_client(1).unwrap();
    let mlir = r#"
func.func @main(%x: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = stablehlo.add %x, %x : tensor<4xbf16>
  return %0 : tensor<4xbf16>
}"#;
    let exe = client.compile(mlir, &CompileOptions::single_device()).unwrap();
    let values: Vec<bf16> = [1.0f32, -0.5, 3.0, 1.0e-2].iter().map(|&v| bf16::from_f32(v)).collect();
    let out = exe.execute_host(&[HostTensor::from_bf16(&[4], &values)]).unwrap();
    assert_eq!(out[0].ty, DType::BF16);
    let want: Vec<f32> = values.iter().map(|v| (*v + *v).to_f32()).collect();
    assert_eq!(out[0].to_f32(), want);
}

#[test]
fn malformed_mlir_reports_the_plugins_message() {
    let client = cpu_client(1).unwrap();
    let error = client
        .compile(
            "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { %0 = stablehlo.bogus %x : tensor<4xf32> return %0 }",
            &CompileOptions::single_device(),
        )
        .err()
        .expect("malformed MLIR must not compile");
    match &error {
        Error::Plugin { function, message, .. } => {
            assert_eq!(*function, "PJRT_Client_Compile");
            assert!(message.contains("bogus"), "plugin message should name the bad op: {message}");
        }
        other => panic!("expected the plugin's error, got {other:?}"),
    }
}

#[test]
fn wrong_arguments_are_refused_before_the_plugin() {
    let client = cpu_client(1).unwrap();
    let mlir = r#"
func.func @main(%x: tensor<2x3xf32>, %y: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.subtract %x, %y : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}"#;
    let exe = client.compile(mlir, &CompileOptions::single_device()).unwrap();
    let ok = HostTensor::from_f32(&[2, 3], &[1.0; 6]);
    let invalid = |args: &[HostTensor]| match exe.execute_host(args) {
        Err(Error::InvalidArgument(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let count = invalid(std::slice::from_ref(&ok));
    assert!(count.contains("takes 2 arguments") && count.contains("got 1"), "{count}");
    let shape = invalid(&[ok.clone(), HostTensor::from_f32(&[3, 2], &[1.0; 6])]);
    assert!(shape.contains("argument 1") && shape.contains("f32[2,3]") && shape.contains("f32[3,2]"), "{shape}");
    let dtype = invalid(&[HostTensor::from_f64(&[2, 3], &[1.0; 6]), ok.clone()]);
    assert!(dtype.contains("argument 0") && dtype.contains("f64[2,3]"), "{dtype}");
    let out = exe.execute_host(&[ok.clone(), HostTensor::from_f32(&[2, 3], &[0.5; 6])]).unwrap();
    assert_eq!(out[0].to_f32(), vec![0.5; 6]);
}

#[test]
fn host_data_must_match_its_shape() {
    let client = cpu_client(1).unwrap();
    let device = &client.addressable_devices().unwrap()[0];
    let err = client.bytes_to_device(&[0u8; 12], DType::F32, &[2, 2], device).err().unwrap();
    assert!(err.to_string().contains("12 bytes") && err.to_string().contains("f32[2,2]"), "{err}");
}
