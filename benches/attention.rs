//! Attention kinds on the CPU plugin: the forward and backward pass (gradients of
//! `sum(attend(q, k, v) * w)` with respect to `q`, `k`, `v`) of one llama-shaped attention layer
//! at sequence lengths 1024 to 4096, for dot-product and blockwise attention. Prints, per kind
//! and length, the median wall time of the compiled step over repeated runs and XLA's compiled
//! memory (temporaries: the scores for dot-product attention, one block's for blockwise).
//!
//! `cargo bench --bench attention` (`ATTENTION_BENCH_SEQS=1024,2048` to choose lengths)

use std::time::{Duration, Instant};

use maxrs::autodiff::value_and_grad;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::model::attention::attend;
use maxrs::model::kernel::{AttentionImpl, BLOCK};
use maxrs::model::mask::Mask;
use maxrs::pjrt::cpu_client;
use maxrs::runtime::compile;
use maxrs::tensor::{trace, Tree};

const BATCH: i64 = 1;
const HEADS: i64 = 8;
const KV_HEADS: i64 = 8;
const HEAD_DIM: i64 = 64;
const RUNS: usize = 3;

fn program(seq: i64, how: AttentionImpl) -> Program {
    let mut sig = Signature::new(None);
    for name in ["p.q", "p.k", "p.v", "w"] {
        let heads = if name == "p.q" || name == "w" { HEADS } else { KV_HEADS };
        sig.input(name, DType::F32, &[BATCH, seq, heads, HEAD_DIM]);
    }
    trace(&sig, |_, inp| {
        let mask = Mask { window: None, chunk: None, segments: None, order: None };
        let (loss, grads) = value_and_grad(&inp.subtree("p"), |p| {
            (attend(&p["q"], &p["k"], &p["v"], &mask, how) * &inp["w"]).sum_all()
        });
        grads.prefixed("grad").with("loss", loss)
    })
    .expect("traces")
}

fn inputs(seq: i64) -> Tree<HostTensor> {
    let mut t = Tree::new();
    for (name, heads) in [("p.q", HEADS), ("p.k", KV_HEADS), ("p.v", KV_HEADS), ("w", HEADS)] {
        let n = (BATCH * seq * heads * HEAD_DIM) as usize;
        let values: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.1).collect();
        t.insert(name, HostTensor::from_f32(&[BATCH, seq, heads, HEAD_DIM], &values));
    }
    t
}

fn main() -> anyhow::Result<()> {
    std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    let seqs: Vec<i64> = std::env::var("ATTENTION_BENCH_SEQS")
        .unwrap_or_else(|_| "1024,2048,4096".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let client = cpu_client(1)?;
    println!(
        "attention forward + backward on CPU, f32, batch {BATCH}, {HEADS} heads of {HEAD_DIM}, causal; \
         median of {RUNS} runs"
    );
    println!("| kind | seq | step | temporaries | compile |");
    println!("|---|---|---|---|---|");
    for &seq in &seqs {
        for how in [AttentionImpl::DotProduct, AttentionImpl::Blockwise { block: BLOCK.min(seq) }] {
            let t = Instant::now();
            let compiled = compile(&client, &program(seq, how))?;
            let compile_time = t.elapsed();
            let stats = compiled.executable.executable().compiled_memory_stats()?;
            let host = inputs(seq);
            let mut times: Vec<Duration> = Vec::new();
            for _ in 0..RUNS {
                let t = Instant::now();
                compiled.run(&client, &host)?;
                times.push(t.elapsed());
            }
            times.sort();
            let name = match how {
                AttentionImpl::DotProduct => "dot_product".to_string(),
                AttentionImpl::Blockwise { block } => format!("blockwise ({block})"),
                AttentionImpl::Cudnn { block } => format!("cudnn, else blockwise ({block})"),
            };
            println!(
                "| {name} | {seq} | {:.3} s | {:.1} MiB | {:.1} s |",
                times[RUNS / 2].as_secs_f64(),
                stats.temp_bytes as f64 / (1u64 << 20) as f64,
                compile_time.as_secs_f64()
            );
        }
    }
    Ok(())
}
