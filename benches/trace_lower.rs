//! Benchmark: trace, differentiate and lower a Llama-style transformer (llama2-7b shapes:
//! emb 4096, 32 heads of 128, mlp 11008, vocab 32000, seq 2048, batch 4; nothing runs) with
//! scan_layers on and off, and print median times and MLIR sizes. Before timing, a tiny
//! configuration of the same model is compiled and run on the CPU plugin: its initial loss must
//! be close to ln(vocab), so the benchmarked graph is a real, valid program.
//!
//! `cargo bench --bench trace_lower` (optionally `-- <runs>`).

use maxrs::autodiff::value_and_grad_program;
use maxrs::ir::{DType, Program, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::pjrt::{cpu_client, HostTensor};
use maxrs::runtime::run_program;
use maxrs::sharding::{LogicalRules, Mesh, PartitionSpec};
use maxrs::tensor::{checkpoint, concatenate, einsum, scan, trace, where_, RematPolicy, Tensor, Trace, Tree};
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

#[derive(Clone)]
struct Config {
    layers: i64,
    emb: i64,
    heads: i64,
    head_dim: i64,
    mlp: i64,
    vocab: i64,
    seq: i64,
    batch: i64,
    scan_layers: bool,
    remat: RematPolicy,
}

impl Config {
    fn llama2_7b(layers: i64, scan_layers: bool, remat: RematPolicy) -> Config {
        Config {
            layers,
            emb: 4096,
            heads: 32,
            head_dim: 128,
            mlp: 11008,
            vocab: 32000,
            seq: 2048,
            batch: 4,
            scan_layers,
            remat,
        }
    }
}

/// Per-layer parameters: name, shape, logical axis names.
fn layer_params(c: &Config) -> Vec<(&'static str, Vec<i64>, Vec<&'static str>)> {
    let (e, h, k, m) = (c.emb, c.heads, c.head_dim, c.mlp);
    vec![
        ("pre_self_attention_layer_norm.scale", vec![e], vec!["norm"]),
        ("self_attention.query.kernel", vec![e, h, k], vec!["embed", "heads", "kv"]),
        ("self_attention.key.kernel", vec![e, h, k], vec!["embed", "heads", "kv"]),
        ("self_attention.value.kernel", vec![e, h, k], vec!["embed", "heads", "kv"]),
        ("self_attention.out.kernel", vec![h, k, e], vec!["heads", "kv", "embed"]),
        ("post_self_attention_layer_norm.scale", vec![e], vec!["norm"]),
        ("mlp.wi_0.kernel", vec![e, m], vec!["embed", "mlp"]),
        ("mlp.wi_1.kernel", vec![e, m], vec!["embed", "mlp"]),
        ("mlp.wo.kernel", vec![m, e], vec!["mlp", "embed"]),
    ]
}

/// All parameters with MaxText's names (stacked under `decoder.layers` with scan_layers).
fn params(c: &Config) -> Vec<(String, Vec<i64>, Vec<&'static str>)> {
    let mut out = vec![
        ("token_embedder.embedding".to_string(), vec![c.vocab, c.emb], vec!["vocab", "embed"]),
        ("decoder.decoder_norm.scale".to_string(), vec![c.emb], vec!["norm"]),
        ("decoder.logits_dense.kernel".to_string(), vec![c.emb, c.vocab], vec!["embed", "vocab"]),
    ];
    for (name, dims, logical) in layer_params(c) {
        if c.scan_layers {
            let stacked = std::iter::once(c.layers).chain(dims).collect();
            out.push((format!("decoder.layers.{name}"), stacked, std::iter::once("layers").chain(logical).collect()));
        } else {
            for l in 0..c.layers {
                out.push((format!("decoder.layers_{l}.{name}"), dims.clone(), logical.clone()));
            }
        }
    }
    out
}

fn signature(c: &Config, mesh: Option<Mesh>) -> Signature {
    let rules = LogicalRules::maxtext();
    let mut sig = Signature::new(mesh.clone());
    for (name, dims, logical) in params(c) {
        let input = sig.input(&format!("params.{name}"), DType::F32, &dims);
        if let Some(m) = &mesh {
            input.sharded(rules.spec(&logical, m));
        }
    }
    for name in ["inputs", "targets"] {
        let input = sig.input(name, DType::S32, &[c.batch, c.seq]);
        if let Some(m) = &mesh {
            input.sharded(rules.spec(&["activation_batch", "activation_length"], m));
        }
    }
    sig
}

/// Rotary embedding on `[b, t, h, k]` with precomputed `[t, k/2]` tables.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let (t, k) = (x.shape()[1], x.shape()[3]);
    let shape = x.shape().to_vec();
    let half = |v: &Tensor| v.astype(x.dtype()).broadcast_in_dim(&[shape[0], t, shape[2], k / 2], &[1, 3]);
    let (cos, sin) = (half(cos), half(sin));
    let (x1, x2) = (x.slice_axis(3, 0, k / 2), x.slice_axis(3, k / 2, k));
    concatenate(&[&(&x1 * &cos - &x2 * &sin), &(&x2 * &cos + &x1 * &sin)], 3)
}

struct Shared {
    cos: Tensor,
    sin: Tensor,
    mask: Tensor,
    activation: Option<PartitionSpec>,
}

fn constrain(x: Tensor, s: &Shared) -> Tensor {
    match &s.activation {
        Some(spec) => x.with_sharding_constraint(spec),
        None => x,
    }
}

/// One decoder layer (bf16 activations, f32 weights cast at use).
fn decoder_layer(x: &Tensor, p: &Tree, s: &Shared, c: &Config) -> Tensor {
    let bf = |name: &str| p[name].astype(DType::BF16);
    let h = x.rms_norm(&p["pre_self_attention_layer_norm.scale"], 1e-5);
    let q = einsum("btd,dhk->bthk", &[&h, &bf("self_attention.query.kernel")]).checkpoint_name("query_proj");
    let k = einsum("btd,dhk->bthk", &[&h, &bf("self_attention.key.kernel")]).checkpoint_name("key_proj");
    let v = einsum("btd,dhk->bthk", &[&h, &bf("self_attention.value.kernel")]).checkpoint_name("value_proj");
    let (q, k) = (rope(&q, &s.cos, &s.sin), rope(&k, &s.cos, &s.sin));
    let scores = einsum("bthk,bshk->bhts", &[&q, &k]).astype(DType::F32) * (1.0 / (c.head_dim as f64).sqrt());
    let probs = where_(&s.mask, &scores, -1e9).softmax(-1).astype(DType::BF16);
    let attn = einsum("bhts,bshk->bthk", &[&probs, &v]);
    let out = einsum("bthk,hkd->btd", &[&attn, &bf("self_attention.out.kernel")]).checkpoint_name("out_proj");
    let x = constrain(x + &out, s);
    let h = x.rms_norm(&p["post_self_attention_layer_norm.scale"], 1e-5);
    let gate = h.matmul(&bf("mlp.wi_0.kernel")).silu();
    let up = h.matmul(&bf("mlp.wi_1.kernel"));
    let down = (&gate * &up).matmul(&bf("mlp.wo.kernel"));
    constrain(&x + &down, s)
}

/// Mean next-token cross-entropy of the model.
fn loss(ctx: &Trace, inp: &Tree, c: &Config, activation: Option<PartitionSpec>) -> Tensor {
    let p = inp.subtree("params");
    let x = p["token_embedder.embedding"].astype(DType::BF16).take(&inp["inputs"]);
    let positions = ctx.iota(DType::F32, &[c.seq, c.head_dim / 2], 0);
    let inv_freq: Vec<f64> = (0..c.head_dim / 2).map(|i| 10000f64.powf(-2.0 * i as f64 / c.head_dim as f64)).collect();
    let angles = positions * &ctx.constant(DType::F32, &[c.head_dim / 2], &inv_freq);
    let causal = ctx.iota(DType::S32, &[c.seq, c.seq], 0).ge(ctx.iota(DType::S32, &[c.seq, c.seq], 1));
    let mask = causal.broadcast_in_dim(&[c.batch, c.heads, c.seq, c.seq], &[2, 3]);
    let shared = Shared { cos: angles.cos(), sin: angles.sin(), mask, activation };
    let x = constrain(x, &shared);
    let block = |x: &Tensor, lp: &Tree| {
        let args = lp.clone().with("x", x.clone());
        checkpoint(&c.remat, &args, |a| Tree::new().with("x", decoder_layer(&a["x"], a, &shared, c)))["x"].clone()
    };
    let x = if c.scan_layers {
        let (carry, _) = scan(&Tree::new().with("x", x), &p.subtree("decoder.layers"), |carry, lp| {
            (Tree::new().with("x", block(&carry["x"], lp)), Tree::new())
        });
        carry["x"].clone()
    } else {
        (0..c.layers).fold(x, |x, l| block(&x, &p.subtree(&format!("decoder.layers_{l}"))))
    };
    let x = x.rms_norm(&p["decoder.decoder_norm.scale"], 1e-5);
    let logits = x.matmul(&p["decoder.logits_dense.kernel"].astype(DType::BF16)).astype(DType::F32);
    let targets = inp["targets"].one_hot(c.vocab, DType::F32);
    -(targets * &logits.log_softmax(-1)).sum(&[-1]).mean_all()
}

fn loss_program(c: &Config, mesh: Option<Mesh>) -> Program {
    let rules = LogicalRules::maxtext();
    let activation =
        mesh.as_ref().map(|m| rules.spec(&["activation_batch", "activation_length", "activation_embed"], m));
    trace(&signature(c, mesh), |ctx, inp| Tree::new().with("loss", loss(ctx, inp, c, activation.clone())))
        .expect("the model traces")
}

fn grad_names(c: &Config) -> Vec<String> {
    params(c).into_iter().map(|(n, _, _)| format!("params.{n}")).collect()
}

/// Compiles and runs a tiny configuration on the CPU plugin: the initial loss is about ln(vocab).
fn sanity_check() {
    for scan_layers in [false, true] {
        let c = Config {
            layers: 2,
            emb: 64,
            heads: 4,
            head_dim: 16,
            mlp: 128,
            vocab: 256,
            seq: 16,
            batch: 2,
            scan_layers,
            remat: RematPolicy::Full,
        };
        let names = grad_names(&c);
        let program =
            value_and_grad_program(&loss_program(&c, None), &names.iter().map(String::as_str).collect::<Vec<_>>());
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut inputs = Tree::new();
        for spec in &program.inputs {
            let n = spec.ty.shape.num_elements() as usize;
            let t = match spec.ty.dtype {
                DType::S32 => HostTensor::from_i32(
                    &spec.ty.shape,
                    &(0..n).map(|_| rng.gen_range(0..c.vocab as i32)).collect::<Vec<_>>(),
                ),
                _ if spec.name.ends_with(".scale") => HostTensor::from_f32(&spec.ty.shape, &vec![1.0; n]),
                _ => HostTensor::from_f32(
                    &spec.ty.shape,
                    &(0..n).map(|_| rng.gen_range(-0.03f32..0.03)).collect::<Vec<_>>(),
                ),
            };
            inputs.insert(spec.name.clone(), t);
        }
        let out = run_program(&cpu_client(1).expect("CPU plugin"), &program, &inputs).expect("the tiny model runs");
        let loss = out["loss"].to_f32()[0];
        assert!((loss - (c.vocab as f32).ln()).abs() < 0.5, "initial loss {loss}, expected about ln({})", c.vocab);
        println!("sanity: tiny model (scan_layers={scan_layers}) compiles and runs on CPU, initial loss {loss:.3} (ln vocab = {:.3})", (c.vocab as f32).ln());
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let runs: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(7);
    sanity_check();
    let mesh = Mesh::new(&[("data", 1), ("fsdp", 8), ("tensor", 1)]);
    println!("\nllama2-7b shapes, fsdp=8 mesh with logical-rule shardings; median of {runs} runs (ms)\n");
    println!(
        "| layers | scan_layers | remat | trace | grad | lower | trace+grad+lower | eqns (fwd / fwd+bwd) | MLIR |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let configs = [
        (4, false, RematPolicy::Full),
        (4, true, RematPolicy::Full),
        (32, false, RematPolicy::Full),
        (32, true, RematPolicy::Full),
        (32, true, RematPolicy::None),
        (32, true, RematPolicy::from_name("save_qkv_proj").expect("known policy")),
    ];
    for (layers, scan_layers, remat) in configs {
        let c = Config::llama2_7b(layers, scan_layers, remat.clone());
        let names = grad_names(&c);
        let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
        let (mut t_trace, mut t_grad, mut t_lower, mut t_total) = (vec![], vec![], vec![], vec![]);
        let (mut size, mut eqns) = (0, (0, 0));
        for _ in 0..runs {
            let start = Instant::now();
            let forward = loss_program(&c, Some(mesh.clone()));
            let traced = Instant::now();
            let grad = value_and_grad_program(&forward, &wrt);
            let differentiated = Instant::now();
            let mlir = to_stablehlo(&grad);
            let lowered = Instant::now();
            t_trace.push(traced - start);
            t_grad.push(differentiated - traced);
            t_lower.push(lowered - differentiated);
            t_total.push(lowered - start);
            size = mlir.len();
            eqns = (forward.graph.count_eqns(), grad.graph.count_eqns());
        }
        let remat_name = match &remat {
            RematPolicy::Full => "full".to_string(),
            RematPolicy::None => "none".to_string(),
            RematPolicy::SaveNames(_) => "save_qkv_proj".to_string(),
        };
        println!(
            "| {layers} | {scan_layers} | {remat_name} | {:.1} | {:.1} | {:.1} | {:.1} | {} / {} | {:.0} KiB |",
            median(t_trace),
            median(t_grad),
            median(t_lower),
            median(t_total),
            eqns.0,
            eqns.1,
            size as f64 / 1024.0
        );
    }
}
