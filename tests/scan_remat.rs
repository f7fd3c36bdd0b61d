//! Structured transformations against their plain equivalents, through the CPU plugin:
//! gradients of a scanned layer stack equal those of the unrolled loop, and every remat
//! policy gives the gradients of no remat — while saving different residuals per iteration.

use crate::common::{f64_tensor, max_rel_diff, rng, run, uniform};
use maxrs::autodiff::value_and_grad;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Prim, Program, RematFences, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::tensor::{checkpoint, einsum, scan, trace, RematPolicy, Tensor, Tree};

const L: i64 = 3;
const B: i64 = 2;
const T: i64 = 4;
const D: i64 = 4;
const F: i64 = 6;

/// One pre-norm block: single-head attention and a SiLU MLP, with a per-layer row of a
/// captured table picked by a traced position counter.
fn layer(x: &Tensor, p: &Tree, pos: &Tensor, table: &Tensor) -> Tensor {
    let h = x.rms_norm(&p["scale"], 1e-6);
    let q = h.matmul(&p["wq"]).checkpoint_name("query_proj");
    let k = h.matmul(&p["wk"]);
    let scores = einsum("btd,bsd->bts", &[&q, &k]) * (1.0 / (D as f64).sqrt());
    let attn = einsum("bts,bsd->btd", &[&scores.softmax(-1), &h]);
    let x = x + &attn;
    let row = table.dynamic_slice(&[pos, &pos.zeros_like()], &[1, D]).reshape(&[D]);
    // Tagged like MaxText's MLP output: only added to the residual stream, so the backward
    // pass never reads it.
    let m = (x.rms_norm(&p["scale"], 1e-6).matmul(&p["wi"])).silu().matmul(&p["wo"]).checkpoint_name("mlpwo");
    &x + &m + &row
}

#[derive(Clone, Copy, Debug)]
enum Stack {
    Unrolled,
    Scanned,
}

fn signature() -> Signature {
    let mut sig = Signature::new(None);
    sig.input("x", DType::F64, &[B, T, D]);
    sig.input("table", DType::F64, &[L, D]);
    sig.input("params.scale", DType::F64, &[L, D]);
    sig.input("params.wq", DType::F64, &[L, D, D]);
    sig.input("params.wk", DType::F64, &[L, D, D]);
    sig.input("params.wi", DType::F64, &[L, D, F]);
    sig.input("params.wo", DType::F64, &[L, F, D]);
    sig
}

fn program(stack: Stack, policy: RematPolicy) -> Program {
    trace(&signature(), |ctx, inp| {
        let table = inp["table"].clone();
        let (loss, grads) = value_and_grad(&inp.subtree("params"), |params| {
            let block = |x: &Tensor, pos: &Tensor, p: &Tree| {
                let args = p.clone().with("x", x.clone()).with("pos", pos.clone());
                // Barriers only between unrolled layers (MaxText's `prevent_cse` is false with
                // scanned layers).
                let unrolled = matches!(stack, Stack::Unrolled);
                let fences = RematFences { inputs: unrolled, cotangents: unrolled, wait_for_cotangents: false };
                checkpoint(&policy, fences, &args, |a| Tree::new().with("x", layer(&a["x"], a, &a["pos"], &table)))["x"]
                    .clone()
            };
            let pos0 = ctx.scalar(0.0, DType::S32);
            let x = match stack {
                Stack::Unrolled => {
                    let mut x = inp["x"].clone();
                    for l in 0..L {
                        let p = params.map(|_, w| w.slice_axis(0, l, l + 1).squeeze(0));
                        x = block(&x, &ctx.scalar(l as f64, DType::S32), &p);
                    }
                    x
                }
                Stack::Scanned => {
                    let carry = Tree::new().with("x", inp["x"].clone()).with("pos", pos0);
                    let (c, _) = scan(&carry, params, |c, p| {
                        let x = block(&c["x"], &c["pos"], p);
                        (Tree::new().with("x", x).with("pos", &c["pos"] + 1), Tree::new())
                    });
                    c["x"].clone()
                }
            };
            (x.square().mean_all() + x.sum_all()) * 0.5
        });
        grads.prefixed("grad").with("loss", loss)
    })
    .expect("traces")
}

fn inputs() -> Tree<HostTensor> {
    let mut r = rng(7);
    signature()
        .inputs
        .iter()
        .map(|i| {
            let n = i.ty.shape.num_elements() as usize;
            (i.name.clone(), f64_tensor(&i.ty.shape, &uniform(&mut r, n, -0.5, 0.5)))
        })
        .collect()
}

fn results(p: &Program) -> Tree<Vec<f64>> {
    run(p, &inputs()).map(|_, t| t.to_f64())
}

fn assert_same(a: &Tree<Vec<f64>>, b: &Tree<Vec<f64>>, what: &str) {
    assert_eq!(a.names().collect::<Vec<_>>(), b.names().collect::<Vec<_>>());
    for (name, va) in a.iter() {
        let err = max_rel_diff(va, &b[name]);
        assert!(err < 1e-10, "{what}: {name} differs by {err:e}");
    }
}

/// Outputs of the forward scan (the one that is not reversed): carries, ys, then residuals.
fn forward_scan_outputs(p: &Program) -> usize {
    p.graph
        .eqns
        .iter()
        .find_map(|e| match &e.prim {
            Prim::Scan(s) if !s.reverse => Some(e.outputs.len()),
            _ => None,
        })
        .expect("a forward scan")
}

#[test]
fn scan_gradients_equal_unrolled_gradients() {
    let unrolled = results(&program(Stack::Unrolled, RematPolicy::None));
    let scanned = results(&program(Stack::Scanned, RematPolicy::None));
    assert!(unrolled["grad.wq"].iter().any(|g| g.abs() > 1e-3), "gradients are not trivially zero");
    assert_same(&unrolled, &scanned, "scan vs unrolled");
}

#[test]
fn remat_policies_give_the_gradients_of_no_remat() {
    let reference = results(&program(Stack::Unrolled, RematPolicy::None));
    for stack in [Stack::Unrolled, Stack::Scanned] {
        for policy in [RematPolicy::Full, RematPolicy::SaveNames(vec!["query_proj".into()])] {
            let got = results(&program(stack, policy.clone()));
            assert_same(&reference, &got, &format!("{stack:?} with {policy:?}"));
        }
    }
}

#[test]
fn remat_policy_decides_what_the_scan_saves() {
    let none = program(Stack::Scanned, RematPolicy::None);
    let full = program(Stack::Scanned, RematPolicy::Full);
    let names = program(Stack::Scanned, RematPolicy::SaveNames(vec!["query_proj".into()]));
    // Carries: x and pos. Full remat saves only x per iteration (pos picks a row of a table
    // nothing differentiates, so the backward pass never reads it); saving the query
    // projection adds exactly one residual; no remat saves many intermediates.
    assert_eq!(forward_scan_outputs(&full), 2 + 1);
    assert_eq!(forward_scan_outputs(&names), 2 + 2);
    assert!(forward_scan_outputs(&none) > 2 + 6, "no remat saves the layer's intermediates");
    assert!(!to_stablehlo(&none).contains("stablehlo.optimization_barrier"));
}

/// The unrolled layers' recomputation reads its inputs through an optimization barrier (so XLA
/// cannot merge it with the forward pass) and hands on its cotangents through another; the
/// scanned layer has neither (MaxText's `prevent_cse` is false with scanned layers): each
/// iteration stands alone, and the barriers made XLA copy each layer's slices of the stacked
/// weights, residuals and gradients instead of reading and writing them in place.
#[test]
fn only_unrolled_layers_are_fenced() {
    let barriers =
        |stack| to_stablehlo(&program(stack, RematPolicy::Full)).matches("stablehlo.optimization_barrier").count();
    assert_eq!(barriers(Stack::Unrolled), 2 * L as usize, "per layer: its inputs, its cotangents");
    assert_eq!(barriers(Stack::Scanned), 0);
}

/// Operands of the program's optimization barriers (the values fenced for recomputation).
fn fenced_values(p: &Program) -> usize {
    p.graph.eqns.iter().filter(|e| matches!(e.prim, Prim::OptimizationBarrier)).map(|e| e.inputs.len()).sum()
}

/// As JAX's `save_only_these_names`: a saved name is a residual only when the backward pass
/// reads it. `mlpwo` (the MLP's output, only added to the residual stream) is never read, so
/// saving it keeps nothing more than full remat, scanned or unrolled, with the same gradients.
#[test]
fn saved_names_the_backward_pass_does_not_read_are_not_kept() {
    let unread = RematPolicy::SaveNames(vec!["mlpwo".into()]);
    let read = RematPolicy::SaveNames(vec!["query_proj".into()]);
    assert_eq!(forward_scan_outputs(&program(Stack::Scanned, unread.clone())), 2 + 1);
    let full = fenced_values(&program(Stack::Unrolled, RematPolicy::Full));
    assert_eq!(fenced_values(&program(Stack::Unrolled, unread.clone())), full);
    assert_eq!(fenced_values(&program(Stack::Unrolled, read)), full + L as usize, "one saved value per layer");
    let reference = results(&program(Stack::Unrolled, RematPolicy::None));
    for stack in [Stack::Unrolled, Stack::Scanned] {
        assert_same(&reference, &results(&program(stack, unread.clone())), &format!("{stack:?} saving mlpwo"));
    }
}

/// Each layer's weight gradients leave its backward pass through the same optimization barrier
/// as the cotangent it hands on to the previous layer, so XLA cannot defer them to the end of
/// the backward pass. The first layer's input is not differentiated: its barrier fences only
/// weight gradients.
#[test]
fn a_layers_weight_gradients_are_fenced_with_its_input_cotangent() {
    let p = program(Stack::Unrolled, RematPolicy::Full);
    let fences = |e: &maxrs::ir::Eqn, shape: &[i64]| e.inputs.iter().any(|&v| &*p.graph.ty(v).shape == shape);
    let barriers: Vec<_> = p.graph.eqns.iter().filter(|e| matches!(e.prim, Prim::OptimizationBarrier)).collect();
    // The backward pass, last layer first: each layer's recomputation fence (its inputs), then
    // its cotangent fence.
    assert_eq!(barriers.len(), 2 * L as usize);
    for (layer, fence) in (0..L).rev().zip(barriers.iter().skip(1).step_by(2)) {
        for weight in [&[D][..], &[D, D], &[D, F], &[F, D]] {
            assert!(fences(fence, weight), "layer {layer}: no {weight:?} gradient in {fence:?}");
        }
        assert_eq!(fences(fence, &[B, T, D]), layer > 0, "layer {layer}: {fence:?}");
    }
}

#[test]
fn nested_scans_differentiate() {
    // An outer scan over groups of an inner scan over layers equals one flat scan.
    let mut sig = Signature::new(None);
    sig.input("h", DType::F64, &[3]);
    sig.input("w", DType::F64, &[2, 2, 3, 3]);
    let build = |nested: bool| {
        trace(&sig, |_, inp| {
            let (loss, g) = value_and_grad(&Tree::new().with("w", inp["w"].clone()), |p| {
                let step = |h: &Tensor, w: &Tensor| w.matmul(h).tanh();
                let h0 = Tree::new().with("h", inp["h"].clone());
                let out = if nested {
                    scan(&h0, p, |c, outer| {
                        let (c2, _) =
                            scan(c, outer, |c, inner| (Tree::new().with("h", step(&c["h"], &inner["w"])), Tree::new()));
                        (c2, Tree::new())
                    })
                    .0
                } else {
                    let flat = Tree::new().with("w", p["w"].reshape(&[4, 3, 3]));
                    scan(&h0, &flat, |c, x| (Tree::new().with("h", step(&c["h"], &x["w"])), Tree::new())).0
                };
                out["h"].sum_all()
            });
            g.with("loss", loss)
        })
        .unwrap()
    };
    let mut r = rng(3);
    let inp = Tree::new()
        .with("h", f64_tensor(&[3], &uniform(&mut r, 3, -1.0, 1.0)))
        .with("w", f64_tensor(&[2, 2, 3, 3], &uniform(&mut r, 36, -1.0, 1.0)));
    let a = run(&build(true), &inp).map(|_, t| t.to_f64());
    let b = run(&build(false), &inp).map(|_, t| t.to_f64());
    assert_same(&a, &b, "nested vs flat scan");
}

#[test]
fn gradient_accumulation_over_microbatches_equals_the_full_batch_gradient() {
    // MaxText's gradient accumulation: `value_and_grad` over outer parameters inside a scan
    // body over microbatches; the mean of the microbatch gradients is the full-batch gradient.
    let mut sig = Signature::new(None);
    sig.input("params.w", DType::F64, &[4, 3]);
    sig.input("params.b", DType::F64, &[3]);
    sig.input("x", DType::F64, &[8, 4]);
    let loss = |p: &Tree, x: &Tensor| (x.matmul(&p["w"]) + &p["b"]).tanh().log_softmax(-1).mean_all();
    let accumulated = trace(&sig, |_, inp| {
        let params = inp.subtree("params");
        let zero = params.map(|_, t| t.zeros_like());
        let microbatches = Tree::new().with("x", inp["x"].reshape(&[4, 2, 4]));
        let (acc, _) = scan(&zero, &microbatches, |acc, mb| {
            let (_, g) = value_and_grad(&params, |p| loss(p, &mb["x"]));
            (acc.map(|name, a| a + &(&g[name] * 0.25)), Tree::new())
        });
        acc
    })
    .unwrap();
    let full = trace(&sig, |_, inp| value_and_grad(&inp.subtree("params"), |p| loss(p, &inp["x"])).1).unwrap();
    let mut r = rng(5);
    let host: Tree<HostTensor> = sig
        .inputs
        .iter()
        .map(|i| {
            (i.name.clone(), f64_tensor(&i.ty.shape, &uniform(&mut r, i.ty.shape.num_elements() as usize, -1.0, 1.0)))
        })
        .collect();
    let a = run(&accumulated, &host).map(|_, t| t.to_f64());
    let b = run(&full, &host).map(|_, t| t.to_f64());
    assert_same(&a, &b, "accumulated vs full batch");
}

/// An outer tensor combined with a body tensor is captured as it is and broadcast inside the
/// body: broadcast outside, a full-size copy of it would be a loop operand.
#[test]
fn implicit_broadcasts_of_outer_tensors_happen_inside_the_body() {
    let mut sig = Signature::new(None);
    sig.input("xs", DType::F32, &[L, B, T, D]);
    sig.input("row", DType::F32, &[D]);
    let p = trace(&sig, |ctx, inp| {
        let row = inp["row"].clone();
        let carry = Tree::new().with("acc", ctx.zeros(DType::F32, &[B, T, D]));
        let (c, _) = scan(&carry, &Tree::new().with("x", inp["xs"].clone()), |c, x| {
            (Tree::new().with("acc", &c["acc"] + &(&x["x"] * &row)), Tree::new())
        });
        c
    })
    .expect("traces");
    let (eqn, s) = p
        .graph
        .eqns
        .iter()
        .find_map(|e| match &e.prim {
            Prim::Scan(s) => Some((e, s)),
            _ => None,
        })
        .expect("a scan");
    let consts: Vec<&[i64]> = eqn.inputs[..s.num_consts].iter().map(|&v| &*p.graph.ty(v).shape).collect();
    assert_eq!(consts, [&[D][..]], "the row is captured unbroadcast");
}

/// The shapes and dtypes of each optimization barrier's operands in `p`, in program order.
fn barriers(p: &Program) -> Vec<Vec<(DType, Vec<i64>)>> {
    let operand = |v| (p.graph.ty(v).dtype, p.graph.ty(v).shape.to_vec());
    let fences = p.graph.eqns.iter().filter(|e| matches!(e.prim, Prim::OptimizationBarrier));
    fences.map(|e| e.inputs.iter().map(|&v| operand(v)).collect()).collect()
}

/// MaxText's `minimal_flash` (`minimal_policy(with_context=True)` in `src/maxtext/layers/decoders.py`
/// at e591f30) on a llama2: each layer keeps its query, key and value projections, its attention
/// output projection and both MLP input projections (`mlpwo` is only added to the residual
/// stream: nothing reads it), and `context` only where the attention kernel names it (flash and
/// cuDNN attention in `src/maxtext/layers/attention_op.py`; `apply_attention_dot` names
/// nothing). The train step of a two-layer bf16 llama keeps exactly these: the operands of each
/// layer's recomputation fence besides its parameters, input and RoPE tables. Every weight
/// gradient leaves the backward pass in bf16, the dtype of its product (the optimizer makes the
/// f32 copy), each product's together with its input's cotangent unless that input must be
/// recomputed through products (the attention output without `context`), and the head's before
/// the last layer's (issue 46: each of these was a GiB-sized difference from MaxText's step).
#[test]
fn minimal_flash_keeps_maxtexts_residuals_and_fences_bf16_weight_gradients() {
    use maxrs::config;
    use maxrs::train::step::TrainStep;
    let (b, t, e, m, heads, kv, d, vocab) = (2, 32, 48, 80, 4, 2, 16, 96);
    let bf16 = |shape: &[i64]| (DType::BF16, shape.to_vec());
    for attention in ["dot_product", "flash"] {
        let args = [
            "model_name=llama2-7b".to_string(),
            "override_model_config=true".into(),
            format!("base_emb_dim={e}"),
            format!("base_mlp_dim={m}"),
            format!("base_num_query_heads={heads}"),
            format!("base_num_kv_heads={kv}"),
            format!("head_dim={d}"),
            format!("vocab_size={vocab}"),
            "base_num_decoder_layers=2".into(),
            format!("per_device_batch_size={b}"),
            format!("max_target_length={t}"),
            "dtype=bfloat16".into(),
            "scan_layers=false".into(),
            "remat_policy=minimal_flash".into(),
            format!("attention={attention}"),
        ];
        let c = config::load(None, &args).expect("loads");
        let derived = config::validate(&c, 1, 1).expect("valid");
        let fences = barriers(&TrainStep::new(&c, &derived, None).expect("step").train_step().expect("traces"));
        // A layer's recomputation fence reads its f32 parameters; the RoPE tables are f32 too.
        let (recompute, cotangents): (Vec<_>, Vec<_>) =
            fences.iter().partition(|ops| ops.contains(&(DType::F32, vec![e, m])));
        let mut kept = vec![
            bf16(&[b, t, e]), // the layer's input
            bf16(&[b, t, heads, d]),
            bf16(&[b, t, kv, d]),
            bf16(&[b, t, kv, d]),
            bf16(&[b, t, e]), // out_proj
            bf16(&[b, t, m]),
            bf16(&[b, t, m]),
        ];
        if attention == "flash" {
            kept.extend([bf16(&[b, t, heads, d]), (DType::F32, vec![b, heads, t])]);
        }
        kept.sort_by_key(|(dtype, shape)| (dtype.name(), shape.clone()));
        assert_eq!(recompute.len(), 2, "{attention}: one recomputation per layer");
        for ops in &recompute {
            let mut activations: Vec<_> = ops
                .iter()
                .filter(|(dtype, shape)| shape[0] == b && (*dtype == DType::BF16 || shape[2] == t))
                .cloned()
                .collect();
            activations.sort_by_key(|(dtype, shape)| (dtype.name(), shape.clone()));
            assert_eq!(activations, kept, "{attention}: the residuals of a layer ({ops:?})");
        }
        let weights = [vec![e, m], vec![m, e], vec![e, kv, d], vec![e, heads, d], vec![heads, d, e], vec![e, vocab]];
        for ops in &cotangents {
            for (dtype, shape) in ops.iter().filter(|(_, shape)| weights.contains(shape)) {
                assert_eq!(*dtype, DType::BF16, "{attention}: a {shape:?} weight gradient in {ops:?}");
            }
        }
        assert!(cotangents[0].contains(&bf16(&[e, vocab])) && cotangents[0].contains(&bf16(&[b, t, e])), "the head's");
        let pairs = |a: &[i64], w: &[i64]| cotangents.iter().filter(|ops| ops[..] == [bf16(a), bf16(w)]).count();
        assert_eq!(pairs(&[b, t, m], &[m, e]), 2, "{attention}: the MLP output product's, per layer");
        assert_eq!(pairs(&[b, t, e], &[e, m]), 4, "{attention}: both MLP input products', per layer");
        assert_eq!(pairs(&[b, t, e], &[e, heads, d]), 2, "{attention}: the query product's, per layer");
        let context_saved = if attention == "flash" { 2 } else { 0 };
        assert_eq!(pairs(&[b, t, heads, d], &[heads, d, e]), context_saved, "{attention}: the output projection's");
    }
}
