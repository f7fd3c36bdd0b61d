use maxrs::pjrt::*;
use std::sync::Arc;

fn client(n: i64) -> Client {
    let path = std::env::var("MAXRS_PJRT_PLUGIN").unwrap();
    let plugin = Plugin::load(std::path::Path::new(&path)).unwrap();
    Client::create(&plugin, &[("cpu_device_count".into(), Value::I64(n))], None).unwrap()
}

#[test]
fn smoke() {
    let t = std::time::Instant::now();
    let c = client(8);
    eprintln!("create {:?}", t.elapsed());
    eprintln!("{} {} {:?}", c.platform_name().unwrap(), c.platform_version().unwrap(), c.plugin().api_version());
    eprintln!("{:?}", c.plugin().attributes().unwrap());
    let devs = c.addressable_devices().unwrap();
    eprintln!("{:?} {:?}", devs, devs[0].attributes);
    eprintln!("mem {:?}", devs[0].memory_stats());
    let mlir = r#"
sdy.mesh @mesh = <["x"=8]>
func.func @main(%a: tensor<16x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %b: tensor<16x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>, tf.aliasing_output = 0 : i32}) -> (tensor<16x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, tensor<f32>) {
  %0 = stablehlo.add %a, %b : tensor<16x4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<16x4xf32>, tensor<f32>) -> tensor<f32>
  return %0, %s : tensor<16x4xf32>, tensor<f32>
}
"#;
    let t = std::time::Instant::now();
    let exe = c.compile(mlir, &CompileOptions::spmd(8)).unwrap();
    eprintln!("compile {:?}", t.elapsed());
    eprintln!("sig {:?}", exe.signature());
    eprintln!("stats {:?}", exe.executable().compiled_memory_stats());
    eprintln!("fp {:?}", exe.executable().fingerprint());
    eprintln!("cost {:?}", exe.executable().cost_analysis().map(|c| c.map(|v| v.len())));
    let devs = exe.addressable_devices().to_vec();
    let a: Vec<Buffer> = devs.iter().enumerate().map(|(i, d)| c.to_device(&HostTensor::from_f32(&[2, 4], &[i as f32; 8]), d).unwrap()).collect();
    let b: Vec<Buffer> = devs.iter().map(|d| c.to_device(&HostTensor::from_f32(&[2, 4], &[1.0; 8]), d).unwrap()).collect();
    let t = std::time::Instant::now();
    let out = exe.execute(&a.iter().zip(&b).map(|(x, y)| vec![x, y]).collect::<Vec<_>>()).unwrap();
    eprintln!("execute {:?}", t.elapsed());
    eprintln!("{:?} {:?} donated={:?}", out[3][0].to_host().unwrap().to_f32(), out[0][1].to_host().unwrap().to_f32(), b[0].is_deleted());
    let bytes = exe.executable().serialize().unwrap();
    eprintln!("serialized {} bytes", bytes.len());
    let exe2 = c.deserialize(&bytes).unwrap();
    eprintln!("sig2 {:?}", exe2.signature());
    let _ = Arc::new(0);
}
