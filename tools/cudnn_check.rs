//! `cargo run --release --example cudnn_check -- [hardware=gpu plugin=cuda13]`: on a CUDA GPU,
//! cuDNN's fused attention (`model::cudnn`) and maxrs's blockwise attention, both in bf16 on
//! random inputs, against the exact attention (blockwise in f32 on the same bf16-rounded
//! inputs): outputs and the gradients of `sum(out * w)` with respect to q, k and v, for causal
//! MHA, GQA, a 256-token sliding window and per-row valid lengths (`PADDING_CAUSAL`; blockwise
//! sees the padding as a second document, and `w` is zero on padded queries, whose outputs cuDNN
//! leaves undefined). Shapes: batch 2, 1024 tokens, 8 query heads of 128. Prints each distance
//! (largest |a - b| over the largest |b|) and exits non-zero where cuDNN is further from the
//! exact attention than both the bf16 tolerance and blockwise attention: blockwise rounds its
//! scores to bf16 (as MaxText's dot-product attention does), which on these unscaled inputs puts
//! it about 2.5e-2 off, where cuDNN, scoring in f32, is about 1e-2 off (an H200, 2026-11-26). On
//! the CPU plugin it prints blockwise's distances alone. Run by `tools/gpu-check`
//! (`tools/gpu-check.d/27-cudnn.sh`).

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

/// Which attention a program computes.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// cuDNN's fused attention on the bf16 inputs.
    Cudnn,
    /// maxrs's blockwise attention on the bf16 inputs, in bf16.
    Blockwise,
    /// Blockwise attention on the same (bf16-rounded) inputs computed in f32: what both approximate.
    Reference,
}

fn program(case: Case, kind: Kind) -> Program {
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
            let dtype = if kind == Kind::Reference { DType::F32 } else { DType::BF16 };
            let cast = |n: &str| p[n].astype(DType::BF16).astype(dtype);
            let (q, k, v) = (cast("q"), cast("k"), cast("v"));
            let out = if kind == Kind::Cudnn {
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
    let config = config::load_args(&args)?;
    // The CPU plugin has no cuDNN: there the tool measures blockwise attention alone.
    let gpu = config.hardware.is_gpu();
    let client = client_for(&config)?;
    let mut failed = vec![];
    for case in CASES {
        let inputs = inputs(case);
        let reference = run_program(&client, &program(case, Kind::Reference), &inputs)?;
        let blockwise = run_program(&client, &program(case, Kind::Blockwise), &inputs)?;
        let fused = if gpu { Some(run_program(&client, &program(case, Kind::Cudnn), &inputs)?) } else { None };
        for name in ["out", "grad.q", "grad.k", "grad.v"] {
            let (exact, block) = (reference[name].to_f64(), blockwise[name].to_f64());
            let block_err = scaled_diff(&block, &exact);
            let Some(fused) = &fused else {
                println!("{}: {name}: blockwise (bf16) is off the f32 attention by {block_err:.2e}", case.name);
                continue;
            };
            let got = fused[name].to_f64();
            let fused_err = scaled_diff(&got, &exact);
            let between = scaled_diff(&got, &block);
            let ok = fused_err <= TOLERANCE.max(block_err);
            println!(
                "{}: {name}: off the f32 attention by {fused_err:.2e} (cuDNN) and {block_err:.2e} (blockwise); \
                 cuDNN vs blockwise {between:.2e} ({})",
                case.name,
                if ok { "ok" } else { "FAIL" }
            );
            if !ok {
                failed.push(format!("{} {name}", case.name));
            }
        }
    }
    if !failed.is_empty() {
        bail!("cuDNN attention is further from the f32 attention than bf16 tolerance ({TOLERANCE:e}) and blockwise allow: {}", failed.join(", "));
    }
    Ok(())
}
