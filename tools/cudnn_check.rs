//! `cargo run --release --example cudnn_check -- [hardware=gpu plugin=cuda13]`: on a CUDA GPU,
//! cuDNN's fused attention (`model::cudnn`) against maxrs's blockwise attention, both in bf16 on
//! random inputs: outputs and the gradients of `sum(out * w)` with respect to q, k and v, for
//! causal MHA, GQA, a 256-token sliding window and per-row valid lengths (`PADDING_CAUSAL`;
//! blockwise sees the padding as a second document, and `w` is zero on padded queries, whose
//! outputs cuDNN leaves undefined). Shapes: batch 2, 1024 tokens, 8 query heads of 128. Prints
//! each difference (largest |a - b| over the largest |b|) and exits non-zero when one is above
//! the bf16 tolerance. Run by `tools/gpu-check` (`tools/gpu-check.d/27-cudnn.sh`).

use anyhow::{bail, Result};
use maxrs::autodiff::value_and_grad;
use maxrs::cluster::client_for;
use maxrs::config;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::model::attention::Mask;
use maxrs::model::{blockwise, cudnn};
use maxrs::runtime::run_program;
use maxrs::tensor::{trace, Tensor, Tree};

const B: i64 = 2;
const T: i64 = 1024;
const HEADS: i64 = 8;
const D: i64 = 128;
/// bf16 keeps 8 significant bits; both kernels round their matmul operands to it.
const TOLERANCE: f64 = 2e-2;

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    kv_heads: i64,
    window: Option<i64>,
    lengths: Option<[i32; 2]>,
}

const CASES: [Case; 4] = [
    Case { name: "causal", kv_heads: 8, window: None, lengths: None },
    Case { name: "gqa", kv_heads: 2, window: None, lengths: None },
    Case { name: "window", kv_heads: 8, window: Some(256), lengths: None },
    Case { name: "lengths", kv_heads: 8, window: None, lengths: Some([1024, 700]) },
];

fn program(case: Case, fused: bool) -> Program {
    let mut sig = Signature::new(None);
    for (name, heads) in [("q", HEADS), ("k", case.kv_heads), ("v", case.kv_heads)] {
        sig.input(&format!("p.{name}"), DType::F32, &[B, T, heads, D]);
    }
    sig.input("w", DType::F32, &[B, T, HEADS, D]);
    sig.input("lengths", DType::S32, &[B]);
    trace(&sig, |ctx, inp| {
        let lengths = &inp["lengths"];
        // Position t of row b is valid when t < lengths[b]: segment 1, else 2 (blockwise's view).
        let valid = ctx.iota(DType::S32, &[B, T], 1).lt(lengths.broadcast_in_dim(&[B, T], &[0]));
        let segments = (valid.astype(DType::S32) * -1i32) + 2i32;
        let w = &inp["w"] * &valid.astype(DType::F32).broadcast_in_dim(&[B, T, HEADS, D], &[0, 1]);
        let attend = |p: &Tree| -> Tensor {
            let cast = |n: &str| p[n].astype(DType::BF16);
            let (q, k, v) = (cast("q"), cast("k"), cast("v"));
            let out = if fused {
                let lengths = case.lengths.is_some().then_some((lengths, lengths));
                cudnn::attention(&q, &k, &v, case.window, lengths, true).0
            } else {
                let mask = Mask { window: case.window, segments: case.lengths.is_some().then(|| segments.clone()) };
                blockwise::attention(&q, &k, &v, &mask, 512).0
            };
            out.astype(DType::F32)
        };
        let out = attend(&inp.subtree("p"));
        let (_, grads) = value_and_grad(&inp.subtree("p"), |p| (attend(p) * &w).sum_all());
        let out = &out * &valid.astype(DType::F32).broadcast_in_dim(&[B, T, HEADS, D], &[0, 1]);
        grads.prefixed("grad").with("out", out)
    })
    .expect("traces")
}

/// Deterministic uniform numbers in [-scale, scale) (a small LCG: no dependency for a tool).
fn uniform(seed: u64, n: usize, scale: f64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale) as f32
        })
        .collect()
}

fn inputs(case: Case) -> Tree<HostTensor> {
    let mut t = Tree::new();
    for (i, (name, heads)) in
        [("p.q", HEADS), ("p.k", case.kv_heads), ("p.v", case.kv_heads), ("w", HEADS)].iter().enumerate()
    {
        let dims = [B, T, *heads, D];
        let n = dims.iter().product::<i64>() as usize;
        t.insert(*name, HostTensor::from_f32(&dims, &uniform(i as u64 + 1, n, 1.0)));
    }
    t.insert("lengths", HostTensor::from_i32(&[B], &case.lengths.unwrap_or([T as i32, T as i32])));
    t
}

fn scaled_diff(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
}

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        args = vec!["hardware=gpu".into(), "plugin=cuda13".into()];
    }
    let client = client_for(&config::load_args(&args)?)?;
    let mut failed = vec![];
    for case in CASES {
        let fused = run_program(&client, &program(case, true), &inputs(case))?;
        let reference = run_program(&client, &program(case, false), &inputs(case))?;
        for name in ["out", "grad.q", "grad.k", "grad.v"] {
            let err = scaled_diff(&fused[name].to_f64(), &reference[name].to_f64());
            let verdict = if err < TOLERANCE { "ok" } else { "FAIL" };
            println!("cudnn vs blockwise, {}: {name} differs by {err:.2e} ({verdict})", case.name);
            if err >= TOLERANCE {
                failed.push(format!("{} {name}", case.name));
            }
        }
    }
    if !failed.is_empty() {
        bail!("cuDNN and blockwise attention differ beyond {TOLERANCE:e}: {}", failed.join(", "));
    }
    Ok(())
}
