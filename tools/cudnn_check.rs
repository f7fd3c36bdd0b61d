//! `cargo run --release --example cudnn_check -- [hardware=gpu plugin=cuda13]`: on a CUDA GPU,
//! cuDNN's fused attention (`model::cudnn`) and maxrs's blockwise attention, both in bf16 on
//! random inputs, against the exact attention (blockwise in f32 on the same bf16-rounded
//! inputs): outputs and the gradients of `sum(out * w)` with respect to q, k and v, for causal
//! MHA, GQA, a 256-token sliding window, per-row valid lengths (`PADDING_CAUSAL`; blockwise
//! sees the padding as a second document) and packed documents (cuDNN's packed layout, up to 3
//! documents a row; blockwise masks by segment), with and without GQA and a window. `w` is zero
//! on padded queries, whose outputs cuDNN leaves undefined (with lengths) or computes over their
//! last document (packed). Shapes: batch 2, 1024 tokens, 8 query heads of 128. Prints each distance
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
use maxrs::model::mask::Mask;
use maxrs::model::{blockwise, cudnn};
use maxrs::runtime::run_program;
use maxrs::tensor::{trace, Tensor, Tree};

const B: i64 = 2;
const T: i64 = 1024;
const HEADS: i64 = 8;
const D: i64 = 128;
/// bf16 keeps 8 significant bits; both kernels round their matmul operands to it.
const TOLERANCE: f64 = 2e-2;

/// What the rows hold.
#[derive(Clone, Copy)]
enum Rows {
    Whole,
    /// Each row's valid length.
    Lengths([i64; 2]),
    /// Each row's documents' lengths, then padding.
    Packed([&'static [i64]; 2]),
}

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    kv_heads: i64,
    window: Option<i64>,
    rows: Rows,
}

/// Documents of 300, 200 and 400 tokens then 124 of padding; of 512 and 500 then 12.
const DOCUMENTS: [&[i64]; 2] = [&[300, 200, 400], &[512, 500]];

const CASES: [Case; 6] = [
    Case { name: "causal", kv_heads: 8, window: None, rows: Rows::Whole },
    Case { name: "gqa", kv_heads: 2, window: None, rows: Rows::Whole },
    Case { name: "window", kv_heads: 8, window: Some(256), rows: Rows::Whole },
    Case { name: "lengths", kv_heads: 8, window: None, rows: Rows::Lengths([1024, 700]) },
    Case { name: "packed", kv_heads: 8, window: None, rows: Rows::Packed(DOCUMENTS) },
    Case { name: "packed_gqa_window", kv_heads: 2, window: Some(256), rows: Rows::Packed(DOCUMENTS) },
];

impl Case {
    /// Each token's segment as blockwise attention masks by it (with lengths, the padding is
    /// a second document; packed, padding is segment 0), row after row.
    fn segments(&self) -> Vec<i32> {
        let row = |r: usize| -> Vec<i32> {
            let mut out = vec![];
            match self.rows {
                Rows::Whole => out.resize(T as usize, 1),
                Rows::Lengths(lengths) => {
                    out.resize(lengths[r] as usize, 1);
                    out.resize(T as usize, 2);
                }
                Rows::Packed(documents) => {
                    for (i, &n) in documents[r].iter().enumerate() {
                        out.extend(std::iter::repeat_n(i as i32 + 1, n as usize));
                    }
                    out.resize(T as usize, 0);
                }
            }
            out
        };
        (0..B as usize).flat_map(row).collect()
    }

    /// 1 where a token is not padding, row after row.
    fn valid(&self) -> Vec<f32> {
        let segments = self.segments();
        match self.rows {
            Rows::Whole => vec![1.0; segments.len()],
            Rows::Lengths(_) => segments.iter().map(|&s| if s == 1 { 1.0 } else { 0.0 }).collect(),
            Rows::Packed(_) => segments.iter().map(|&s| if s != 0 { 1.0 } else { 0.0 }).collect(),
        }
    }
}

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
    sig.input("segments", DType::S32, &[B, T]);
    sig.input("valid", DType::F32, &[B, T]);
    trace(&sig, |_, inp| {
        let (lengths, segments) = (&inp["lengths"], &inp["segments"]);
        let valid = inp["valid"].broadcast_in_dim(&[B, T, HEADS, D], &[0, 1]);
        let w = &inp["w"] * &valid;
        let attend = |p: &Tree| -> Tensor {
            let dtype = if kind == Kind::Reference { DType::F32 } else { DType::BF16 };
            let cast = |n: &str| p[n].astype(DType::BF16).astype(dtype);
            let (q, k, v) = (cast("q"), cast("k"), cast("v"));
            let out = if kind == Kind::Cudnn {
                let sequences = match case.rows {
                    Rows::Whole => cudnn::Sequences::Whole,
                    Rows::Lengths(_) => cudnn::Sequences::Lengths(lengths, lengths),
                    Rows::Packed(_) => cudnn::Sequences::Packed { segments, max: 3 },
                };
                cudnn::attention(&q, &k, &v, case.window, sequences, true).0
            } else {
                let segments = (!matches!(case.rows, Rows::Whole)).then(|| segments.clone());
                blockwise::attention(
                    &q,
                    &k,
                    &v,
                    &Mask { window: case.window, chunk: None, segments, order: None },
                    512,
                    None,
                )
                .0
            };
            out.astype(DType::F32)
        };
        let out = attend(&inp.subtree("p"));
        let (_, grads) = value_and_grad(&inp.subtree("p"), |p| (attend(p) * &w).sum_all());
        grads.prefixed("grad").with("out", &out * &valid)
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
    let lengths = match case.rows {
        Rows::Lengths(lengths) => lengths.map(|n| n as i32),
        Rows::Whole | Rows::Packed(_) => [T as i32; 2],
    };
    t.insert("lengths", HostTensor::from_i32(&[B], &lengths));
    t.insert("segments", HostTensor::from_i32(&[B, T], &case.segments()));
    t.insert("valid", HostTensor::from_f32(&[B, T], &case.valid()));
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
