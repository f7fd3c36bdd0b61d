//! `num_vocab_tiling` (MaxText's vocabulary tiling, `utils/vocabulary_tiling.py` at e591f30): the
//! loss's logits computed tile by tile and recomputed in the backward pass. The tiled loss, its
//! aux values and every parameter's gradient equal the untiled ones (a tiny f32 model, z-loss and
//! padding included) on one device and on 8 CPU devices with the batch sharded, untied and tied
//! (soft cap, f32 logits), with and without `vocab_tiling_ag_once`; the tiled step holds no
//! `[batch, seq, vocab]` array and needs less of XLA's temporary memory; the combinations MaxText
//! refuses are refused by name.

use crate::common::loss_check::{loss_program, model_on, random_params, worst_scaled_error};
use crate::common::{client, rng, run};
use maxrs::config;
use maxrs::host::HostTensor;
use maxrs::ir::Program;
use maxrs::lower::to_stablehlo;
use maxrs::model::Model;
use maxrs::sharding::Mesh;
use maxrs::tensor::Tree;
use rand::Rng;

const DEVICES: usize = 8;
const NAMES: [&str; 3] = ["inputs", "targets", "targets_segmentation"];
/// The z-loss multiplier every program uses: its term goes through the tiles too.
const Z_LOSS: f64 = 1e-2;

/// The sizes of the model whose losses are compared: 8 rows of 32 tokens.
const SMALL: [&str; 5] =
    ["base_emb_dim=32", "base_mlp_dim=64", "base_num_decoder_layers=2", "vocab_size=256", "max_target_length=32"];

/// An f32 model with 4 query and 2 key/value heads and the `sizes` and `extra` keys, and its
/// mesh on 8 devices.
fn model(sizes: &[&str], extra: &[&str]) -> (Model, Option<Mesh>) {
    let mut args: Vec<String> = [
        "dtype=float32",
        "weight_dtype=float32",
        "base_num_query_heads=4",
        "base_num_kv_heads=2",
        "head_dim=8",
        "per_device_batch_size=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(sizes.iter().chain(extra).map(|s| s.to_string()));
    model_on(DEVICES, &args)
}

/// The loss, its aux values (`aux.*`) and its gradient (`grad.<param>`) of `m` on a `[rows, seq]`
/// batch, on `mesh` (the batch split by the activation rules) or one device.
fn program(m: &Model, mesh: Option<Mesh>, rows: i64, seq: i64) -> Program {
    loss_program(m, mesh, (rows, seq), &NAMES, Z_LOSS, true)
}

/// Random parameters and a `[rows, seq]` batch whose rows end in padding of uneven lengths.
fn inputs(m: &Model, rows: i64, seq: i64) -> Tree<HostTensor> {
    let mut inp = random_params(m, 29, 0.5);
    let mut r = rng(30);
    let vocab = m.config.vocab as i32;
    let dims = [rows, seq];
    for name in ["inputs", "targets"] {
        let tokens: Vec<i32> = (0..rows * seq).map(|_| r.gen_range(0..vocab)).collect();
        inp.insert(name, HostTensor::from_i32(&dims, &tokens));
    }
    let segmentation: Vec<i32> = (0..rows * seq).map(|i| i32::from(i % seq < seq - 1 - (i / seq) % 4)).collect();
    inp.insert("targets_segmentation", HostTensor::from_i32(&dims, &segmentation));
    inp
}

/// For the model of `common` keys: the untiled loss on one device against each case (its keys
/// and whether it runs on the 8-device mesh).
fn check_against_untiled(common: &[&str], cases: &[(&[&str], bool)]) {
    let (rows, seq) = (8, 32);
    let (plain, _) = model(&SMALL, common);
    let want = run(&program(&plain, None, rows, seq), &inputs(&plain, rows, seq));
    assert!(want["loss"].to_f64()[0] > 1.0, "a loss worth comparing: {:?}", want["loss"].to_f64());
    for (keys, on_mesh) in cases {
        let (m, mesh) = model(&SMALL, &[common, keys].concat());
        let p = program(&m, mesh.filter(|_| *on_mesh), rows, seq);
        let text = to_stablehlo(&p);
        assert!(text.contains("stablehlo.while"), "{keys:?}: the tiles are a loop");
        let err = worst_scaled_error(&run(&p, &inputs(&m, rows, seq)), &want);
        eprintln!("{common:?} {keys:?} mesh={on_mesh}: worst scaled error {err:.2e}");
        assert!(err < 1e-5, "{common:?} {keys:?} mesh={on_mesh}: {err:.2e} from the untiled loss");
    }
}

#[test]
fn tiled_loss_and_gradients_equal_the_untiled_ones() {
    let cases: &[(&[&str], bool)] = &[
        (&["num_vocab_tiling=4"], false),
        (&["num_vocab_tiling=32"], false),
        // fsdp 8: one row per device, each device's 32 tokens in 4 tiles of 8.
        (&["num_vocab_tiling=4"], true),
        (&["num_vocab_tiling=4", "vocab_tiling_ag_once=true"], true),
        // context 2 x fsdp 4: each device's 16 tokens of 2 rows in 8 tiles.
        (&["num_vocab_tiling=8", "ici_context_parallelism=2", "ici_fsdp_parallelism=4"], true),
    ];
    check_against_untiled(&[], cases);
}

/// Tied, the table is rounded to bf16 for the product (`attend_on_embedding`), and so is its
/// gradient through the logits: tiled, each tile's gradient is rounded before the tiles add up
/// (as in MaxText's tiled backward pass, which sums the tiles' f32 gradients), untiled the sum is
/// rounded once. The table's gradient differs by that rounding (6.5e-6 here), the rest by at most 3e-7.
#[test]
fn tied_logits_tiled_equal_them_untiled() {
    let tied = ["logits_via_embedding=true", "final_logits_soft_cap=5.0", "logits_dot_in_fp32=true"];
    let cases: &[(&[&str], bool)] = &[
        (&["num_vocab_tiling=2"], false),
        (
            &["num_vocab_tiling=8", "vocab_tiling_ag_once=true", "ici_context_parallelism=2", "ici_fsdp_parallelism=4"],
            true,
        ),
    ];
    check_against_untiled(&tied, cases);
}

/// The tiled step keeps no `[batch, seq, vocab]` array: its program has none (one tile's
/// `[batch, seq / tiles, vocab]` logits instead, not stacked over the tiles), and XLA's
/// temporary memory for it (compiled on one CPU device) is smaller by more than the f32 logits
/// of the untiled step (which keeps the logits and their cotangent).
#[test]
fn the_tiled_step_holds_one_tile_of_logits() {
    let (rows, seq, vocab) = (2, 256, 4096);
    let sizes =
        ["base_emb_dim=16", "base_mlp_dim=32", "base_num_decoder_layers=1", "vocab_size=4096", "max_target_length=256"];
    let temp = |tiles: i64| {
        let (m, _) = model(&sizes, &[&format!("num_vocab_tiling={tiles}")]);
        let p = program(&m, None, rows, seq);
        let text = to_stablehlo(&p);
        let full = format!("tensor<{rows}x{seq}x{vocab}xf32>");
        let tile = format!("tensor<{rows}x{}x{vocab}xf32>", seq / tiles);
        assert_eq!(text.contains(&full), tiles == 1, "{tiles} tiles: {full} in the program");
        assert!(text.contains(&tile), "{tiles} tiles: no {tile} in the program");
        // Nor are the tiles' logits stacked for the backward pass.
        let stacked = format!("tensor<{tiles}x{rows}x{}x{vocab}x", seq / tiles);
        assert!(!text.contains(&stacked), "{tiles} tiles: {stacked} in the program");
        let compiled = maxrs::runtime::compile(&client(), &p).expect("compiles");
        let stats = compiled.executable.executable().compiled_memory_stats().expect("memory statistics");
        stats.temp_bytes
    };
    let (untiled, tiled) = (temp(1), temp(8));
    let logits = rows * seq * vocab * 4;
    eprintln!("temporaries: untiled {untiled} bytes, 8 tiles {tiled} bytes; the logits are {logits} bytes");
    assert!(untiled - tiled >= logits * 3 / 2, "untiled {untiled} vs tiled {tiled} bytes of temporaries");
}

#[test]
fn refusals_name_the_keys() {
    let refused = |extra: &[&str]| -> String {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let c = config::load(None, &args).expect("config loads");
        config::validate(&c, DEVICES, 1).expect_err("refused").to_string()
    };
    // MaxText's check: each device's tokens split into the tiles.
    let e = refused(&["num_vocab_tiling=3", "per_device_batch_size=1", "max_target_length=64"]);
    assert!(e.starts_with("num_vocab_tiling, per_device_batch_size, max_target_length: "), "{e}");
    assert!(e.contains("64 tokens do not split into num_vocab_tiling=3"), "{e}");
    // maxrs's tiles are strided over whole rows.
    let e = refused(&["num_vocab_tiling=4", "per_device_batch_size=2", "max_target_length=66"]);
    assert!(e.starts_with("num_vocab_tiling, max_target_length: ") && e.contains("is not supported yet"), "{e}");
    let e = refused(&["num_vocab_tiling=2", "ici_pipeline_parallelism=2", "base_num_decoder_layers=4"]);
    assert!(e.contains("num_vocab_tiling, ici_pipeline_parallelism") && e.contains("not supported yet"), "{e}");
    let dpo = ["dataset_type=hf", "hf_train_files=pairs.jsonl", "tokenizer_path=tokenizer.model", "packing=false"];
    let dpo: Vec<&str> = dpo.into_iter().chain(["train_data_columns=[chosen, rejected]", "use_dpo=true"]).collect();
    let e = refused(&[&dpo[..], &["num_vocab_tiling=2"]].concat());
    assert!(e.starts_with("num_vocab_tiling, use_dpo: ") && e.contains("not supported with DPO"), "{e}");
    let e = refused(&["num_vocab_tiling=0"]);
    assert!(e.contains("num_vocab_tiling"), "{e}");
}
