//! Context parallelism on 8 CPU devices (`model::context_parallel`): the load-balancing reorder
//! against the permutations MaxText defines (written out here from `reorder_sequence`'s code and
//! docstrings, utils/max_utils.py at e591f30), and each strategy (all_gather, ring, ulysses, usp)
//! with and without load balancing, causal and packed, against the same model on one device: loss
//! and every parameter's gradient, a tiny f32 model (1 layer, embed 32: a strategy is per layer, a
//! second layer added compile time, not coverage) at 256 tokens, and the balanced packed documents of
//! all_gather, ring and usp and Ulysses's unbalanced ones at 4096; and each strategy's bytes moved per
//! layer against the long-context guide's formula.

use crate::common::loss_check::{loss_program, model_on, random_params, worst_scaled_error};
use crate::common::{rng, run};
use maxrs::config::{self, Reorder};
use maxrs::host::HostTensor;
use maxrs::ir::{DType, Program, Signature};
use maxrs::lower::to_stablehlo;
use maxrs::model::context_parallel::{inverse, permutation, permute, reorder_batch, ContextParallel};
use maxrs::model::Model;
use maxrs::sharding::Mesh;
use maxrs::tensor::{trace, Tree};
use rand::Rng;

const DEVICES: usize = 8;

/// MaxText's orders, written out: `reorder_sequence`'s docstring (2 devices, 8 tokens), its code
/// for 4 devices (chunks of 2; device d holds chunks d and 7 - d), and the striped order of
/// `reorder_causal_load_balanced`'s docstring (4 devices, 16 tokens: device d holds d, d + 4, ...).
#[test]
fn load_balancing_orders_are_maxtexts() {
    assert_eq!(permutation(Reorder::DualChunkSwap, 8, 2), [0, 1, 6, 7, 2, 3, 4, 5]);
    assert_eq!(permutation(Reorder::DualChunkSwap, 16, 4), [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]);
    assert_eq!(permutation(Reorder::Striped, 16, 4), [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]);
    // The inverse puts every token back (`reorder_sequence(to_contiguous=True)`).
    for order in [permutation(Reorder::DualChunkSwap, 48, 8), permutation(Reorder::Striped, 48, 8)] {
        let back = inverse(&order);
        let restored: Vec<i64> = back.iter().map(|&i| order[i as usize]).collect();
        assert_eq!(restored, (0..48).collect::<Vec<_>>());
    }
}

/// The reorder of a batch on a mesh with 8 context devices: every token array (inputs, targets,
/// positions, segment ids) permuted as the hand-written dual-chunk-swap order says, positions
/// added when the batch has none; the inverse permutation gives the batch back.
#[test]
fn batch_reorder_moves_every_token_array_the_same_way() {
    let (b, t) = (2i64, 32i64);
    // 16 chunks of 2 tokens; device d holds chunks d and 15 - d.
    let want: Vec<i64> = (0..8).flat_map(|d| [2 * d, 2 * d + 1, 2 * (15 - d), 2 * (15 - d) + 1]).collect();
    let mesh = Mesh::new(&[("context", 8)]);
    let names = ["inputs", "targets", "inputs_segmentation", "targets_segmentation"];
    let mut sig = Signature::new(Some(mesh));
    for name in names {
        sig.input(name, DType::S32, &[b, t]);
    }
    let cp =
        ContextParallel { strategy: config::ContextParallelStrategy::AllGather, reorder: Some(Reorder::DualChunkSwap) };
    let program = trace(&sig, |_, inp| {
        let (batch, order) = reorder_batch(&cp, inp);
        let order = order.expect("reordered over 8 context devices");
        let back = inverse(&order);
        let mut out = batch.clone();
        for (name, x) in batch.iter() {
            out.insert(format!("back_{name}"), permute(x, &back));
        }
        out
    })
    .expect("traces");
    let mut r = rng(3);
    let mut inp = Tree::new();
    let mut host = std::collections::BTreeMap::new();
    for name in names {
        let values: Vec<i32> = (0..b * t).map(|_| r.gen_range(0..1000)).collect();
        inp.insert(name, HostTensor::from_i32(&[b, t], &values));
        host.insert(name, values);
    }
    let got = run(&program, &inp);
    let positions: Vec<i32> = (0..b * t).map(|i| (i % t) as i32).collect();
    host.insert("inputs_position", positions);
    for (name, values) in &host {
        let moved: Vec<i32> =
            (0..b).flat_map(|row| want.iter().map(move |&i| (row * t + i) as usize)).map(|i| values[i]).collect();
        assert_eq!(got[*name].to_i32(), moved, "{name} reordered");
        assert_eq!(&got[&format!("back_{name}")].to_i32(), values, "{name} put back");
    }
}

/// A tiny f32 model of `heads` query and `kv_heads` key/value heads over `seq` tokens with
/// `extra` keys (which replace the defaults they name), and the mesh `config::validate` gives it
/// on 8 devices.
fn model(heads: i64, kv_heads: i64, seq: i64, extra: &[&str]) -> (Model, Option<Mesh>) {
    let key = |s: &str| s.split('=').next().map(str::to_string);
    let mut args: Vec<String> = [
        "dtype=float32",
        "weight_dtype=float32",
        "base_emb_dim=32",
        "head_dim=8",
        "base_mlp_dim=64",
        "base_num_decoder_layers=1",
        "vocab_size=64",
    ]
    .iter()
    .filter(|d| !extra.iter().any(|e| key(e) == key(d)))
    .map(|s| s.to_string())
    .collect();
    args.push(format!("base_num_query_heads={heads}"));
    args.push(format!("base_num_kv_heads={kv_heads}"));
    args.push(format!("max_target_length={seq}"));
    args.extend(extra.iter().map(|s| s.to_string()));
    model_on(DEVICES, &args)
}

const PACKED: [&str; 5] = ["inputs", "targets", "targets_segmentation", "inputs_position", "inputs_segmentation"];

/// The loss and its gradient (`grad.<param>`) of `m` on a `[rows, seq]` batch (packed: with
/// documents' positions and segment ids), on `mesh` or one device.
fn program(m: &Model, mesh: Option<Mesh>, rows: i64, seq: i64, packed: bool) -> Program {
    let names = if packed { &PACKED[..] } else { &PACKED[..3] };
    loss_program(m, mesh, (rows, seq), names, 0.0, false)
}

/// Random parameters and a `[rows, seq]` batch: packed rows hold documents of uneven lengths
/// (each token's position within its document) and end in padding (document 0).
fn inputs(m: &Model, rows: i64, seq: i64, packed: bool) -> Tree<HostTensor> {
    let mut inp = random_params(m, 17, 0.3);
    let mut r = rng(18);
    let vocab = m.config.vocab as i32;
    let tokens = |r: &mut rand::rngs::StdRng| (0..rows * seq).map(|_| r.gen_range(0..vocab)).collect::<Vec<i32>>();
    let dims = [rows, seq];
    inp.insert("inputs", HostTensor::from_i32(&dims, &tokens(&mut r)));
    inp.insert("targets", HostTensor::from_i32(&dims, &tokens(&mut r)));
    let (mut segments, mut positions) = (Vec::new(), Vec::new());
    for row in 0..rows {
        // Documents end at these fractions of the row; the last 5 tokens are padding.
        let ends = [seq / 5 + row, seq / 2 + 3 * row, 3 * seq / 4, seq - 5];
        let (mut doc, mut start) = (1, 0);
        for i in 0..seq {
            if i >= ends[3] {
                segments.push(0);
                positions.push(0);
                continue;
            }
            if i >= ends[(doc - 1) as usize] {
                doc += 1;
                start = i;
            }
            segments.push(doc);
            positions.push((i - start) as i32);
        }
    }
    match packed {
        true => {
            inp.insert("targets_segmentation", HostTensor::from_i32(&dims, &segments));
            inp.insert("inputs_segmentation", HostTensor::from_i32(&dims, &segments));
            inp.insert("inputs_position", HostTensor::from_i32(&dims, &positions));
        }
        false => {
            let seg: Vec<i32> = (0..rows * seq).map(|i| i32::from(i % seq < seq - 5)).collect();
            inp.insert("targets_segmentation", HostTensor::from_i32(&dims, &seg));
        }
    }
    inp
}

/// One strategy's run: its overrides, its label, the collectives its strategy lowers to (which
/// show the strategy ran, not the partitioner's choice), and the batches it runs on: causal
/// (`false`) and/or packed (`true`). Every strategy and balance is checked on packed documents;
/// causal rows where a case adds something (no documents: the causal mask alone).
type Case<'a> = (&'a [&'a str], &'a str, &'a [&'a str], &'a [bool]);

/// Each case against one device, for a model of `heads`/`kv_heads` over `seq` tokens in `rows`
/// rows, with the overrides `common` on one device and in every case (the attention kernel).
fn check_against_one_device(heads: i64, kv_heads: i64, seq: i64, rows: i64, common: &[&str], cases: &[Case]) {
    let (plain, _) = model(heads, kv_heads, seq, &[&["ici_fsdp_parallelism=8"], common].concat());
    for packed in [false, true].into_iter().filter(|packed| cases.iter().any(|case| case.3.contains(packed))) {
        let started = std::time::Instant::now();
        let one = run(&program(&plain, None, rows, seq, packed), &inputs(&plain, rows, seq, packed));
        eprintln!("one device packed={packed}: {:.1?}", started.elapsed());
        for (overrides, label, collectives, _) in cases.iter().filter(|case| case.3.contains(&packed)) {
            let (m, mesh) = model(heads, kv_heads, seq, &[overrides, common].concat());
            let sharded = program(&m, mesh, rows, seq, packed);
            let text = to_stablehlo(&sharded);
            for collective in *collectives {
                assert!(text.contains(&format!("stablehlo.{collective}")), "{label}: no {collective} in the program");
            }
            // With fsdp beside the context axis each device attends for its own rows: the batch's
            // axis is one of the strategy's manual axes (left to the partitioner, a body with
            // collectives got every row).
            if overrides.iter().any(|o| o.starts_with("ici_fsdp_parallelism=")) {
                let manual = text.split("manual_axes={").nth(1).and_then(|rest| rest.split('}').next());
                assert!(manual.is_some_and(|axes| axes.contains("\"fsdp\"")), "{label}: manual axes {manual:?}");
            }
            let started = std::time::Instant::now();
            let compiled = maxrs::runtime::compile(&crate::common::client(), &sharded).expect("compiles");
            let compile = started.elapsed();
            let got = compiled.run(&crate::common::client(), &inputs(&m, rows, seq, packed)).expect("runs");
            let err = worst_scaled_error(&got, &one);
            eprintln!(
                "{label} packed={packed}: worst scaled error {err:.2e} (compile {compile:.1?}, all {:.1?})",
                started.elapsed()
            );
            assert!(err < 1e-5, "{label} packed={packed}: {err:.2e} from one device");
        }
    }
}

/// Tokens per row of the checks of every strategy and balance: the largest that keeps each test
/// at a few seconds of CPU on 2 cores. The dot-product cases stay here: their one-device reference
/// holds `[rows, heads, seq, seq]` scores (at 4096 tokens 64 MiB a head and layer, in f32) and computes
/// every one, the causal mask's hidden half too.
const SEQ: i64 = 256;
/// Tokens of the long-context check (the 4096), one row of a one-layer model of 2 heads,
/// blockwise attention on one device too. Attention's CPU time grows with `seq^2 x heads`: a row
/// of 4096 tokens costs 64 times 4 rows of 256 per head, so only the balanced packed cases of
/// all_gather, ring and usp run there.
const LONG: i64 = 4096;
const CONTEXT_8: &str = "ici_context_parallelism=8";
const CONTEXT_2: [&str; 2] = ["ici_context_parallelism=2", "ici_fsdp_parallelism=4"];
/// usp: a ring of 4 x a Ulysses group of 2, and a ring of 2 x 2 x fsdp 2.
const USP_4X2: [&str; 3] =
    ["context_parallel_strategy=usp", "ici_context_parallelism=4", "ici_context_usp_ulysses_parallelism=2"];
const USP_2X2: [&str; 4] = [
    "context_parallel_strategy=usp",
    "ici_context_parallelism=2",
    "ici_context_usp_ulysses_parallelism=2",
    "ici_fsdp_parallelism=2",
];
const RING: &str = "context_parallel_strategy=ring";
const ULYSSES: &str = "context_parallel_strategy=ulysses";
const UNBALANCED: &str = "context_parallel_load_balance=false";
const FLASH: &str = "attention=flash";
const BOTH: &[bool] = &[false, true];
/// The collectives each strategy lowers to.
const GATHER: &[&str] = &["all_gather"];
const PERMUTE: &[&str] = &["collective_permute"];
const ALL_TO_ALL: &[&str] = &["all_to_all"];
const USP: &[&str] = &["all_to_all", "collective_permute"];

#[test]
fn dot_product_all_gather_and_ring_equal_one_device() {
    let dot = "attention=dot_product";
    let cases: &[Case] = &[
        (&[CONTEXT_8], "all_gather, context 8, balanced", GATHER, BOTH),
        (&[CONTEXT_8, UNBALANCED], "all_gather, context 8", GATHER, &[true]),
        (&[CONTEXT_8, RING], "ring, context 8, balanced", PERMUTE, BOTH),
        (&[CONTEXT_8, RING, UNBALANCED], "ring, context 8", PERMUTE, &[true]),
        (&[CONTEXT_2[0], CONTEXT_2[1], RING], "ring, context 2 x fsdp 4, balanced", PERMUTE, &[true]),
    ];
    check_against_one_device(4, 2, SEQ, 4, &[dot], cases);
}

#[test]
fn blockwise_strategies_equal_one_device() {
    let usp_unbalanced: Vec<&str> = [&USP_4X2[..], &[UNBALANCED]].concat();
    let cases: &[Case] = &[
        // The balanced packed documents of all_gather and ring at context 8, and usp's: at 4096
        // tokens (`strategies_at_4096_tokens_equal_one_device`).
        (&[CONTEXT_8], "blockwise all_gather, context 8, balanced", GATHER, &[false]),
        (&CONTEXT_2, "blockwise all_gather, context 2 x fsdp 4, balanced", GATHER, &[true]),
        (&[CONTEXT_8, RING, UNBALANCED], "blockwise ring, context 8", PERMUTE, &[true]),
        (&[CONTEXT_8, ULYSSES, UNBALANCED], "ulysses, context 8", ALL_TO_ALL, BOTH),
        (&[CONTEXT_2[0], CONTEXT_2[1], ULYSSES, UNBALANCED], "ulysses, context 2 x fsdp 4", ALL_TO_ALL, &[true]),
        (&USP_4X2, "usp, ring 4 x ulysses 2, balanced", USP, &[false]),
        (&usp_unbalanced, "usp, ring 4 x ulysses 2", USP, &[true]),
        (&USP_2X2, "usp, ring 2 x ulysses 2 x fsdp 2, balanced", USP, &[true]),
    ];
    check_against_one_device(8, 8, SEQ, 4, &[FLASH], cases);
}

/// The long-context check: all_gather, ring and usp (its ring and its Ulysses exchange, 2
/// blocks of keys per ring step) over 4096 tokens of load-balanced packed documents, 2 heads.
/// Ulysses needs the heads to split over the context axis, 8 heads at context 8: its own test
/// below.
#[test]
fn strategies_at_4096_tokens_equal_one_device() {
    let cases: &[Case] = &[
        (&[CONTEXT_8], "all_gather, context 8, balanced, 4096 tokens", GATHER, &[true]),
        (&[CONTEXT_8, RING], "ring, context 8, balanced, 4096 tokens", PERMUTE, &[true]),
        (&USP_4X2, "usp, ring 4 x ulysses 2, balanced, 4096 tokens", USP, &[true]),
    ];
    check_against_one_device(2, 2, LONG, 1, &[FLASH], cases);
}

/// Ulysses at context 8 over 4096 tokens of packed documents (unbalanced: MaxText refuses load
/// balancing with it). Its all-to-all splits the heads over the 8 devices, so query and key/value
/// heads are 8 (MaxText's check: both divisible by the axis). Attention's CPU time grows with the
/// heads, so the heads are 4 wide and this is one case on its own: about 22 CPU-seconds with its
/// one-device reference.
#[test]
fn ulysses_at_4096_tokens_equals_one_device() {
    let cases: &[Case] = &[(&[CONTEXT_8, ULYSSES, UNBALANCED], "ulysses, context 8, 4096 tokens", ALL_TO_ALL, &[true])];
    check_against_one_device(8, 8, LONG, 1, &[FLASH, "head_dim=4"], cases);
}

/// MaxText's refusals of the context-parallelism keys (`configs/types.py`, `utils/max_utils.py`,
/// `utils/train_utils.py` at e591f30), usp's (`_validate_usp_context_parallelism`) among them,
/// each naming its keys, on 8 devices (6 for an odd ring, 2 hosts for a DCN split).
#[test]
fn unsupported_pairs_are_refused_by_name() {
    let refusal = |overrides: &[&str], devices: usize, slices: usize| {
        let args: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        let c = config::load(None, &args).expect("loads");
        config::validate(&c, devices, slices).expect_err("refused").to_string()
    };
    let ulysses = ["ici_context_parallelism=8", "context_parallel_strategy=ulysses", "base_num_query_heads=8"];
    let usp = |extra: &[&'static str]| -> Vec<&'static str> { [&USP_4X2[..], extra].concat() };
    let flash = FLASH;
    let usp_dcn = [
        "context_parallel_strategy=usp",
        "ici_context_parallelism=2",
        "ici_context_usp_ulysses_parallelism=2",
        "dcn_context_parallelism=2",
        "dcn_data_parallelism=1",
        flash,
    ];
    let odd_ring = [
        "context_parallel_strategy=usp",
        "ici_context_parallelism=3",
        "ici_context_usp_ulysses_parallelism=2",
        "max_target_length=96",
        flash,
    ];
    for (overrides, devices, slices, want) in [
        (&["context_parallel_strategy=usp"][..], 8, 1, "ring of more than one device"),
        (&["context_parallel_strategy=usp", CONTEXT_8][..], 8, 1, "ici_context_usp_ulysses_parallelism > 1"),
        (&["ici_context_usp_ulysses_parallelism=2"][..], 8, 1, "only with context_parallel_strategy=usp"),
        (&usp(&[])[..], 8, 1, "usp needs attention=flash"),
        (&usp(&[flash, "ici_context_parallelism=-1", "ici_fsdp_parallelism=1"])[..], 8, 1, "explicit context sizes"),
        (&usp_dcn[..], 8, 2, "usp across hosts"),
        (&usp(&[flash, "base_num_kv_heads=1"])[..], 8, 1, "heads do not split"),
        (&usp(&[flash, "decoder_block=mistral", "sliding_window_size=64"])[..], 8, 1, "global causal attention only"),
        (&usp(&[flash, "logical_axis_rules=[[activation_length, [context]]]"])[..], 8, 1, "activation_length to map"),
        (&odd_ring[..], 6, 1, "must be even"),
        (&[&ulysses[..], &[flash]].concat()[..], 8, 1, "context_parallel_load_balance=false"),
        (&[&ulysses[..], &[UNBALANCED]].concat()[..], 8, 1, "attention=flash"),
        (&[&ulysses[..], &[UNBALANCED, flash, "base_num_kv_heads=4"]].concat()[..], 8, 1, "base_num_kv_heads"),
        (&[ULYSSES, flash, UNBALANCED][..], 8, 1, "more than one device"),
        (&[CONTEXT_8, "context_parallel_reorder_strategy=striped"][..], 8, 1, "GPU only"),
        (&[CONTEXT_8, "max_target_length=2056"][..], 8, 1, "not a multiple of 16"),
    ] {
        let err = refusal(overrides, devices, slices);
        assert!(err.contains(want), "{overrides:?}: {err}");
        assert!(
            err.contains("context_parallel") || err.contains("max_target_length"),
            "{overrides:?} names no key: {err}"
        );
    }
    // MaxText's usp runs in train mode only (`validate_usp_runtime`, usp_attention.py at e591f30).
    let args: Vec<String> = USP_4X2.iter().map(|s| s.to_string()).chain(["attention=flash".into()]).collect();
    let c = config::load(None, &args).expect("loads");
    let err = config::validate_decode(&c).expect_err("usp does not decode").to_string();
    assert!(err.starts_with("context_parallel_strategy: ") && err.contains("for training"), "{err}");
}

/// Bytes a device moves per collective kind in a lowered program, counting float operands only
/// (the attention tensors; the s32 plain indices and document ids they carry along are left
/// out), each collective as a ring algorithm moves it: an all-gather sends its operand to the
/// `n - 1` others, a reduce-scatter and an all-to-all all but `1 / n` of theirs, a permute its
/// operand (tools/hlo_collectives.py counts an optimized program the same way).
fn collective_bytes(stablehlo: &str) -> std::collections::BTreeMap<&'static str, f64> {
    let mut out = std::collections::BTreeMap::new();
    for line in stablehlo.lines() {
        let kind = if line.contains("\"stablehlo.all_gather\"") {
            "all_gather"
        } else if line.contains("scatter_dimension =") {
            // reduce_scatter is a region op: its attributes and signature close the region.
            "reduce_scatter"
        } else if line.contains("\"stablehlo.all_to_all\"") {
            "all_to_all"
        } else if line.contains("\"stablehlo.collective_permute\"") {
            "collective_permute"
        } else {
            continue;
        };
        let operand = line.rsplit(": (tensor<").next().and_then(|s| s.split(">)").next()).expect("a signature");
        let (dims, dtype) = operand.rsplit_once('x').expect("a shaped tensor");
        let size = match dtype {
            "f32" => 4.0,
            "bf16" => 2.0,
            _ => continue,
        };
        let elements: f64 = dims.split('x').map(|d| d.parse::<f64>().expect("a static dimension")).product();
        // The group size: the second dimension of `replica_groups`'s `tensor<GROUPSxSIZExi64>`.
        let n = || -> f64 {
            let groups = line.split("replica_groups = dense<").nth(1).expect("replica groups");
            let ty = groups.split("tensor<").nth(1).expect("their type");
            ty.split('x').nth(1).expect("groups x size").parse().expect("a size")
        };
        let bytes = elements * size;
        let moved = match kind {
            "all_gather" => (n() - 1.0) * bytes,
            "collective_permute" => bytes,
            _ => (n() - 1.0) / n() * bytes,
        };
        *out.entry(kind).or_insert(0.0) += moved;
    }
    out
}

/// The long-context guide's per-layer bytes (docs/src/guides/long-context.md, "What a layer moves
/// per device") against the collectives of each strategy's lowered train step, on a one-layer
/// model of 8 query and 8 key/value heads at context 8 (usp: ring 4 x Ulysses 2), so the guide's
/// formula cannot drift from the code. Per device, with `Q` (= the output's) and `K` (= `V`'s)
/// the bytes of its own tokens' queries and keys, the forward pass moves: all_gather `(n - 1) 2K`
/// (all-gather), ring `(n - 1) 2K` (permutes), ulysses `(n - 1) / n (2Q + 2K)` (all-to-all), usp
/// `(u - 1) / u (2Q + 2K)` (all-to-all) and `(r - 1) 2K` (permutes). A train step under the
/// default `remat_policy=full` moves four times that: the forward pass, its recomputation, the
/// backward's manual computation, which recomputes its body (`autodiff::manual`), and the
/// gradients back (for all_gather a reduce-scatter). XLA then drops the third run's output
/// all-to-all, which nothing reads (the guide's measured 3.6 times for ulysses and usp). Lowered
/// only, nothing compiles.
#[test]
fn collective_bytes_per_layer_are_the_guides() {
    let (heads, kv_heads, head_dim, seq, f32_bytes) = (8, 8, 8, 256, 4.0);
    let tokens = (seq / DEVICES as i64) as f64;
    let q = tokens * (heads * head_dim) as f64 * f32_bytes;
    let k = tokens * (kv_heads * head_dim) as f64 * f32_bytes;
    let (n, r, u) = (8.0, 4.0, 2.0);
    // What the forward pass moves: over the context axis, and usp's within its group and round its ring.
    let gather = (n - 1.0) * 2.0 * k;
    let exchange = |group: f64| (group - 1.0) / group * (2.0 * q + 2.0 * k);
    let ring = |devices: f64| (devices - 1.0) * 2.0 * k;
    for (overrides, label, want) in [
        (&[CONTEXT_8][..], "all_gather", vec![("all_gather", 3.0 * gather), ("reduce_scatter", gather)]),
        (&[CONTEXT_8, RING][..], "ring", vec![("collective_permute", 4.0 * ring(n))]),
        (&[CONTEXT_8, ULYSSES, UNBALANCED][..], "ulysses", vec![("all_to_all", 4.0 * exchange(n))]),
        (&USP_4X2[..], "usp", vec![("all_to_all", 4.0 * exchange(u)), ("collective_permute", 4.0 * ring(r))]),
    ] {
        let (m, mesh) = model(heads, kv_heads, seq, &[overrides, &[FLASH, "remat_policy=full"]].concat());
        let got = collective_bytes(&to_stablehlo(&program(&m, mesh, 1, seq, false)));
        let want: std::collections::BTreeMap<&str, f64> = want.into_iter().collect();
        assert_eq!(got, want, "{label}: bytes per device by collective");
    }
}
