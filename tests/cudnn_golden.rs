//! cuDNN fused attention's custom calls as maxrs emits them, against what JAX 0.11.2 emits for
//! the same attention (`tests/data/cudnn_fmha_jax-0.11.2/*.stablehlo.mlir`, lowered on an H100
//! with `jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=1.0,
//! implementation="cudnn")`, plus `local_window_size=(255, 0)` for `window` and
//! `query_seq_lengths = key_value_seq_lengths = [1024, 700]` for `seqlens`; `fwdbwd` is
//! `jax.vjp` of it with a cotangent of ones), and for packed documents (`packed*`, at most 3 a
//! row) JAX's `fused_attention_stablehlo.dot_product_attention` with `q_seqlen`, `q_offsets`,
//! lowered for CUDA without a GPU (`packed_golden.py` there says how, and checks the method
//! against `causal_mha`). For each case the calls are compared field by
//! field: target, backend config (parsed and compared as JSON), operand and result layouts,
//! operand and result types; SSA names are ignored. The CPU plugin cannot run cuDNN, so what
//! the calls compute is checked on a GPU (`tools/gpu-check.d/27-cudnn.sh`).

use maxrs::autodiff::value_and_grad;
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::model::cudnn;
use maxrs::sharding::Mesh;
use maxrs::tensor::{trace, Tree};
use serde_json::Value;
use std::path::Path;

/// One `stablehlo.custom_call` line, split into the fields that say what XLA runs.
#[derive(Debug, PartialEq)]
struct Call {
    target: String,
    api_version: String,
    backend_config: Value,
    operand_layouts: Vec<Vec<usize>>,
    result_layouts: Vec<Vec<usize>>,
    /// `(operand types) -> result types`, as printed.
    signature: String,
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let from = s.find(start).unwrap_or_else(|| panic!("no {start:?} in {s}")) + start.len();
    let len = s[from..].find(end).unwrap_or_else(|| panic!("no {end:?} after {start:?} in {s}"));
    &s[from..from + len]
}

/// `dense<[3, 2, 1, 0]> : tensor<4xindex>, dense<0> : tensor<1xindex>` -> `[[3, 2, 1, 0], [0]]`.
fn layouts(s: &str) -> Vec<Vec<usize>> {
    s.split("dense<")
        .skip(1)
        .map(|item| {
            let numbers = &item[..item.find('>').unwrap()];
            numbers.trim_matches(['[', ']']).split(',').map(|n| n.trim().parse().unwrap()).collect()
        })
        .collect()
}

/// MLIR's string escapes (`\22` for a quote, `\5C` for a backslash, `\"`, `\\`) undone.
fn unescape(s: &str) -> String {
    let (mut out, bytes) = (Vec::new(), s.as_bytes());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if bytes[i + 1] == b'"' || bytes[i + 1] == b'\\' => {
                out.push(bytes[i + 1]);
                i += 2;
            }
            b'\\' => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

fn calls(mlir: &str) -> Vec<Call> {
    mlir.lines()
        .filter(|l| l.contains("stablehlo.custom_call @"))
        .map(|line| {
            let config = between(line, "backend_config = \"", "\", operand_layouts");
            Call {
                target: between(line, "custom_call @", "(").to_string(),
                api_version: between(line, "api_version = ", ",").to_string(),
                backend_config: serde_json::from_str(&unescape(config)).expect("backend config is JSON"),
                operand_layouts: layouts(between(line, "operand_layouts = [", "], result_layouts")),
                result_layouts: layouts(between(line, "result_layouts = [", "]}")),
                signature: line[line.rfind("} : ").unwrap() + 4..].trim().to_string(),
            }
        })
        .collect()
}

fn golden(name: &str) -> Vec<Call> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cudnn_fmha_jax-0.11.2").join(name);
    calls(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// What a golden case's rows hold.
#[derive(Clone, Copy, PartialEq)]
enum Rows {
    Whole,
    /// Valid lengths `[1024, 700]`.
    Lengths,
    /// At most 3 documents a row.
    Packed,
}

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    kv_heads: i64,
    window: Option<i64>,
    rows: Rows,
}

const CASES: [Case; 6] = [
    Case { name: "causal_mha", kv_heads: 8, window: None, rows: Rows::Whole },
    Case { name: "causal_gqa", kv_heads: 2, window: None, rows: Rows::Whole },
    // JAX's `local_window_size=(255, 0)`: the token itself and 255 before it.
    Case { name: "window", kv_heads: 8, window: Some(256), rows: Rows::Whole },
    Case { name: "seqlens", kv_heads: 8, window: None, rows: Rows::Lengths },
    Case { name: "packed", kv_heads: 8, window: None, rows: Rows::Packed },
    Case { name: "packed_gqa_window", kv_heads: 2, window: Some(256), rows: Rows::Packed },
];

/// The golden files' shapes: batch 2, 1024 tokens, 8 query heads of 128, bf16.
fn emitted(case: Case, backward: bool) -> Vec<Call> {
    let mut sig = Signature::new(None);
    for (name, heads) in [("p.q", 8), ("p.k", case.kv_heads), ("p.v", case.kv_heads)] {
        sig.input(name, DType::BF16, &[2, 1024, heads, 128]);
    }
    sig.input("segments", DType::S32, &[2, 1024]);
    let program = trace(&sig, |ctx, inp| {
        let lengths = ctx.constant(DType::S32, &[2], &[1024.0, 700.0]);
        let segments = &inp["segments"];
        let attend = |p: &Tree, training: bool| {
            let sequences = match case.rows {
                Rows::Whole => cudnn::Sequences::Whole,
                Rows::Lengths => cudnn::Sequences::Lengths(&lengths, &lengths),
                Rows::Packed => cudnn::Sequences::Packed { segments, max: 3 },
            };
            cudnn::attention(&p["q"], &p["k"], &p["v"], case.window, sequences, training).0
        };
        let inp = &inp.subtree("p");
        if !backward {
            return Tree::new().with("out", attend(inp, false));
        }
        let (_, grads) = value_and_grad(inp, |p| attend(p, true).astype(DType::F32).sum_all());
        grads
    })
    .expect("traces");
    calls(&to_stablehlo(&program))
}

/// The forward call alone (`fwd`: inference), and the differentiable forward call (with the f32
/// softmax statistics) with the backward call, which reads the saved output and statistics
/// (`fwdbwd`).
#[test]
fn calls_match_jax() {
    for case in CASES {
        for (pass, backward, calls) in [("fwd", false, 1), ("fwdbwd", true, 2)] {
            let want = golden(&format!("{}.{pass}.stablehlo.mlir", case.name));
            assert_eq!(want.len(), calls, "{}.{pass}: the golden file's custom calls", case.name);
            assert_eq!(emitted(case, backward), want, "{}.{pass}", case.name);
        }
    }
}

/// The backend config text is `json.dumps`'s, byte for byte, not only the same JSON.
#[test]
fn backend_config_is_written_as_json_dumps_writes_it() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cudnn_fmha_jax-0.11.2/window.fwdbwd.stablehlo.mlir");
    let text = std::fs::read_to_string(path).unwrap();
    let fmha = cudnn::Fmha {
        batch: 2,
        seq: 1024,
        heads: 8,
        kv_heads: 8,
        head_dim: 128,
        dtype: DType::BF16,
        window: Some(256),
        rows: cudnn::Rows::Whole,
    };
    let configs: Vec<String> = text
        .lines()
        .filter(|l| l.contains("custom_call @"))
        .map(|l| unescape(between(l, "backend_config = \"", "\", operand")))
        .collect();
    assert_eq!(configs, [fmha.backend_config(false), fmha.backend_config(true)]);
}

/// The train-step gradient of attention on a `data` x `tensor` mesh of 2 x 2: `[4, 256]` tokens,
/// 8 query and 2 key/value heads of 64, over packed rows of at most `max_documents` documents
/// when given; as StableHLO, with the backend configs each device's calls should carry.
fn sharded(max_documents: Option<i64>) -> (String, Vec<Value>) {
    let mesh = Mesh::new(&[("data", 2), ("fsdp", 1), ("tensor", 2)]);
    let mut sig = Signature::new(Some(mesh));
    for (name, heads) in [("p.q", 8), ("p.k", 2), ("p.v", 2)] {
        sig.input(name, DType::BF16, &[4, 256, heads, 64]);
    }
    sig.input("segments", DType::S32, &[4, 256]);
    let program = trace(&sig, |_, inp| {
        let (batch, heads) = (vec!["data".to_string()], vec!["tensor".to_string()]);
        let sequences = match max_documents {
            Some(max) => cudnn::Sequences::Packed { segments: &inp["segments"], max },
            None => cudnn::Sequences::Whole,
        };
        let (_, grads) = value_and_grad(&inp.subtree("p"), |p| {
            let (out, _) = cudnn::sharded_attention(&p["q"], &p["k"], &p["v"], None, sequences, (&batch, &heads), true);
            out.astype(DType::F32).sum_all()
        });
        grads
    })
    .expect("traces");
    let local = cudnn::Fmha {
        batch: 2,
        seq: 256,
        heads: 4,
        kv_heads: 1,
        head_dim: 64,
        dtype: DType::BF16,
        window: None,
        rows: max_documents.map_or(cudnn::Rows::Whole, |max| cudnn::Rows::Packed { max }),
    };
    let configs = [false, true].iter().map(|&b| serde_json::from_str(&local.backend_config(b)).unwrap()).collect();
    (to_stablehlo(&program), configs)
}

/// On a mesh the calls run inside Shardy manual computations over the batch (`data`) and head
/// (`tensor`) axes, with each device's local shapes in the calls and their backend configs.
#[test]
fn sharded_calls_see_local_shapes_in_a_manual_computation() {
    let (mlir, configs) = sharded(None);
    assert_eq!(mlir.matches("sdy.manual_computation(").count(), 2, "{mlir}");
    assert!(mlir.contains("manual_axes={\"data\", \"tensor\"}"), "{mlir}");
    let got = calls(&mlir);
    assert_eq!(got.len(), 2);
    assert_eq!(got.iter().map(|c| c.backend_config.clone()).collect::<Vec<_>>(), configs);
    assert!(got[0].signature.starts_with("(tensor<2x256x4x64xbf16>, tensor<2x256x1x64xbf16>"), "{}", got[0].signature);
    assert!(got[1]
        .signature
        .ends_with("(tensor<2x4x256x64xbf16>, tensor<2x1x256x64xbf16>, tensor<2x1x256x64xbf16>, tensor<0xui8>)"));
}

/// On a mesh, packed documents' tokens are split by rows with the batch, and each device's calls
/// take the lengths and offsets of its own rows (`[local batch, max]`, `[local batch, max + 1]`),
/// with statistics for each of its rows' documents.
#[test]
fn sharded_packed_calls_take_each_devices_documents() {
    let (mlir, configs) = sharded(Some(4));
    let got = calls(&mlir);
    assert_eq!(got.len(), 2);
    assert_eq!(got.iter().map(|c| c.backend_config.clone()).collect::<Vec<_>>(), configs);
    assert_eq!(
        got[0].signature,
        "(tensor<2x256x4x64xbf16>, tensor<2x256x1x64xbf16>, tensor<2x256x1x64xbf16>, tensor<2x4xi32>, tensor<2x4xi32>, \
         tensor<2x5xi32>, tensor<2x5xi32>) -> (tensor<2x4x256x64xbf16>, tensor<8x4x256xf32>, tensor<0xui8>)"
    );
}

/// A custom call has no derivative of its own: differentiating one outside its composite is
/// refused by name (the composite's backward call is its gradient).
#[test]
fn a_bare_custom_call_is_not_differentiated() {
    let mut sig = Signature::new(None);
    for name in ["q", "k", "v"] {
        sig.input(name, DType::BF16, &[1, 128, 2, 64]);
    }
    let err = trace(&sig, |_, inp| {
        let fmha = cudnn::Fmha::new(&inp["q"], &inp["k"], None, cudnn::Rows::Whole);
        let (_, grads) = value_and_grad(inp, |p| {
            let out = maxrs::tensor::custom_call(fmha.forward_call(false), &[&p["q"], &p["k"], &p["v"]]);
            out[0].astype(DType::F32).sum_all()
        });
        grads
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("custom_call @__cudnn$fmhaSoftmax has no derivative of its own"), "{err}");
}

/// cuDNN's packed layout computed from each token's document, against JAX 0.11.2's
/// `_fix_seqlen_offsets` (`packed_golden.py offsets`) of the same documents' lengths and starts in
/// the form JAX's API takes them (row 0: documents of 3, 4 and 2 tokens and 7 of padding, which
/// joins the last document; row 1: one document and padding; row 2: padding only).
#[test]
fn packed_layout_is_what_jax_hands_cudnn() {
    let mut sig = Signature::new(None);
    sig.input("segments", DType::S32, &[3, 16]);
    let program = trace(&sig, |_, inp| {
        let [q_seqlen, kv_seqlen, q_offsets, kv_offsets] = cudnn::packed_layout(&inp["segments"], 3, 4, 2, 8);
        Tree::new()
            .with("q_seqlen", q_seqlen)
            .with("kv_seqlen", kv_seqlen)
            .with("q_offsets", q_offsets)
            .with("kv_offsets", kv_offsets)
    })
    .expect("traces");
    let rows: [[i32; 16]; 3] =
        [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0], [0; 16]];
    let inputs = Tree::new().with("segments", HostTensor::from_i32(&[3, 16], &rows.concat()));
    let out = crate::common::run(&program, &inputs);
    let seqlen = [3, 4, 9, 16, 16, 0, 0, 0, 0];
    assert_eq!(out["q_seqlen"].to_i64(), seqlen);
    assert_eq!(out["kv_seqlen"].to_i64(), seqlen);
    assert_eq!(out["q_offsets"].to_i64(), [0, 96, 224, 512, 1024, 1536, 1536, 1536, 1536, 1536, 1536, 1536]);
    assert_eq!(out["kv_offsets"].to_i64(), [0, 48, 112, 256, 512, 768, 768, 768, 768, 768, 768, 768]);
    assert_eq!(out["q_offsets"].dims, [3, 4]);
}

/// cuDNN's packed statistics, `f32[batch x max, heads, seq]` (one dense `[heads, seq]` block per
/// document slot, as JAX's `softmax_stat_shape = (B * max_seg_per_batch, N, T)` has them:
/// document `j`'s query `s` at `[j, :, s]`), kept one entry per token, `f32[batch, heads, seq]`,
/// and put back for the backward call. Each token's entry is its document's at its place in the
/// document (documents numbered through the batch, a row's padding joining its last document,
/// the rows of `packed_layout_is_what_jax_hands_cudnn`); what no token reads comes back zero. The
/// composite returns the kept form: the whole one, kept by `minimal_flash` for every layer, was
/// 1.9 GiB a device more than MaxText's step on its 2-node Llama2-7B recipe (issue 46).
#[test]
fn packed_statistics_are_kept_one_entry_per_token() {
    const B: usize = 3;
    const T: usize = 16;
    const MAX: usize = 3;
    const HEADS: usize = 2;
    let rows: [[i32; T]; B] =
        [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0], [0; T]];
    // Each token's (document, place), walking the tokens: a document starts with a row and where
    // the segment changes to a non-zero one.
    let mut places = vec![];
    let (mut document, mut place) = (usize::MAX, 0);
    for row in &rows {
        for (t, &s) in row.iter().enumerate() {
            if t == 0 || (s != 0 && s != row[t - 1]) {
                (document, place) = (document.wrapping_add(1), 0);
            } else {
                place += 1;
            }
            places.push((document, place));
        }
    }
    let whole: Vec<f32> = (0..B * MAX * HEADS * T).map(|i| i as f32 + 0.5).collect();
    let at = |document: usize, head: usize, place: usize| (document * HEADS + head) * T + place;
    let mut kept = vec![0.0; B * HEADS * T];
    let mut back = vec![0.0; whole.len()];
    for (token, &(document, place)) in places.iter().enumerate() {
        let (b, t) = (token / T, token % T);
        for head in 0..HEADS {
            kept[(b * HEADS + head) * T + t] = whole[at(document, head, place)];
            back[at(document, head, place)] = whole[at(document, head, place)];
        }
    }

    let mut sig = Signature::new(None);
    sig.input("stats", DType::F32, &[(B * MAX) as i64, HEADS as i64, T as i64]);
    sig.input("segments", DType::S32, &[B as i64, T as i64]);
    let program = trace(&sig, |_, inp| {
        let kept = cudnn::pack_stats(&inp["stats"], &inp["segments"], MAX as i64);
        let back = cudnn::unpack_stats(&kept, &inp["segments"], MAX as i64);
        Tree::new().with("kept", kept).with("back", back)
    })
    .expect("traces");
    let inputs = Tree::new()
        .with("stats", HostTensor::from_f32(&[(B * MAX) as i64, HEADS as i64, T as i64], &whole))
        .with("segments", HostTensor::from_i32(&[B as i64, T as i64], &rows.concat()));
    let out = crate::common::run(&program, &inputs);
    assert_eq!(out["kept"].dims, [B as i64, HEADS as i64, T as i64]);
    assert_eq!(out["kept"].to_f32(), kept);
    assert_eq!(out["back"].to_f32(), back);

    // The differentiable call returns the kept form (batch 2, 1024 tokens, 8 heads), through two
    // barriers: the whole statistics with the index, which makes the gather each call's own, and
    // the kept ones with the output, which makes the rest of the forward pass wait for the
    // gather. Without them XLA fused 8 layers' gathers into one after the last layer's call, then
    // gathered each layer's just before its backward call: either way it kept every layer's whole
    // statistics (0.5 GiB more at 8 layers of Llama2-7B; no model small enough for a test shows it).
    let mut sig = Signature::new(None);
    for name in ["q", "k", "v"] {
        sig.input(name, DType::BF16, &[2, 1024, 8, 128]);
    }
    sig.input("segments", DType::S32, &[2, 1024]);
    let program = trace(&sig, |_, inp| {
        let sequences = cudnn::Sequences::Packed { segments: &inp["segments"], max: 3 };
        let (out, stats) = cudnn::attention(&inp["q"], &inp["k"], &inp["v"], None, sequences, true);
        assert_eq!(stats.expect("training: statistics").shape(), [2, 8, 1024]);
        Tree::new().with("out", out)
    })
    .expect("traces");
    let mlir = to_stablehlo(&program);
    let barriers: Vec<&str> = mlir.lines().filter(|l| l.contains("stablehlo.optimization_barrier")).collect();
    for types in ["tensor<6x8x1024xf32>, tensor<2x1024x2xi32>", "tensor<2x8x1024x128xbf16>, tensor<2x8x1024xf32>"] {
        assert!(barriers.iter().any(|l| l.ends_with(types)), "no barrier on {types}: {barriers:#?}");
    }
}
