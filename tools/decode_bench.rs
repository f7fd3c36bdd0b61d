//! `tools/decode_bench [CONFIG] [key=value ...] [--steps-per-call 1,4,...] [--vs-jax]`: decoding
//! of a config, measured (prefill, per-token latency, tokens/s), optionally against plain JAX.
//!
//! The batch (`int(devices x per_device_batch_size)` sequences) is filled with prompts of
//! different lengths (from half of `max_prefill_predict_length` to all of it, deterministic ids)
//! and decoded without EOS, `max_target_length - max_prefill_predict_length` generate steps. The
//! parameters are the ones `maxrs train` would start from (`init_weights_seed`). Each setting
//! runs the whole decode `--repeats` + 1 times (default 5) and leaves out the first (warm-up):
//! prefill is the median prefill call, per-token latency the median generate call over all
//! measured runs (divided by its tokens per call), tokens/s all generated tokens over all generate
//! calls' time. `--steps-per-call` lists the generate program's tokens per call to compare: 1 is
//! the host loop `maxrs decode` uses, more is a compiled multi-token loop.
//!
//! With `--vs-jax` the parameters are written to a safetensors file and the same decode runs in
//! plain JAX (`tools/jax_decode.py`, in the virtualenv `tools/.venv-jax` made from
//! `tools/requirements-jax.txt`, see tools/README.md), and the table gets JAX's column, the time
//! ratios and whether the tokens are equal. Only `scan_layers=true`, greedy or weighted sampling.

use std::path::Path;
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use maxrs::cluster::client_for;
use maxrs::config::{self, Config};
use maxrs::host::params_io::save_safetensors;
use maxrs::host::HostTensor;
use maxrs::inference::{Generation, ParamSource, Session};
use maxrs::ir::Signature;
use maxrs::model::Model;
use maxrs::runtime;
use maxrs::tensor::{random, trace, Tree};
use serde_json::{json, Value};

#[path = "jax_venv.rs"]
mod jax_venv;
use jax_venv::{jax_python, tools_dir};

const USAGE: &str =
    "usage: tools/decode_bench [CONFIG] [key=value ...] [--steps-per-call 1,4,...] [--repeats N] [--vs-jax]";

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let vs_jax = take_flag(&mut args, "--vs-jax");
    let steps_per_call: Vec<i64> = match take_option(&mut args, "--steps-per-call")? {
        Some(list) => list
            .split(',')
            .map(|s| s.trim().parse().map_err(|_| anyhow!("--steps-per-call {list}: {USAGE}")))
            .collect::<Result<_>>()?,
        None => vec![1],
    };
    let repeats: usize = take_option(&mut args, "--repeats")?.map(|r| r.parse()).transpose()?.unwrap_or(5).max(1);
    if let Some(flag) = args.iter().find(|a| a.starts_with("--")) {
        bail!("unknown option {flag}; {USAGE}");
    }
    let c = config::load_args(&args)?;
    let client = client_for(&c)?;
    let mut ids: Vec<i64> = client.devices()?.iter().map(|d| d.id as i64).collect();
    ids.sort_unstable();
    let derived = config::validate(&c, ids.len(), 1)?;
    config::validate_decode(&c)?;
    let model = Model::from_config(&c)?;
    let params = initial_params(&model, &client, c.init_weights_seed as u32)?;
    let batch = derived.micro_batch_size;
    let prompts = prompts(batch, c.max_prefill_predict_length as usize, c.vocab_size as i32);
    println!(
        "model {} ({} parameters, dtype {}), {} devices, batch {batch}, prompts of {}..{} tokens, cache {} positions, {} generate steps, sampling {}",
        c.model_name,
        model.num_params(),
        c.dtype,
        ids.len(),
        prompts.iter().map(Vec::len).min().unwrap_or(0),
        prompts.iter().map(Vec::len).max().unwrap_or(0),
        c.max_target_length,
        c.max_target_length - c.max_prefill_predict_length,
        c.decode_sampling_strategy
    );

    let mut rows = Vec::new();
    let mut reference: Option<Vec<Vec<i32>>> = None;
    for &k in &steps_per_call {
        let mesh = derived.mesh.step_mesh(std::slice::from_ref(&ids))?;
        let session = Session::new(&c, &derived, mesh, &client, ParamSource::Host(&params), k)?;
        session.generate(&prompts, None)?; // warm-up
        let runs: Vec<Generation> = (0..repeats).map(|_| session.generate(&prompts, None)).collect::<Result<_>>()?;
        let g = &runs[0];
        let s = &session.startup;
        match &reference {
            None => reference = Some(g.tokens.clone()),
            Some(r) if *r != g.tokens => {
                println!("warning: {k} steps per call decodes other tokens than {}", steps_per_call[0])
            }
            Some(_) => {}
        }
        rows.push((format!("maxrs, {k}/call"), Row::from_generations(&runs, s.trace + s.lower + s.compile)));
    }
    if vs_jax {
        let scratch = tempfile::tempdir()?;
        let (row, tokens) = run_jax(&c, batch, &params, &prompts, repeats, scratch.path())?;
        let ours = reference.as_ref().expect("at least one maxrs run");
        let equal = ours.iter().zip(&tokens).filter(|(a, b)| a == b).count();
        let first_diff = ours.iter().zip(&tokens).filter_map(|(a, b)| a.iter().zip(b).position(|(x, y)| x != y)).min();
        println!(
            "tokens: {equal} of {} sequences equal to JAX's{}",
            ours.len(),
            first_diff.map_or(String::new(), |p| format!(" (first difference at generated token {p})"))
        );
        rows.push(("JAX".to_string(), row));
    }
    print_table(&rows);
    Ok(())
}

/// Timings of one decode, in seconds.
struct Row {
    compile: f64,
    prefill: f64,
    per_token: f64,
    tokens_per_second: f64,
}

impl Row {
    /// Medians over the measured runs: prefill calls, generate calls (per token); tokens/s over
    /// all of them.
    fn from_generations(runs: &[Generation], compile: f64) -> Row {
        let all = Generation {
            tokens: runs.iter().flat_map(|g| g.tokens.clone()).collect(),
            call_seconds: runs.iter().flat_map(|g| g.call_seconds.clone()).collect(),
            steps_per_call: runs[0].steps_per_call,
            prefill_seconds: f64::NAN,
        };
        Row {
            compile,
            prefill: median(runs.iter().map(|g| g.prefill_seconds).collect()),
            per_token: all.per_token_seconds().unwrap_or(f64::NAN),
            tokens_per_second: all.tokens_per_second().unwrap_or(f64::NAN),
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn print_table(rows: &[(String, Row)]) {
    println!("\n| | compile s | prefill ms | per-token ms (median) | tokens/s |");
    println!("|---|---|---|---|---|");
    for (name, r) in rows {
        println!(
            "| {name} | {:.2} | {:.2} | {:.3} | {:.0} |",
            r.compile,
            r.prefill * 1e3,
            r.per_token * 1e3,
            r.tokens_per_second
        );
    }
    if let (Some((_, ours)), Some((_, jax))) = (rows.first(), rows.iter().find(|(n, _)| n == "JAX")) {
        println!(
            "| JAX / maxrs | {:.2} | {:.2} | {:.2} | {:.2} |",
            jax.compile / ours.compile,
            jax.prefill / ours.prefill,
            jax.per_token / ours.per_token,
            ours.tokens_per_second / jax.tokens_per_second
        );
    }
}

/// `batch` prompts, lengths spread evenly from half the prefill to all of it, deterministic ids.
fn prompts(batch: usize, prefill: usize, vocab: i32) -> Vec<Vec<i32>> {
    let shortest = (prefill / 2).max(1);
    (0..batch)
        .map(|r| {
            let len = shortest + (prefill - shortest) * r / (batch - 1).max(1);
            (0..len).map(|i| ((r * 7919 + i * 104_729) % vocab as usize) as i32).collect()
        })
        .collect()
}

/// The parameters `maxrs train` starts from, drawn on the devices and copied to the host.
fn initial_params(model: &Model, client: &maxrs::pjrt::Client, seed: u32) -> Result<Tree<HostTensor>> {
    let program = trace(&Signature::new(None), |ctx, _| model.init_params(&random::key(ctx, seed)))
        .map_err(|e| anyhow!("tracing the initializer: {e}"))?;
    runtime::run_program(client, &program, &Tree::new())
}

fn run_jax(
    c: &Config,
    batch: usize,
    params: &Tree<HostTensor>,
    prompts: &[Vec<i32>],
    repeats: usize,
    dir: &Path,
) -> Result<(Row, Vec<Vec<i32>>)> {
    if !c.scan_layers {
        bail!("--vs-jax: jax_decode.py needs scan_layers=true");
    }
    let sampling = c.decode_sampling_strategy.as_str();
    if !matches!(sampling, "greedy" | "weighted") {
        bail!("--vs-jax: jax_decode.py samples greedy or weighted, not {sampling}");
    }
    let file = dir.join("params.safetensors");
    save_safetensors(&file, &params.iter().map(|(n, t)| (n.to_string(), t.clone())).collect())?;
    let run = json!({
        "emb": c.base_emb_dim, "heads": c.base_num_query_heads, "kv_heads": c.base_num_kv_heads,
        "head_dim": c.head_dim, "mlp": c.base_mlp_dim, "layers": c.base_num_decoder_layers,
        "vocab": c.vocab_size, "eps": c.normalization_layer_epsilon, "rope_max_timescale": c.rope_max_timescale,
        "logits_via_embedding": c.logits_via_embedding, "dtype": c.dtype.as_str(),
        "weight_dtype": c.weight_dtype.as_str(), "scan_layers": true, "batch": batch,
        "prefill_len": c.max_prefill_predict_length, "cache_len": c.max_target_length,
        "steps": c.max_target_length - c.max_prefill_predict_length, "sampling": sampling,
        "temperature": c.decode_sampling_temperature, "seed": c.decode_seed, "repeats": repeats,
    });
    std::fs::write(dir.join("run.json"), run.to_string())?;
    std::fs::write(dir.join("prompts.json"), serde_json::to_string(prompts)?)?;
    let python = jax_python()?;
    println!("running the same decode in JAX ({})", python.display());
    let status = Command::new(&python)
        .arg(tools_dir().join("jax_decode.py"))
        .args([
            "--config",
            "run.json",
            "--params",
            "params.safetensors",
            "--prompts",
            "prompts.json",
            "--out",
            "result.json",
        ])
        .current_dir(dir)
        .status()
        .context("running jax_decode.py")?;
    if !status.success() {
        bail!("jax_decode.py failed ({status})");
    }
    let result: Value = serde_json::from_slice(&std::fs::read(dir.join("result.json"))?)?;
    let t = &result["timings_s"];
    let f = |k: &str| t[k].as_f64().ok_or_else(|| anyhow!("RESULT.json lacks timings_s.{k}"));
    let tokens: Vec<Vec<i32>> = serde_json::from_value(result["tokens"].clone())?;
    let made: usize = tokens.iter().map(|t| t.len().saturating_sub(1)).sum::<usize>() * repeats;
    let row = Row {
        compile: f("compile")?,
        prefill: f("prefill")?,
        per_token: f("per_token")?,
        tokens_per_second: made as f64 / f("generate_total")?,
    };
    Ok((row, tokens))
}

fn take_flag(args: &mut Vec<String>, flag: &str) -> bool {
    let found = args.iter().any(|a| a == flag);
    args.retain(|a| a != flag);
    found
}

fn take_option(args: &mut Vec<String>, name: &str) -> Result<Option<String>> {
    let Some(i) = args.iter().position(|a| a == name) else { return Ok(None) };
    if i + 1 >= args.len() {
        bail!("{name} needs a value; {USAGE}");
    }
    let value = args.remove(i + 1);
    args.remove(i);
    Ok(Some(value))
}
