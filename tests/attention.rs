//! Blockwise attention against dot-product attention, executed through the CPU plugin: outputs
//! and the gradients of `sum(attend(q, k, v) * w)` (random `w`) with respect to `q`, `k`, `v`
//! agree within f32 and bf16 tolerances for causal attention, grouped-query heads, a sliding
//! window, Llama 4's chunks, packed documents and attention sinks (gpt-oss's), with several query and key blocks.
//! Dot-product attention's gradient comes from autodiff (its rules are finite-difference checked in `grad_check`);
//! blockwise attention's is its own backward pass, checked here against it and, in f64,
//! against finite differences (the sinks' gradient too). Under a remat policy that saves `context`, the backward pass
//! reuses the saved output and statistics instead of recomputing the attention.

use crate::common::{f64_tensor, rng, run, uniform};
use maxrs::autodiff::value_and_grad;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Prim, Program, RematFences, Signature};
use maxrs::model::attention::{attend_sinks, AttendOptions};
use maxrs::model::kernel::AttentionImpl;
use maxrs::model::mask::Mask;
use maxrs::runtime::compile;
use maxrs::tensor::{checkpoint, trace, RematPolicy, Tree};

const B: i64 = 2;
const T: i64 = 32;
const HEADS: i64 = 4;
const KV_HEADS: i64 = 2;
const D: i64 = 8;
const BLOCK: i64 = 8;

#[derive(Clone, Copy)]
struct Case {
    window: Option<i64>,
    /// Llama 4's chunked attention (`Mask::chunk`).
    chunk: Option<i64>,
    packed: bool,
    /// A learned logit per query head in each softmax's denominator (`p.z`, `[HEADS]`, in the
    /// computation's dtype).
    sinks: bool,
}

/// Documents of lengths 5, 11, 16 in row 0 and 20, 12 in row 1.
fn segments() -> Vec<i32> {
    let row = |lens: &[usize]| -> Vec<i32> {
        lens.iter().enumerate().flat_map(|(i, &n)| std::iter::repeat_n(i as i32 + 1, n)).collect()
    };
    [row(&[5, 11, 16]), row(&[20, 12])].concat()
}

/// `loss = sum(attend(q, k, v) * w)` in `dtype`; outputs `out` and `grad.{q,k,v}` (f32 inputs,
/// cast to `dtype` inside), optionally inside a remat region that saves `context`.
fn program(case: Case, how: AttentionImpl, dtype: DType, remat: bool) -> Program {
    let mut sig = Signature::new(None);
    for (name, heads) in [("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)] {
        sig.input(&format!("p.{name}"), DType::F64, &[B, T, heads, D]);
    }
    if case.sinks {
        sig.input("p.z", DType::F64, &[HEADS]);
    }
    sig.input("w", DType::F64, &[B, T, HEADS, D]);
    if case.packed {
        sig.input("segments", DType::S32, &[B, T]);
    }
    trace(&sig, |_, inp| {
        let mask = Mask { window: case.window, chunk: case.chunk, segments: inp.get("segments").cloned(), order: None };
        let attention = |p: &Tree| {
            let cast = |n: &str| p[n].astype(dtype);
            let sinks = p.get("z").map(|z| z.astype(dtype));
            attend_sinks(&cast("q"), &cast("k"), &cast("v"), &mask, how, &AttendOptions::default(), sinks.as_ref())
        };
        let forward = |p: &Tree| -> maxrs::tensor::Tensor {
            if remat {
                let policy = RematPolicy::SaveNames(vec!["context".into()]);
                checkpoint(
                    &policy,
                    RematFences { inputs: true, cotangents: true, wait_for_cotangents: false },
                    p,
                    |a| Tree::new().with("out", attention(a)),
                )["out"]
                    .clone()
            } else {
                attention(p)
            }
        };
        let out = forward(&inp.subtree("p"));
        let (_, grads) = value_and_grad(&inp.subtree("p"), |p| (forward(p).astype(DType::F64) * &inp["w"]).sum_all());
        grads.prefixed("grad").with("out", out.astype(DType::F64))
    })
    .expect("traces")
}

fn inputs(case: Case, seed: u64) -> Tree<HostTensor> {
    let mut r = rng(seed);
    let mut t = Tree::new();
    for (name, heads) in [("p.q", HEADS), ("p.k", KV_HEADS), ("p.v", KV_HEADS), ("w", HEADS)] {
        let n = (B * T * heads * D) as usize;
        t.insert(name, f64_tensor(&[B, T, heads, D], &uniform(&mut r, n, -1.5, 1.5)));
    }
    if case.packed {
        t.insert("segments", HostTensor::from_i32(&[B, T], &segments()));
    }
    if case.sinks {
        t.insert("p.z", f64_tensor(&[HEADS], &uniform(&mut r, HEADS as usize, -1.0, 2.0)));
    }
    t
}

/// Largest |a - b| over the largest |b|: the error relative to the tensor's scale.
fn scaled_diff(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
}

/// Blockwise against dot-product attention on `case`; returns the blockwise outputs.
fn compare(case: Case, dtype: DType, tolerance: f64) -> Tree<HostTensor> {
    let blockwise = run(&program(case, AttentionImpl::Blockwise { block: BLOCK }, dtype, false), &inputs(case, 7));
    let reference = run(&program(case, AttentionImpl::DotProduct, dtype, false), &inputs(case, 7));
    let sinks = case.sinks.then_some("grad.z");
    for name in ["out", "grad.q", "grad.k", "grad.v"].into_iter().chain(sinks) {
        let err = scaled_diff(&blockwise[name].to_f64(), &reference[name].to_f64());
        let (window, chunk, packed) = (case.window, case.chunk, case.packed);
        assert!(
            err < tolerance,
            "{dtype} window {window:?} chunk {chunk:?} packed {packed}: {name} differs by {err:e}"
        );
    }
    blockwise
}

/// In f32, without and with a window and packed documents; and with `context` saved, the
/// backward pass uses the saved output and log-sum-exp: the attention's forward appears once in
/// the differentiated program, and the gradients equal those without remat (once a test of its
/// own, `saving_context_skips_recomputing_blockwise_attention`; its remat-less program is this
/// comparison's first one, compiled once for both).
#[test]
fn blockwise_matches_dot_product_in_f32() {
    let plain = Case { window: None, chunk: None, packed: false, sinks: false };
    let blockwise = compare(plain, DType::F32, 2e-5);
    compare(Case { window: Some(6), chunk: None, packed: true, sinks: false }, DType::F32, 2e-5);
    compare(Case { window: Some(6), chunk: None, packed: false, sinks: true }, DType::F32, 2e-5);
    // Chunks of 12 tokens do not line up with the 8-token blocks.
    compare(Case { window: None, chunk: Some(12), packed: true, sinks: false }, DType::F32, 2e-5);

    let with_remat = program(plain, AttentionImpl::Blockwise { block: BLOCK }, DType::F32, true);
    // The plain forward (`out`) keeps its remat region; the loss's is inlined by autodiff, so
    // its attention is the one top-level composite, and a recomputation would add a second.
    let composites = with_remat.graph.eqns.iter().filter(|e| matches!(e.prim, Prim::Composite(_))).count();
    assert_eq!(composites, 1, "blockwise attention recomputed in the backward pass");
    let a = run(&with_remat, &inputs(plain, 7));
    for name in ["grad.q", "grad.k", "grad.v"] {
        assert!(scaled_diff(&a[name].to_f64(), &blockwise[name].to_f64()) < 1e-6, "{name}");
    }
}

#[test]
fn blockwise_matches_dot_product_in_bf16() {
    // bf16 rounds the matmul operands (8 significant bits): both paths round the same
    // operands, but at different points of the blocked sums.
    compare(Case { window: None, chunk: None, packed: true, sinks: false }, DType::BF16, 3e-2);
}

/// Central differences in f64 of `loss` along a few random directions agree with the
/// gradient's projections onto them.
#[test]
fn blockwise_gradient_matches_finite_differences() {
    let case = Case { window: Some(10), chunk: None, packed: true, sinks: true };
    let compiled =
        compile(&crate::common::client(), &program(case, AttentionImpl::Blockwise { block: BLOCK }, DType::F64, false))
            .expect("compiles");
    let base = inputs(case, 11);
    let grads = compiled.run(&crate::common::client(), &base).expect("runs");
    let loss = |inp: &Tree<HostTensor>| -> f64 {
        let out = compiled.run(&crate::common::client(), inp).expect("runs")["out"].to_f64();
        out.iter().zip(inp["w"].to_f64()).map(|(o, w)| o * w).sum()
    };
    let mut r = rng(3);
    let h = 1e-5;
    for name in ["q", "k", "v", "z"] {
        let x = base[&format!("p.{name}")].to_f64();
        let dims = base[&format!("p.{name}")].dims.clone();
        let g = grads[&format!("grad.{name}")].to_f64();
        let dir = uniform(&mut r, x.len(), -1.0, 1.0);
        let shifted = |sign: f64| {
            let mut inp = base.clone();
            let moved: Vec<f64> = x.iter().zip(&dir).map(|(a, d)| a + sign * h * d).collect();
            inp.insert(format!("p.{name}"), f64_tensor(&dims, &moved));
            loss(&inp)
        };
        let numeric = (shifted(1.0) - shifted(-1.0)) / (2.0 * h);
        let analytic: f64 = g.iter().zip(&dir).map(|(a, b)| a * b).sum();
        let err = (numeric - analytic).abs() / analytic.abs().max(1.0);
        assert!(err < 1e-6, "{name}: finite difference {numeric} vs gradient {analytic}");
    }
}

/// `rope_linear_scaling_factor` multiplies every timescale of the default RoPE, in every family
/// that has it (MaxText's `RotaryEmbedding.timescale`, `src/maxtext/layers/embeddings.py` at main
/// e591f30): the angle of position `p` in pair `i` is `p / (max_timescale^(2i / head_dim) *
/// factor)`. Llama 3.1's RoPE, which MaxText builds without it, refuses it.
#[test]
fn rope_linear_scaling_factor_scales_the_default_ropes_timescales() {
    use maxrs::model::attention::LayerContext;
    use maxrs::model::{config::ModelConfig, Model};
    let (t, head_dim, max_timescale, factor) = (7i64, 16i64, 500.0f64, 8.0f64);
    for block in ["llama2", "mistral", "qwen3", "gemma2"] {
        let args: Vec<String> = [
            format!("decoder_block={block}"),
            format!("head_dim={head_dim}"),
            format!("rope_max_timescale={max_timescale}"),
            format!("rope_linear_scaling_factor={factor}"),
        ]
        .into_iter()
        .chain(matches!(block, "mistral" | "gemma2").then(|| "sliding_window_size=4".to_string()))
        .collect();
        let c = maxrs::config::load(None, &args).unwrap();
        Model::from_config(&c).unwrap_or_else(|e| panic!("{block}: {e}"));
        let mc = ModelConfig::from_config(&c);
        let mut sig = Signature::new(None);
        sig.input("inputs", DType::S32, &[1, t]);
        let p = trace(&sig, |_, inp| {
            let ctx = LayerContext::new(&mc, &Tree::new().with("inputs", inp["inputs"].clone()));
            Tree::new().with("cos", ctx.cos.astype(DType::F64)).with("sin", ctx.sin.astype(DType::F64))
        })
        .unwrap();
        let out = run(&p, &Tree::new().with("inputs", HostTensor::from_i32(&[1, t], &vec![0; t as usize])));
        let (cos, sin) = (out["cos"].to_f64(), out["sin"].to_f64());
        let half = (head_dim / 2) as usize;
        for pos in 0..t as usize {
            for i in 0..half {
                let angle = pos as f64 / (max_timescale.powf(2.0 * i as f64 / head_dim as f64) * factor);
                let (c, s) = (cos[pos * half + i], sin[pos * half + i]);
                assert!((c - angle.cos()).abs() < 1e-5 && (s - angle.sin()).abs() < 1e-5, "{block}: p {pos} i {i}");
            }
        }
    }
    let refused = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Model::from_config(&maxrs::config::load(None, &args).unwrap()).unwrap_err().to_string()
    };
    let e = refused(&["rope_type=llama3.1", "rope_linear_scaling_factor=8"]);
    assert!(e.contains("Llama 3.1's RoPE") && e.contains("MaxText ignores it there"), "{e}");
    let e = refused(&["decoder_block=gpt3", "rope_linear_scaling_factor=8"]);
    assert!(e.contains("MaxText ignores it there"), "{e}");
}
