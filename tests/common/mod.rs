//! Helpers shared by the tracer tests: the CPU client, seeded random host arrays, and
//! running a traced program on named inputs.

#![allow(dead_code)] // each test binary uses a different subset

pub mod cli;
pub mod family_ref;
pub mod gcs_emulator;
pub mod key_value_load;
pub mod llama_ref;
pub mod loss_check;
pub mod mixtral_ref;
pub mod mla_ref;
pub mod moe_ref;
pub mod provision;
pub mod tensorboard_reader;

use maxrs::host::HostTensor;
use maxrs::ir::{GatherDims, Program};
use maxrs::pjrt::{cpu_client, Client};
use maxrs::runtime::run_program;
use maxrs::tensor::Tree;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The gather dims of "per batch row `b`, rows `indices[b, i]` of `operand[b]`": an operand
/// `[B, N, width]`, indices `[B, I, 1]`, a result `[B, I, width]`.
pub fn batched_row_gather(width: i64) -> GatherDims {
    GatherDims {
        offset_dims: vec![2],
        collapsed_slice_dims: vec![1],
        operand_batching_dims: vec![0],
        start_indices_batching_dims: vec![0],
        start_index_map: vec![1],
        index_vector_dim: 2,
        slice_sizes: vec![1, 1, width],
    }
}

/// The default model narrowed to a small float32 one that trains in seconds, as `key=value`
/// arguments, followed by `extra`: the base of the tests that run whole training runs.
pub fn small_model(extra: &[&str]) -> Vec<String> {
    let model = [
        "dtype=float32",
        "base_emb_dim=64",
        "base_mlp_dim=128",
        "vocab_size=128",
        "head_dim=16",
        "max_target_length=32",
        "learning_rate=3e-3",
    ];
    model.iter().chain(extra).map(|s| s.to_string()).collect()
}

/// The smallest decoder the data tests train (one layer of width 32), whose compile and steps
/// cost next to nothing beside the data they read.
pub const TINY_DECODER: &[&str] = &[
    "base_emb_dim=32",
    "base_num_query_heads=2",
    "base_num_kv_heads=2",
    "head_dim=16",
    "base_mlp_dim=64",
    "base_num_decoder_layers=1",
];

/// A tiny decoder in f32 whose every size divides over 8 devices: the pipeline tests' model
/// (tests/pipeline.rs, tests/pipeline_checkpoints.rs).
pub const PIPELINE_TINY: &[&str] = &[
    "base_emb_dim=32",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=8",
    "base_mlp_dim=64",
    "vocab_size=128",
    "max_target_length=16",
    "dtype=float32",
    "weight_dtype=float32",
    "learning_rate=1e-2",
    "steps=4",
    // Adam divides each gradient by its own magnitude: with eps 1e-8 an element whose gradient is
    // rounding noise (summed in another order by the pipeline) would take a full step of random
    // sign; 1e-4 keeps such elements still, so parameters compare at 1e-5.
    "adam_eps=1e-4",
    "cpu_device_count=8",
];

/// The process-wide CPU client with 8 devices (single-device programs use the first).
pub fn client() -> Client {
    cpu_client(8).expect("CPU PJRT plugin")
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn uniform(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

pub fn f64_tensor(dims: &[i64], values: &[f64]) -> HostTensor {
    HostTensor::from_f64(dims, values)
}

pub fn run(program: &Program, inputs: &Tree<HostTensor>) -> Tree<HostTensor> {
    run_program(&client(), program, inputs).expect("program runs")
}

/// MaxText's tied-logit table (`attend_on_embedding`, `layers/embeddings.py` at MaxText e591f30:
/// `jnp.asarray(embedding_table, jnp.bfloat16)`): each entry rounded to bf16, to nearest even.
pub fn tied_logit_table(table: &ndarray::Array2<f64>) -> ndarray::Array2<f64> {
    table.mapv(|v| half::bf16::from_f32(v as f32).to_f64())
}

/// Largest |a - b| / max(1, |a|, |b|).
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / 1f64.max(x.abs()).max(y.abs())).fold(0.0, f64::max)
}
