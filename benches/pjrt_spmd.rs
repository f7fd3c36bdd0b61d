//! Start-up cost of the PJRT runtime on the CPU plugin: plugin load, client creation, compile and
//! execute of a small 8-device SPMD program. Prints medians over repeated runs.
//!
//! `cargo bench --bench pjrt_spmd`

use std::time::{Duration, Instant};

use maxrs::pjrt::{load_plugin, Buffer, Client, CompileOptions, Value};

use maxrs::host::HostTensor;

const MLIR: &str = r#"
sdy.mesh @mesh = <["x"=8]>
func.func @main(%a: tensor<1024x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>},
                %w: tensor<256x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>})
    -> (tensor<1024x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, tensor<f32>) {
  %0 = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : (tensor<1024x256xf32>, tensor<256x256xf32>) -> tensor<1024x256xf32>
  %1 = stablehlo.tanh %0 : tensor<1024x256xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<1024x256xf32>, tensor<f32>) -> tensor<f32>
  return %1, %s : tensor<1024x256xf32>, tensor<f32>
}
"#;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() -> anyhow::Result<()> {
    std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    let start = Instant::now();
    let (_, plugin) = load_plugin(Some("cpu"))?;
    let load = start.elapsed();

    let runs = 7;
    let options = [("cpu_device_count".to_string(), Value::I64(8))];
    let mut creates = Vec::new();
    let mut client = None;
    for _ in 0..runs {
        let t = Instant::now();
        let c = Client::create(&plugin, &options, None)?;
        creates.push(t.elapsed());
        client = Some(c);
    }
    let client: Client = client.unwrap();

    let mut compiles = Vec::new();
    let mut exe = None;
    for _ in 0..runs {
        let t = Instant::now();
        exe = Some(client.compile(MLIR, &CompileOptions::spmd(8))?);
        compiles.push(t.elapsed());
    }
    let exe = exe.unwrap();
    let devices = exe.addressable_devices();
    let a: Vec<Buffer> = devices
        .iter()
        .map(|d| client.to_device(&HostTensor::from_f32(&[128, 256], &vec![0.01; 128 * 256]), d))
        .collect::<Result<_, _>>()?;
    let w: Vec<Buffer> = devices
        .iter()
        .map(|d| client.to_device(&HostTensor::from_f32(&[256, 256], &vec![0.02; 256 * 256]), d))
        .collect::<Result<_, _>>()?;
    let args: Vec<Vec<&Buffer>> = a.iter().zip(&w).map(|(x, y)| vec![x, y]).collect();
    let mut executes = Vec::new();
    for _ in 0..runs * 3 {
        let t = Instant::now();
        let out = exe.execute(&args)?;
        executes.push(t.elapsed());
        drop(out);
    }
    let bytes = exe.executable().serialize()?;
    let mut loads = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        drop(client.deserialize(&bytes)?);
        loads.push(t.elapsed());
    }

    println!("CPU plugin, 8 devices, [1024,256] x [256,256] matmul + tanh + sum, sharded by rows");
    println!("| step | median |");
    println!("|---|---|");
    println!("| plugin load + initialize (once) | {} |", ms(load));
    println!("| client create | {} |", ms(median(creates)));
    println!("| compile (SPMD, Shardy) | {} |", ms(median(compiles)));
    println!("| execute (8 devices) | {} |", ms(median(executes)));
    println!("| deserialize + load ({} bytes) | {} |", bytes.len(), ms(median(loads)));
    Ok(())
}
