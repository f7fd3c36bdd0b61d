//! `tools/bench [CONFIG] [key=value ...] [--vs-jax]`: one training run of a config, measured.
//!
//! Prints start-up (plugin + client, trace, lower, compile, init), first-step and median step
//! time, TFLOP/s per device and peak host memory. With `--vs-jax` it first writes maxrs's
//! initial parameters (safetensors, the book's parameter layout) and the run's synthetic batches (the
//! token file format) to a temporary folder, trains maxrs from those files, then runs the same
//! model, init and data as a plain JAX program (`tools/jax_train.py`, in a virtualenv under
//! `tools/.venv-jax` that it creates from `tools/requirements-jax.txt`) and prints both columns,
//! their ratios and how far the two loss curves are apart. JAX runs on one CPU device, or on an
//! `fsdp` mesh of the same size when maxrs runs on several (compare fsdp-only configs then).
//!
//! `MAXRS_BENCH_PYTHON` picks the interpreter for the virtualenv (default: `python3.12` when
//! present, for the jaxlib whose XLA matches the CPU plugin's, else `python3`).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use maxrs::cluster::client_for;
use maxrs::config::{self, Config};
use maxrs::data::{self, write_tokens_file, ProcessShare};
use maxrs::host::params_io::{save_safetensors, Params};
use maxrs::pjrt::Client;
use maxrs::runtime;
use maxrs::tensor::Tree;
use maxrs::train::run::{train, RunReport};
use maxrs::train::step::TrainStep;
use serde_json::{json, Value};

#[path = "jax_venv.rs"]
mod jax_venv;
use jax_venv::{jax_python, tools_dir};

fn main() -> Result<()> {
    let started = Instant::now();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let vs_jax = args.iter().any(|a| a == "--vs-jax");
    args.retain(|a| a != "--vs-jax");
    if let Some(flag) = args.iter().find(|a| a.starts_with("--")) {
        bail!("unknown option {flag}; usage: tools/bench [CONFIG] [key=value ...] [--vs-jax]");
    }
    let c = config::load_args(&args)?;
    if vs_jax {
        // jax_train.py is maxrs's Llama model (llama2 block, default RoPE) and nothing else.
        let llama = maxrs::model::Model::from_config(&c)?;
        if c.decoder_block != config::DecoderBlock::Llama2
            || llama.config.rope != maxrs::model::config::Rope::Default
            || c.global_parameter_scale != 1
            || c.trainable_position_size > 0
            || c.mlp_activations != ["silu", "linear"]
        {
            bail!("--vs-jax compares the Llama model only: decoder_block=llama2 with the default RoPE, SwiGLU, no global_parameter_scale or position embeddings");
        }
    }
    let client = client_for(&c)?;
    let client_seconds = started.elapsed().as_secs_f64();
    let num_devices = client.addressable_devices()?.len();

    let scratch = tempfile::tempdir()?;
    let c = if vs_jax { with_shared_inputs(&c, &args, scratch.path(), &client)? } else { c };
    let report = train(&c, &client)?;
    let ours = Column::from_report(&report, client_seconds, peak_rss_bytes());
    if !vs_jax {
        print_table(&[("maxrs", &ours)], report.tflops_per_device);
        return Ok(());
    }
    let jax = run_jax(&c, scratch.path(), num_devices)?;
    let theirs = Column::from_jax(&jax)?;
    print_table(&[("maxrs", &ours), ("JAX", &theirs)], report.tflops_per_device);
    let jax_losses: Vec<f64> = jax["losses"]
        .as_array()
        .ok_or_else(|| anyhow!("no losses from JAX"))?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let diff = report.losses.iter().zip(&jax_losses).map(|(a, b)| (a - b).abs() / b.abs()).fold(0.0, f64::max);
    println!(
        "\nloss curves: maxrs {:.4} -> {:.4}, JAX {:.4} -> {:.4}; largest relative difference per step {diff:.1e}",
        report.losses[0],
        report.losses.last().unwrap(),
        jax_losses[0],
        jax_losses.last().unwrap()
    );
    Ok(())
}

/// Writes the initial parameters and the run's batches to `dir` and returns the config that
/// trains from them (so maxrs and JAX read identical inputs).
fn with_shared_inputs(c: &Config, args: &[String], dir: &Path, client: &Client) -> Result<Config> {
    let derived = config::validate(c, client.addressable_devices()?.len(), 1)?;
    let step = TrainStep::new(c, &derived, None)?;
    let init = step.init(&Default::default()).map_err(|e| anyhow!("{e}"))?;
    let values = runtime::run_program(client, &init, &Tree::new())?;
    let params: Params =
        values.into_iter().filter_map(|(n, t)| n.strip_prefix("params.").map(|n| (n.to_string(), t))).collect();
    let params_path = dir.join("params.safetensors");
    save_safetensors(&params_path, &params)?;

    let mut synthetic = data::open_train(c, derived.global_batch_size, ProcessShare::SINGLE, None)?;
    let mut rows = Vec::new();
    for _ in 0..derived.steps {
        let batch = synthetic.next_batch()?.expect("the synthetic stream never ends");
        let (inputs, targets) = (batch.inputs.to_i32(), batch.targets.to_i32());
        let seq = derived.max_target_length;
        for (input, target) in inputs.chunks(seq).zip(targets.chunks(seq)) {
            rows.push(input.iter().copied().chain(std::iter::once(target[seq - 1])).collect());
        }
    }
    let tokens_path = dir.join("tokens.bin");
    write_tokens_file(&tokens_path, &rows)?;

    let mut args = args.to_vec();
    args.extend([
        format!("load_parameters_path={}", params_path.display()),
        "dataset_type=tokens".to_string(),
        "enable_data_shuffling=false".to_string(),
        format!("dataset_path={}", tokens_path.display()),
    ]);
    Ok(config::load_args(&args)?)
}

/// Runs tools/jax_train.py on the same config and files; returns its RESULT.json.
fn run_jax(c: &Config, dir: &Path, num_devices: usize) -> Result<Value> {
    let derived = config::validate(c, num_devices, 1)?;
    let run = json!({
        "emb": c.base_emb_dim, "heads": c.base_num_query_heads, "kv_heads": c.base_num_kv_heads,
        "head_dim": c.head_dim, "mlp": c.base_mlp_dim, "layers": c.base_num_decoder_layers, "vocab": c.vocab_size,
        "eps": c.normalization_layer_epsilon, "rope_max_timescale": c.rope_max_timescale as f64,
        "logits_via_embedding": c.logits_via_embedding, "dtype": c.dtype.as_str(), "weight_dtype": c.weight_dtype.as_str(),
        "scan_layers": c.scan_layers, "remat_policy": c.remat_policy.as_str(),
        "global_batch": derived.global_batch_size, "seq": derived.max_target_length, "steps": derived.steps,
        "learning_rate": c.learning_rate, "warmup_steps_fraction": c.warmup_steps_fraction,
        "learning_rate_final_fraction": c.learning_rate_final_fraction,
        "learning_rate_schedule_steps": derived.schedule_steps,
        "adam_b1": c.adam_b1, "adam_b2": c.adam_b2, "adam_eps": c.adam_eps, "adam_eps_root": c.adam_eps_root,
        "adam_weight_decay": c.adam_weight_decay, "gradient_clipping_threshold": c.gradient_clipping_threshold,
        "z_loss_multiplier": c.z_loss_multiplier, "num_devices": num_devices,
    });
    let run_path = dir.join("run.json");
    std::fs::write(&run_path, serde_json::to_string_pretty(&run)?)?;
    let out_path = dir.join("result.json");
    let python = jax_python()?;
    println!("\nrunning the same model, init and data in JAX ({})", python.display());
    let status = Command::new(&python)
        .arg(tools_dir().join("jax_train.py"))
        .args(["--config", &run_path.to_string_lossy(), "--tokens", &dir.join("tokens.bin").to_string_lossy()])
        .args(["--params", &dir.join("params.safetensors").to_string_lossy(), "--out", &out_path.to_string_lossy()])
        .status()
        .context("running tools/jax_train.py")?;
    if !status.success() {
        bail!("tools/jax_train.py failed ({status})");
    }
    Ok(serde_json::from_str(&std::fs::read_to_string(&out_path)?)?)
}

/// One column of the table, in seconds / TFLOP/s / bytes.
struct Column {
    startup: f64,
    trace: f64,
    lower: f64,
    compile: f64,
    first_step: f64,
    median_step: Option<f64>,
    peak_rss: Option<u64>,
}

impl Column {
    fn from_report(r: &RunReport, client_seconds: f64, peak_rss: Option<u64>) -> Column {
        let s = &r.startup;
        Column {
            startup: client_seconds + s.trace + s.lower + s.compile + s.init,
            trace: s.trace,
            lower: s.lower,
            compile: s.compile,
            first_step: r.step_times[0],
            median_step: maxrs::train::metrics::median_step_time(&r.step_times),
            peak_rss,
        }
    }

    fn from_jax(v: &Value) -> Result<Column> {
        let t = |k: &str| v["timings_s"][k].as_f64().ok_or_else(|| anyhow!("JAX result lacks timings_s.{k}"));
        let median_step = v["timings_s"]["median_step"].as_f64();
        Ok(Column {
            startup: t("startup")?,
            trace: t("trace")?,
            lower: t("lower")?,
            compile: t("compile")?,
            first_step: t("first_step")?,
            median_step,
            peak_rss: v["peak_rss_bytes"].as_u64(),
        })
    }
}

/// Peak resident memory of this process (Linux `VmHWM`).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The table; `tflops` is the step's TFLOPs per device (the same work in every column).
fn print_table(columns: &[(&str, &Column)], tflops: f64) {
    type Row<'a> = (&'a str, Box<dyn Fn(&Column) -> Option<f64>>, &'a str);
    let rows: Vec<Row> = vec![
        ("start-up (process start to first step)", Box::new(|c| Some(c.startup)), "s"),
        ("trace", Box::new(|c| Some(c.trace)), "s"),
        ("lower", Box::new(|c| Some(c.lower)), "s"),
        ("compile", Box::new(|c| Some(c.compile)), "s"),
        ("trace + lower + compile", Box::new(|c| Some(c.trace + c.lower + c.compile)), "s"),
        ("first step", Box::new(|c| Some(c.first_step)), "s"),
        ("median step (steps 1..)", Box::new(|c| c.median_step), "s"),
        ("TFLOP/s/device (median step)", Box::new(move |c| c.median_step.map(|m| tflops / m)), ""),
        ("peak host memory", Box::new(|c| c.peak_rss.map(|b| b as f64 / (1u64 << 20) as f64)), "MiB"),
    ];
    let mut header = format!("\n| {:<40} |", "");
    for (name, _) in columns {
        header.push_str(&format!(" {name:>12} |"));
    }
    if columns.len() == 2 {
        header.push_str(" JAX / maxrs |");
    }
    println!("{header}");
    println!("|{}|{}", "-".repeat(42), "--------------|".repeat(columns.len() + usize::from(columns.len() == 2)));
    for (label, value, unit) in &rows {
        let mut line = format!("| {:<40} |", label);
        let values: Vec<Option<f64>> = columns.iter().map(|(_, c)| value(c)).collect();
        for v in &values {
            line.push_str(&match v {
                Some(v) => format!(" {:>12} |", format!("{} {unit}", significant(*v))),
                None => format!(" {:>12} |", "-"),
            });
        }
        if let [Some(a), Some(b)] = values[..] {
            line.push_str(&format!(" {:>11} |", format!("{:.2}x", b / a)));
        } else if columns.len() == 2 {
            line.push_str(&format!(" {:>11} |", "-"));
        }
        println!("{line}");
    }
}

/// Four significant digits, without scientific notation for the usual ranges.
fn significant(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{v:.digits$}")
}
