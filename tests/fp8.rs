//! fp8 (issues 30 and 43) through the CPU plugin: the 8-bit float converts against an
//! independent rounding (every value of the format, nearest, ties to the even bit pattern), and
//! flax's direct fp8 product (`model::fp8::dot`: delayed scaling, the 8-bit values multiplied by
//! `dot_general` with the scales on the result, amax histories, the new state as the state's
//! gradient) over three steps against an f64 reference written here, with its three products on
//! 8-bit operands in the lowered program.

use crate::common::{rng, run, uniform};
use maxrs::autodiff::value_and_grad_with_aux;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, DotDims, Program, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::model::fp8::{self, AMAX_HISTORY_LENGTH, STATE};
use maxrs::tensor::{trace, Tree};

/// An 8-bit float format as the reference sees it: `ml_dtypes`' float8_e4m3fn (bias 7, 3
/// mantissa bits, largest 448) or float8_e5m2 (bias 15, 2 mantissa bits, largest 57344).
#[derive(Clone, Copy)]
pub(crate) struct Format {
    exponent_bits: u32,
    mantissa_bits: u32,
    max: f64,
}

pub(crate) const E4M3FN: Format = Format { exponent_bits: 4, mantissa_bits: 3, max: 448.0 };
pub(crate) const E5M2: Format = Format { exponent_bits: 5, mantissa_bits: 2, max: 57344.0 };

impl Format {
    /// Every non-negative finite value with its bit pattern.
    fn values(self) -> Vec<(f64, u8)> {
        let bias = (1i32 << (self.exponent_bits - 1)) - 1;
        let mut out = Vec::new();
        for bits in 0u8..0x80 {
            let e = (bits >> self.mantissa_bits) as i32;
            let m = (bits & ((1 << self.mantissa_bits) - 1)) as f64 / (1u32 << self.mantissa_bits) as f64;
            let v = if e == 0 { m * 2f64.powi(1 - bias) } else { (1.0 + m) * 2f64.powi(e - bias) };
            if v <= self.max {
                out.push((v, bits));
            }
        }
        out
    }

    /// The nearest value (ties to the even bit pattern) of a `v` within +-max, with its bits.
    fn round(self, v: f64) -> (f64, u8) {
        let (mut best, mut bits) = (f64::INFINITY, 0u8);
        for (value, b) in self.values() {
            let (d, db) = ((v.abs() - value).abs(), (v.abs() - best).abs());
            if d < db || (d == db && b % 2 == 0) {
                (best, bits) = (value, b);
            }
        }
        let sign = if v < 0.0 { 0x80 } else { 0 };
        (best.copysign(v), bits | sign)
    }

    pub(crate) fn qdq(self, v: &[f64], scale: f64) -> Vec<f64> {
        v.iter().map(|x| self.round((x / scale).clamp(-self.max, self.max)).0 * scale).collect()
    }
}

/// `convert` f32 -> f8 and f8 -> f32 on the CPU plugin: every bit pattern of both formats
/// decodes to the reference value, f32 values (random, ties, subnormals, negative zero) round
/// to the reference's bit patterns, and f8 constants keep theirs.
#[test]
fn f8_converts_on_the_cpu_plugin_match_the_reference_rounding() {
    let mut x: Vec<f64> = uniform(&mut rng(30), 200, -440.0, 440.0);
    x.extend(uniform(&mut rng(31), 100, -0.05, 0.05));
    // Ties (to even): e4m3 at 1 (spacing 1/8) and in its subnormals (2^-9), e5m2 at 1 (1/4).
    x.extend([1.0625, 1.1875, -1.0625, 1.5 * 2f64.powi(-9), 2.5 * 2f64.powi(-9), 1.125, 1.375, 0.0, -0.0]);
    let n = x.len() as i64;
    let mut sig = Signature::new(None);
    sig.input("x", DType::F32, &[n]);
    sig.input("a", DType::F8E4M3FN, &[256]);
    sig.input("b", DType::F8E5M2, &[256]);
    let program = trace(&sig, |ctx, inp| {
        Tree::new()
            // Constants are lowered as their bit patterns.
            .with("c_e4m3", ctx.full(-3.25, DType::F8E4M3FN, &[2]))
            .with("c_e5m2", ctx.full(57344.0, DType::F8E5M2, &[1]))
            .with("x_e4m3", inp["x"].astype(DType::F8E4M3FN))
            .with("x_e5m2", inp["x"].astype(DType::F8E5M2))
            .with("a", inp["a"].astype(DType::F32))
            .with("b", inp["b"].astype(DType::F32))
    })
    .unwrap();
    let bits: Vec<u8> = (0..=255).collect();
    let host = Tree::new()
        .with("x", HostTensor::from_f32(&[n], &x.iter().map(|&v| v as f32).collect::<Vec<_>>()))
        .with("a", HostTensor::new(maxrs::host::DType::F8E4M3FN, &[256], bits.clone()))
        .with("b", HostTensor::new(maxrs::host::DType::F8E5M2, &[256], bits.clone()));
    let out = run(&program, &host);
    for (name, format) in [("x_e4m3", E4M3FN), ("x_e5m2", E5M2)] {
        let want: Vec<u8> = x.iter().map(|&v| format.round(v as f32 as f64).1).collect();
        let got = &out[name].data;
        let wrong: Vec<String> = (0..x.len())
            .filter(|&i| got[i] != want[i] && !(x[i] == 0.0 && got[i] & 0x7F == 0))
            .map(|i| format!("{} -> {:#04x}, want {:#04x}", x[i], got[i], want[i]))
            .collect();
        assert!(wrong.is_empty(), "{name}: {}", wrong.join("; "));
    }
    for (name, format) in [("a", E4M3FN), ("b", E5M2)] {
        let got = out[name].to_f64();
        for (value, b) in format.values() {
            assert_eq!(got[b as usize], value, "{name} {b:#04x}");
            assert_eq!(got[b as usize | 0x80], -value, "{name} {:#04x}", b | 0x80);
        }
    }
    assert_eq!((out["c_e4m3"].data.clone(), out["c_e5m2"].data.clone()), (vec![0xC5, 0xC5], vec![0x7B]));
    // The codes past the finite values: e4m3fn's 0x7F is NaN; e5m2's 0x7C is infinity.
    assert!(out["a"].to_f64()[0x7F].is_nan());
    assert_eq!(out["b"].to_f64()[0x7C], f64::INFINITY);
}

/// One product's state in the reference: scale and amax history.
#[derive(Clone)]
pub(crate) struct Meta {
    pub(crate) scale: f64,
    pub(crate) history: Vec<f64>,
}

impl Meta {
    pub(crate) fn new() -> Meta {
        Meta { scale: 1.0, history: vec![0.0; AMAX_HISTORY_LENGTH as usize] }
    }

    /// flax's `compute_scale` (margin 0) and `compute_amax_history` (`jnp.roll(h, -1)`, then
    /// the new amax at index 0), as `fp8_ops.py` writes them.
    pub(crate) fn update(&self, format: Format, v: &[f64]) -> Meta {
        let amax = self.history.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let scale = if amax > 0.0 && amax.is_finite() { amax / format.max } else { self.scale };
        let n = self.history.len();
        let mut history: Vec<f64> = (0..n).map(|i| self.history[(i + 1) % n]).collect();
        history[0] = v.iter().map(|x| x.abs()).fold(0.0, f64::max);
        Meta { scale, history }
    }
}

/// `out[m, n] = sum_k a[m, k] b[k, n]` for row-major `a: [rows, inner]`, `b: [inner, cols]`.
pub(crate) fn matmul(a: &[f64], b: &[f64], rows: usize, inner: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for m in 0..rows {
        for k in 0..inner {
            for n in 0..cols {
                out[m * cols + n] += a[m * inner + k] * b[k * cols + n];
            }
        }
    }
    out
}

pub(crate) fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..cols * rows).map(|i| a[(i % rows) * cols + i / rows]).collect()
}

pub(crate) fn assert_close(what: &str, got: &[f64], want: &[f64]) {
    let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max).max(1e-30);
    let err = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max) / scale;
    assert!(err < 1e-5, "{what}: max error {err:e} of the largest value {scale:e}\ngot  {got:?}\nwant {want:?}");
}

/// `x`'s last dim contracted with `k`'s first (`x @ k`), as the fp8 product takes it.
fn last_with_first(x_rank: usize) -> DotDims {
    DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![x_rank - 1], rhs_contract: vec![0] }
}

/// The element types of every `dot_general` of `program`'s lowering: its two operands' (in
/// sorted order) and its result's.
fn dot_types(program: &Program) -> Vec<[String; 3]> {
    let element = |t: &str| t.split('>').next().and_then(|t| t.rsplit('x').next()).unwrap_or_default().to_string();
    to_stablehlo(program)
        .lines()
        .filter(|l| l.contains("stablehlo.dot_general"))
        .map(|l| {
            let types: Vec<String> = l.rsplit(" : ").next().unwrap().split("tensor<").skip(1).map(element).collect();
            let mut operands = [types[0].clone(), types[1].clone()];
            operands.sort();
            let [a, b] = operands;
            [a, b, types[2].clone()]
        })
        .collect()
}

/// The forward product on two e4m3fn operands and the two backward products on the e5m2
/// gradient and an e4m3fn operand, each accumulating into f32: no product on dequantized values.
fn assert_fp8_products(program: &Program) {
    let mut dots = dot_types(program);
    dots.sort();
    let want = |a: &str, b: &str| [a.to_string(), b.to_string(), "f32".to_string()];
    let (e4m3, e5m2) = ("f8E4M3FN", "f8E5M2");
    assert_eq!(dots, [want(e4m3, e4m3), want(e4m3, e5m2), want(e4m3, e5m2)]);
}

/// Three steps of `y = x @ k` as an fp8 product in f32 with `loss = sum(y * w)`, each step's
/// new state fed to the next, at magnitudes that make step 2 clip (`x` far beyond the
/// history's amax, the gradient far beyond its own) and step 3 quantize into the subnormals:
/// `y`, the gradients of `x` and `k`, and the new scales and histories match the reference, and
/// all three products take 8-bit operands.
#[test]
fn fp8_product_and_delayed_scaling_match_an_f64_reference_over_three_steps() {
    let (rows, inner, cols) = (6usize, 4usize, 5usize);
    let h = AMAX_HISTORY_LENGTH;
    let mut sig = Signature::new(None);
    sig.input("x", DType::F32, &[2, 3, inner as i64]);
    sig.input("k", DType::F32, &[inner as i64, cols as i64]);
    sig.input("w", DType::F32, &[2, 3, cols as i64]);
    for name in STATE {
        sig.input(&format!("op.{name}"), DType::F32, &[if name.ends_with("_scale") { 1 } else { h }]);
    }
    let program = trace(&sig, |_, inp| {
        let vars = inp.subtree("op").prefixed("op").with("x", inp["x"].clone()).with("k", inp["k"].clone());
        let (_, aux, grads) = value_and_grad_with_aux(&vars, |v| {
            let y = fp8::dot(v, "op", &v["x"], &v["k"], &last_with_first(3));
            ((&y * &inp["w"]).sum_all(), Tree::new().with("y", y))
        });
        let mut out = grads.prefixed("grad");
        out.extend(aux);
        out
    })
    .unwrap();
    assert_fp8_products(&program);

    let (mut mx, mut mk, mut mg) = (Meta::new(), Meta::new(), Meta::new());
    let mut state: Tree<HostTensor> = Tree::new();
    for name in STATE {
        let value = if name.ends_with("_scale") { vec![1.0f32] } else { vec![0.0; h as usize] };
        state.insert(format!("op.{name}"), HostTensor::from_f32(&[value.len() as i64], &value));
    }
    let mut r = rng(300);
    for (step, (a, b, c)) in [(3.0, 0.5, 1e-3), (500.0, 0.5, 2.0), (0.01, 40.0, 2.0)].into_iter().enumerate() {
        let f32s = |v: Vec<f64>| v.iter().map(|&x| x as f32 as f64).collect::<Vec<_>>();
        let x = f32s(uniform(&mut r, rows * inner, -a, a));
        let k = f32s(uniform(&mut r, inner * cols, -b, b));
        let w = f32s(uniform(&mut r, rows * cols, -c, c));
        let host_f32 =
            |dims: &[i64], v: &[f64]| HostTensor::from_f32(dims, &v.iter().map(|&x| x as f32).collect::<Vec<_>>());
        let mut inputs = state.clone();
        inputs.insert("x", host_f32(&[2, 3, inner as i64], &x));
        inputs.insert("k", host_f32(&[inner as i64, cols as i64], &k));
        inputs.insert("w", host_f32(&[2, 3, cols as i64], &w));
        let out = run(&program, &inputs);

        let (nx, nk, ng) = (mx.update(E4M3FN, &x), mk.update(E4M3FN, &k), mg.update(E5M2, &w));
        let (xq, kq, gq) = (E4M3FN.qdq(&x, nx.scale), E4M3FN.qdq(&k, nk.scale), E5M2.qdq(&w, ng.scale));
        let at = |what: &str| format!("step {step}: {what}");
        assert_close(&at("y"), &out["y"].to_f64(), &matmul(&xq, &kq, rows, inner, cols));
        assert_close(&at("dx"), &out["grad.x"].to_f64(), &matmul(&gq, &transpose(&kq, inner, cols), rows, cols, inner));
        assert_close(&at("dk"), &out["grad.k"].to_f64(), &matmul(&transpose(&xq, rows, inner), &gq, inner, rows, cols));
        for (prefix, meta) in [("input", &nx), ("kernel", &nk), ("output_grad", &ng)] {
            let scale = out[&format!("grad.op.{prefix}_scale")].to_f64();
            assert!(
                (scale[0] - meta.scale).abs() <= 1e-6 * meta.scale,
                "{}: {prefix}_scale {scale:?}, want {}",
                at(""),
                meta.scale
            );
            assert_close(
                &at(&format!("{prefix}_amax_history")),
                &out[&format!("grad.op.{prefix}_amax_history")].to_f64(),
                &meta.history,
            );
        }
        for name in STATE {
            state.insert(format!("op.{name}"), out[&format!("grad.op.{name}")].clone());
        }
        (mx, mk, mg) = (nx, nk, ng);
    }
}

/// `te_fp8_currentscaling`'s product (`model::fp8::dot_current`): `x`, `k` and the output's
/// gradient each quantized with the scale of its own amax, no state; against the reference, its
/// three products on 8-bit operands.
#[test]
fn current_scaling_product_matches_an_f64_reference() {
    let (rows, inner, cols) = (6usize, 4usize, 5usize);
    let mut sig = Signature::new(None);
    sig.input("x", DType::F32, &[rows as i64, inner as i64]);
    sig.input("k", DType::F32, &[inner as i64, cols as i64]);
    sig.input("w", DType::F32, &[rows as i64, cols as i64]);
    let program = trace(&sig, |_, inp| {
        let vars = Tree::new().with("x", inp["x"].clone()).with("k", inp["k"].clone());
        let (_, aux, grads) = value_and_grad_with_aux(&vars, |v| {
            let y = fp8::dot_current(&v["x"], &v["k"], &last_with_first(2));
            ((&y * &inp["w"]).sum_all(), Tree::new().with("y", y))
        });
        let mut out = grads.prefixed("grad");
        out.extend(aux);
        out
    })
    .unwrap();
    assert_fp8_products(&program);
    let mut r = rng(301);
    let f32s = |v: Vec<f64>| v.iter().map(|&x| x as f32 as f64).collect::<Vec<_>>();
    let (x, k, w) = (
        f32s(uniform(&mut r, rows * inner, -3.0, 3.0)),
        f32s(uniform(&mut r, inner * cols, -0.5, 0.5)),
        f32s(uniform(&mut r, rows * cols, -2e-3, 2e-3)),
    );
    let host = |dims: &[usize], v: &[f64]| {
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        HostTensor::from_f32(&dims, &v.iter().map(|&x| x as f32).collect::<Vec<_>>())
    };
    let inputs = Tree::new()
        .with("x", host(&[rows, inner], &x))
        .with("k", host(&[inner, cols], &k))
        .with("w", host(&[rows, cols], &w));
    let out = run(&program, &inputs);
    let scale = |format: Format, v: &[f64]| v.iter().map(|a| a.abs()).fold(0.0, f64::max) / format.max;
    let (xq, kq, gq) =
        (E4M3FN.qdq(&x, scale(E4M3FN, &x)), E4M3FN.qdq(&k, scale(E4M3FN, &k)), E5M2.qdq(&w, scale(E5M2, &w)));
    assert_close("y", &out["y"].to_f64(), &matmul(&xq, &kq, rows, inner, cols));
    assert_close("dx", &out["grad.x"].to_f64(), &matmul(&gq, &transpose(&kq, inner, cols), rows, cols, inner));
    assert_close("dk", &out["grad.k"].to_f64(), &matmul(&transpose(&xq, rows, inner), &gq, inner, rows, cols));
}

/// `quantization=fp8` trains the small model (f32) with the fp8 state in the train state: every
/// product's state has moved after two steps (scales from the first step's amaxes, histories
/// holding both steps' amaxes), the checkpoint holds it (`fp8.safetensors`), and a run resumed
/// from it carries it on: two steps later the histories still hold the first two steps' amaxes.
/// The four fp8 steps' losses are those of the unquantized run within 1%.
#[test]
fn fp8_training_checkpoints_and_resumes_its_scaling_state() {
    use crate::checkpoint_resume::{small, state_expected};
    use maxrs::checkpoint::{dir, manifest};
    use maxrs::files::Location;
    use maxrs::pjrt::cpu_client;

    let base = tempfile::tempdir().unwrap();
    let dir_arg = format!("base_output_directory={}", base.path().display());
    let run = |steps: &str| {
        let args = ["quantization=fp8", "per_device_batch_size=4", "enable_checkpointing=true", "run_name=q", &dir_arg];
        let c = maxrs::config::load(None, &small(&[&args[..], &["checkpoint_period=1", steps]].concat())).unwrap();
        (maxrs::train::run::train(&c, &cpu_client(1).unwrap()).unwrap(), c)
    };
    let (first, c) = run("steps=2");
    let (second, _) = run("steps=4");
    assert_eq!(second.first_step, 2);
    // The fp8 losses follow the unquantized run's within 1% (tools/fp8_loss_curve compares
    // 200 steps on text).
    let plain = small(&["per_device_batch_size=4", "steps=4"]);
    let plain = maxrs::train::run::train(&maxrs::config::load(None, &plain).unwrap(), &cpu_client(1).unwrap()).unwrap();
    let fp8: Vec<f64> = first.losses.iter().chain(&second.losses).copied().collect();
    for (q, p) in fp8.iter().zip(&plain.losses) {
        assert!((q - p).abs() <= 0.01 * p, "fp8 losses {fp8:?}, unquantized {:?}", plain.losses);
    }

    let model = maxrs::model::Model::from_config(&c).unwrap();
    let load = |step: u64| {
        let at = Location::Local(base.path().join(format!("q/checkpoints/{step}")));
        let loaded = dir::load(&at, &state_expected(&c), &manifest::model_keys(&c, &model), false).unwrap();
        loaded.arrays.into_iter().filter(|(n, _)| n.starts_with("fp8.")).collect::<Vec<_>>()
    };
    let (after_two, after_four) = (load(1), load(3));
    // 7 products (query, key, value, out, wi_0, wi_1, wo) x 6 arrays, stacked over the layers.
    assert_eq!(after_two.len(), 42);
    for ((name, two), (_, four)) in after_two.iter().zip(&after_four) {
        let (two, four) = (two.to_f64(), four.to_f64());
        let n = two.len() / c.base_num_decoder_layers as usize;
        for (l, (row, later)) in two.chunks(n).zip(four.chunks(n)).enumerate() {
            if name.ends_with("_scale") {
                assert!(row[0] != 1.0 && row[0] > 0.0, "{name} layer {l}: {row:?}");
            } else {
                // After step 1: [a1, 0, ..., 0, a0]; after step 3: [a3, 0, ..., a0, a1, a2].
                assert!(row[0] > 0.0 && row[n - 1] > 0.0, "{name} layer {l}");
                assert!(row[1..n - 1].iter().all(|&a| a == 0.0), "{name} layer {l}");
                assert_eq!((later[n - 3], later[n - 2]), (row[n - 1], row[0]), "{name} layer {l} after resuming");
            }
        }
    }
}
