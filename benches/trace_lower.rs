//! Benchmark: trace, differentiate and lower the Llama decoder (`maxrs::model`; llama2-7b shapes:
//! emb 4096, 32 heads of 128, mlp 11008, vocab 32000, seq 2048, batch 4; nothing runs) with
//! scan_layers on and off, and print median times and MLIR sizes; then the same for the largest
//! model file of each family (scanned, full remat) with its parameter count. Before timing, a tiny
//! configuration of the same model is compiled and run on the CPU plugin: its initial loss must
//! be close to ln(vocab), so the benchmarked graph is a real, valid program.
//!
//! `cargo bench --bench trace_lower` (optionally `-- <runs>`).

use maxrs::autodiff::value_and_grad_program;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::model::Model;
use maxrs::pjrt::cpu_client;
use maxrs::runtime::run_program;
use maxrs::sharding::Mesh;
use maxrs::tensor::{trace, Tree};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

/// The model for a built-in model name, plus the batch shape.
#[derive(Clone)]
struct Config {
    model: Model,
    seq: i64,
    batch: i64,
}

impl Config {
    fn new(model_name: &str, layers: i64, scan_layers: bool, remat: &str, batch: i64, seq: i64) -> Config {
        let overrides = [
            format!("model_name={model_name}"),
            "override_model_config=true".to_string(),
            format!("base_num_decoder_layers={layers}"),
            format!("scan_layers={scan_layers}"),
            format!("remat_policy={remat}"),
        ];
        let model = Model::from_config(&maxrs::config::load(None, &overrides).expect("built-in config"))
            .expect("the model builds");
        Config { model, seq, batch }
    }

    fn llama2_7b(layers: i64, scan_layers: bool, remat: &str) -> Config {
        Config::new("llama2-7b", layers, scan_layers, remat, 4, 2048)
    }

    /// A model file as it is (plus `extra`), scanned with full remat.
    fn model_file(model_name: &str, extra: &[&str], batch: i64, seq: i64) -> Config {
        let mut overrides =
            vec![format!("model_name={model_name}"), "scan_layers=true".into(), "remat_policy=full".into()];
        overrides.extend(extra.iter().map(|s| s.to_string()));
        let model = Model::from_config(&maxrs::config::load(None, &overrides).expect("built-in config"))
            .expect("the model builds");
        Config { model, seq, batch }
    }
}

fn signature(c: &Config, mesh: Option<Mesh>) -> Signature {
    let mut sig = Signature::new(mesh.clone());
    c.model.declare_params(&mut sig, "params");
    for name in ["inputs", "targets", "targets_segmentation"] {
        let input = sig.input(name, DType::S32, &[c.batch, c.seq]);
        if let Some(m) = &mesh {
            input.sharded(c.model.config.rules.spec(&["activation_batch", "activation_length"], m));
        }
    }
    sig
}

fn loss_program(c: &Config, mesh: Option<Mesh>) -> Program {
    trace(&signature(c, mesh), |_ctx, inp| {
        let (loss, _) = c.model.loss(&inp.subtree("params"), inp, 0.0);
        Tree::new().with("loss", loss)
    })
    .expect("the model traces")
}

fn grad_names(c: &Config) -> Vec<String> {
    c.model.param_defs().into_iter().map(|d| format!("params.{}", d.name)).collect()
}

/// Compiles and runs the tiny default model on the CPU plugin: the initial loss with small
/// random weights is about ln(vocab).
fn sanity_check() {
    for scan_layers in [false, true] {
        let c = Config::new("default", 2, scan_layers, "full", 2, 16);
        let vocab = c.model.config.vocab;
        let names = grad_names(&c);
        let program =
            value_and_grad_program(&loss_program(&c, None), &names.iter().map(String::as_str).collect::<Vec<_>>());
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut inputs = Tree::new();
        for spec in &program.inputs {
            let n = spec.ty.shape.num_elements() as usize;
            let t = match spec.ty.dtype {
                DType::S32 if spec.name == "targets_segmentation" => HostTensor::from_i32(&spec.ty.shape, &vec![1; n]),
                DType::S32 => HostTensor::from_i32(
                    &spec.ty.shape,
                    &(0..n).map(|_| rng.gen_range(0..vocab as i32)).collect::<Vec<_>>(),
                ),
                _ if spec.name.ends_with(".scale") => HostTensor::from_f32(&spec.ty.shape, &vec![1.0; n]),
                _ => HostTensor::from_f32(
                    &spec.ty.shape,
                    &(0..n).map(|_| rng.gen_range(-0.03f32..0.03)).collect::<Vec<_>>(),
                ),
            };
            inputs.insert(spec.name.clone(), t);
        }
        let out = run_program(&cpu_client(1).expect("CPU plugin"), &program, &inputs).expect("the tiny model runs");
        let loss = out["loss"].to_f32()[0];
        assert!((loss - (vocab as f32).ln()).abs() < 0.5, "initial loss {loss}, expected about ln({vocab})");
        println!("sanity: tiny model (scan_layers={scan_layers}) compiles and runs on CPU, initial loss {loss:.3} (ln vocab = {:.3})", (vocab as f32).ln());
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// Median trace, grad, lower and total milliseconds of `runs` runs, the equation counts and the
/// MLIR size.
fn measure(c: &Config, mesh: &Mesh, runs: usize) -> ([f64; 4], (usize, usize), usize) {
    let names = grad_names(c);
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    let (mut t_trace, mut t_grad, mut t_lower, mut t_total) = (vec![], vec![], vec![], vec![]);
    let (mut size, mut eqns) = (0, (0, 0));
    for _ in 0..runs {
        let start = Instant::now();
        let forward = loss_program(c, Some(mesh.clone()));
        let traced = Instant::now();
        let grad = value_and_grad_program(&forward, &wrt);
        let differentiated = Instant::now();
        let mlir = to_stablehlo(&grad);
        let lowered = Instant::now();
        t_trace.push(traced - start);
        t_grad.push(differentiated - traced);
        t_lower.push(lowered - differentiated);
        t_total.push(lowered - start);
        size = mlir.len();
        eqns = (forward.graph.count_eqns(), grad.graph.count_eqns());
    }
    ([median(t_trace), median(t_grad), median(t_lower), median(t_total)], eqns, size)
}

fn main() {
    let runs: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(7);
    sanity_check();
    let mesh = Mesh::new(&[("data", 1), ("fsdp", 8), ("tensor", 1)]);
    println!("\nllama2-7b shapes, fsdp=8 mesh with logical-rule shardings; median of {runs} runs (ms)\n");
    println!(
        "| layers | scan_layers | remat | trace | grad | lower | trace+grad+lower | eqns (fwd / fwd+bwd) | MLIR |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let configs = [
        (4, false, "full"),
        (4, true, "full"),
        (32, false, "full"),
        (32, true, "full"),
        (32, true, "save_everything"),
        (32, true, "save_qkv_proj"),
    ];
    for (layers, scan_layers, remat) in configs {
        let c = Config::llama2_7b(layers, scan_layers, remat);
        let ([trace, grad, lower, total], eqns, size) = measure(&c, &mesh, runs);
        println!(
            "| {layers} | {scan_layers} | {remat} | {trace:.1} | {grad:.1} | {lower:.1} | {total:.1} | {} / {} | {:.0} KiB |",
            eqns.0,
            eqns.1,
            size as f64 / 1024.0
        );
    }

    println!("\nthe largest model file of each family, scanned, full remat, batch 4 x seq 2048, same mesh; median of {runs} runs (ms)\n");
    println!("| model | decoder_block | parameters | trace | grad | lower | trace+grad+lower | eqns (fwd / fwd+bwd) | MLIR |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let models: [(&str, &[&str]); 7] = [
        ("llama3.1-405b", &[]),
        ("mistral-7b", &[]),
        ("gemma-7b", &[]),
        ("gemma2-27b", &[]),
        ("gpt3-175b", &[]),
        ("maxtext-default", &["global_parameter_scale=16"]),
        ("llama2-7b", &[]),
    ];
    for (name, extra) in models {
        let c = Config::model_file(name, extra, 4, 2048);
        let ([trace, grad, lower, total], eqns, size) = measure(&c, &mesh, runs);
        let block = maxrs::config::load(None, &[format!("model_name={name}")]).expect("config").decoder_block;
        println!(
            "| {name}{} | {block} | {:.2}B | {trace:.1} | {grad:.1} | {lower:.1} | {total:.1} | {} / {} | {:.0} KiB |",
            if extra.is_empty() { String::new() } else { format!(" {}", extra.join(" ")) },
            c.model.num_params() as f64 / 1e9,
            eqns.0,
            eqns.1,
            size as f64 / 1024.0
        );
    }
}
