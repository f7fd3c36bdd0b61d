//! DeepSeek-V3's layer (`decoder_block=deepseek`: multi-head latent attention with YaRN RoPE,
//! then the MLP) against the independent f64 reference of `common/mla_ref.rs` (Hugging Face's
//! formulation), tiny (emb 32, 4 heads, q_lora 12, kv_lora 16, nope 8, rope 8, v 6, 2 layers) in
//! float32 on a 2 x 16 batch with random parameters: every layer's output, the logits, the loss,
//! and the gradient through MLA's own pieces (the latents' norms, the low-rank projections)
//! against central differences of the reference loss. (The one-projection queries,
//! `q_lora_rank=0`, are checked against Hugging Face's logits by `convert_families`; decoding by
//! `decode`.)

use crate::common::family_ref::{self, batch, host_params, random_params, Family, RopeRef, Spec};
use crate::common::llama_ref::{scaled_err, with_batch};
use crate::common::mla_ref::{self, MlaSpec};
use maxrs::autodiff::value_and_grad;
use maxrs::model::Model;
use maxrs::tensor::trace;

/// YaRN with a correction range inside the 4 rotated pairs (theta 100, original context 64,
/// beta_fast 4): one frequency kept, two blended, one divided by the factor 4.
const TINY: &[&str] = &[
    "decoder_block=deepseek",
    "attention_type=mla",
    "base_emb_dim=32",
    "base_num_query_heads=4",
    "base_num_kv_heads=4",
    "base_mlp_dim=48",
    "base_num_decoder_layers=2",
    "first_num_dense_layers=2",
    "vocab_size=64",
    "q_lora_rank=12",
    "kv_lora_rank=16",
    "qk_nope_head_dim=8",
    "qk_rope_head_dim=8",
    "v_head_dim=6",
    "rope_type=yarn",
    "rope_max_timescale=100",
    "rope_factor=4",
    "original_max_position_embeddings=64",
    "max_position_embeddings=256",
    "beta_fast=4",
    "beta_slow=1",
    "normalization_layer_epsilon=1e-5",
];

/// What the reference computes: Hugging Face's YaRN inverse frequencies and softmax scale for
/// these sizes (transformers 5.23.0: `ROPE_INIT_FUNCTIONS["yarn"]` and
/// `DeepseekV3Attention(DeepseekV3Config(hidden_size=32, num_attention_heads=4, q_lora_rank=12,
/// kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=6, rope_theta=100.0,
/// max_position_embeddings=1024, rope_scaling={"rope_type": "yarn", "factor": 4.0,
/// "original_max_position_embeddings": 64, "beta_fast": 4, "beta_slow": 1, "mscale": 1.0,
/// "mscale_all_dim": 1.0}), 0).scaling`).
fn spec(q_lora: usize) -> MlaSpec {
    MlaSpec {
        heads: 4,
        q_lora,
        kv_lora: 16,
        nope: 8,
        rope: 8,
        v: 6,
        inv_freq: vec![1.0, 0.23717081546783447, 0.04999999701976776, 0.007905694656074047],
        interleave: true,
        scaling: 0.32411924819517657,
        eps: 1e-5,
    }
}

/// The random parameters' draw (`family_ref`'s: norm gains around 1, fan-in scaled kernels).
fn draw_spec() -> Spec {
    Spec::plain(Family::Llama, RopeRef::None, 1e-5)
}

fn tiny() -> Model {
    family_ref::model("default", TINY)
}

/// One program (one compile): every layer's output, the logits, the loss and its gradient
/// against the reference's, the gradient at probes through MLA's latents and projections
/// against central differences of the reference loss.
#[test]
fn deepseek_matches_reference_and_finite_differences() {
    let (m, s) = (tiny(), spec(12));
    let p = random_params(&draw_spec(), &m, 3);
    let b = batch(&m, 4);
    let program = trace(&crate::common::llama_ref::signature(&m), |_ctx, inp| {
        let fwd = m.forward(&inp.subtree("params"), inp, true);
        let (loss, grads) = value_and_grad(&inp.subtree("params"), |params| m.loss(params, inp, 0.0).0);
        grads
            .prefixed("grad")
            .with("loss", loss)
            .with("layers", fwd.layer_outputs.expect("layer outputs"))
            .with("logits", fwd.logits)
    })
    .expect("the program traces");
    let out = crate::common::run(&program, &with_batch(host_params(&m, &p), &b));

    let want = mla_ref::reference(&s, &p, &b);
    let layers = out["layers"].to_f64();
    let per = layers.len() / want.layers.len();
    for (i, l) in want.layers.iter().enumerate() {
        let err = scaled_err(&layers[i * per..(i + 1) * per], l.as_slice().unwrap());
        assert!(err < 1e-4, "layer {i} output differs: {err:e}");
    }
    let err = scaled_err(&out["logits"].to_f64(), want.logits.as_slice().unwrap());
    let loss = out["loss"].to_f64()[0];
    println!("logits scaled error {err:e}, loss {loss} vs reference {}", want.loss);
    assert!(err < 1e-4, "logits differ: {err:e}");
    assert!((loss - want.loss).abs() < 1e-4 * want.loss.abs(), "loss {loss} vs {}", want.loss);

    let probes = [
        (0, "self_attention.q_norm.scale", 5),
        (1, "self_attention.kv_norm.scale", 3),
        (0, "self_attention.wq_b.kernel", 77),
        (1, "self_attention.wkv_a.kernel", 30),
        (0, "self_attention.wkv_b.kernel", 200),
        (1, "self_attention.out.kernel", 50),
    ];
    for (layer, name, index) in probes {
        let h = 1e-4;
        let nudged = |delta: f64| {
            let mut q = p.clone();
            let a = q.layers[layer].get_mut(name).unwrap_or_else(|| panic!("no parameter {name}"));
            let cols = a.ncols();
            a[[index / cols, index % cols]] += delta;
            mla_ref::reference(&s, &q, &b).loss
        };
        let fd = (nudged(h) - nudged(-h)) / (2.0 * h);
        let g = out[format!("grad.decoder.dense_layers.{name}").as_str()].to_f64()
            [layer * p.layers[layer][name].len() + index];
        println!("d loss / d {name}[{layer}][{index}]: traced {g:e}, finite difference {fd:e}");
        assert!(fd.abs() > 1e-7, "{name}[{index}] does not affect the loss; pick another probe");
        assert!((g - fd).abs() <= 2e-3 * fd.abs() + 1e-6, "{name}: traced {g} vs finite difference {fd}");
    }
}

/// YaRN's `rope_attention_scaling` multiplies the rotated f32 values before their cast back to
/// bf16 (MaxText's `YarnRotaryEmbedding.__call__`, `src/maxtext/layers/embeddings.py` at main
/// e591f30: `output * attention_scaling`, then `astype(fprop_dtype)`): each bf16 output is the
/// exact product rounded once (within half a bf16 step, plus f32's error). Scaling after the cast
/// rounds twice, up to a whole step off.
#[test]
fn yarn_attention_scaling_rounds_once_to_bf16() {
    use maxrs::ir::{DType, Signature};
    use maxrs::model::attention::{rope_scaled, rope_tables};
    use maxrs::tensor::Tree;

    let (b, t, h, k) = (2i64, 8i64, 3i64, 16i64);
    let mut r = crate::common::rng(31);
    let bf = |x: f64| half::bf16::from_f64(x).to_f64();
    let x: Vec<f64> = crate::common::uniform(&mut r, (b * t * h * k) as usize, -4.0, 4.0).into_iter().map(bf).collect();
    let frequencies: Vec<f64> = (0..k / 2).map(|i| 10_000f64.powf(-2.0 * i as f64 / k as f64)).collect();
    let scale = 0.1 * 40f64.ln() + 1.0;
    let mut sig = Signature::new(None);
    sig.input("x", DType::F64, &[b, t, h, k]);
    let program = trace(&sig, |ctx, inp| {
        let positions = ctx.iota(DType::S32, &[b, t], 1);
        let (cos, sin) = rope_tables(&positions, &frequencies);
        let y = rope_scaled(&inp["x"].astype(DType::BF16), &cos, &sin, false, scale);
        Tree::new().with("y", y.astype(DType::F64))
    })
    .unwrap();
    let inputs = Tree::new().with("x", crate::common::f64_tensor(&[b, t, h, k], &x));
    let got = crate::common::run(&program, &inputs)["y"].to_f64();

    // The rotation of the halves (x1, x2) at position p, in f64.
    let half = (k / 2) as usize;
    let mut worst = (0.0f64, 0.0f64);
    for (row, chunk) in x.chunks(k as usize).enumerate() {
        let p = ((row as i64 / h) % t) as f64;
        for i in 0..half {
            let (c, s) = ((p * frequencies[i]).cos(), (p * frequencies[i]).sin());
            let exact = [chunk[i] * c - chunk[i + half] * s, chunk[i + half] * c + chunk[i] * s];
            for (j, e) in exact.into_iter().enumerate() {
                let step = bf(e.abs()).max(1e-30) * 2f64.powi(-7);
                let got = got[row * k as usize + i + j * half];
                worst.0 = worst.0.max((got - e * scale).abs() / (step * scale));
                worst.1 = worst.1.max((bf(bf(e) * scale) - e * scale).abs() / (step * scale));
            }
        }
    }
    assert!(worst.0 < 0.51, "maxrs: {:.3} bf16 steps from the exact product", worst.0);
    assert!(worst.1 > 0.6, "rounding twice would be {:.3} steps off: the test tells them apart", worst.1);
}

/// MaxText names the stacked axis of DeepSeek's two stacks after them, `dense_layers` and
/// `moe_layers` (`scan_decoder_layers`' `metadata_axis_name`, `src/maxtext/layers/decoders.py` at
/// e591f30), both unsharded by base.yml's rules; a rule for one shards that stack alone.
#[test]
fn the_stacks_axes_are_named_and_sharded_as_maxtext_names_them() {
    let routed = [
        "base_num_decoder_layers=3",
        "first_num_dense_layers=1",
        "num_experts=4",
        "num_experts_per_tok=2",
        "base_moe_mlp_dim=16",
    ];
    let axes = |extra: &[&str]| {
        let args: Vec<&str> = TINY.iter().chain(&routed).chain(extra).copied().collect();
        let model = family_ref::model("default", &args);
        let mesh = maxrs::sharding::Mesh::new(&[("fsdp", 2)]);
        let first_axis = |stack: &str| {
            let def =
                model.param_defs().into_iter().find(|d| d.name.starts_with(&format!("decoder.{stack}."))).unwrap();
            (def.logical[0], model.config.rules.spec(&def.logical, &mesh).dim(0).to_vec())
        };
        (first_axis("dense_layers"), first_axis("moe_layers"))
    };
    let none: Vec<String> = vec![];
    assert_eq!(axes(&[]), (("dense_layers", none.clone()), ("moe_layers", none.clone())));
    let sharded = axes(&["logical_axis_rules=[[moe_layers, [fsdp]]]"]);
    assert_eq!(sharded, (("dense_layers", none), ("moe_layers", vec!["fsdp".to_string()])));
}
