//! MaxText keys that maxrs refuses by name, each group with the reason or what to do instead:
//! loading says "not supported yet" and why, rather than calling them unknown. They are
//! MaxText's checkpointing, run-output and data keys of `src/maxtext/configs/base.yml` at main
//! e591f30 (the keys maxrs has are declared in `keys.rs`).

/// A group of refused MaxText keys and the one reason for all of them.
#[derive(Clone, Copy, Debug)]
pub struct Refusal {
    pub keys: &'static [&'static str],
    pub reason: &'static str,
}

const fn refuse(keys: &'static [&'static str], reason: &'static str) -> Refusal {
    Refusal { keys, reason }
}

/// Every refused key, grouped by reason.
pub const REFUSED: &[Refusal] = &[
    refuse(
        &[
            "checkpoint_storage_target_data_file_size_bytes",
            "checkpoint_storage_use_ocdbt",
            "checkpoint_storage_use_zarr3",
            "checkpoint_storage_concurrent_gb",
            "enable_orbax_v1",
            "source_checkpoint_layout",
            "checkpoint_conversion_fn",
        ],
        "maxrs writes safetensors checkpoints with a manifest, not Orbax's OCDBT/Zarr storage",
    ),
    refuse(&["enable_continuous_checkpointing"], "checkpoints are saved every checkpoint_period steps"),
    refuse(
        &["enable_single_replica_ckpt_restoring", "colocated_python_checkpointing"],
        "one process restores everything",
    ),
    refuse(
        &["checkpoint_todelete_subdir", "checkpoint_todelete_full_path"],
        "max_num_checkpoints_to_keep deletes old checkpoints outright",
    ),
    refuse(
        &[
            "enable_emergency_checkpoint",
            "enable_multi_tier_checkpointing",
            "local_checkpoint_directory",
            "local_checkpoint_period",
            "multi_tier_checkpointing_backup_interval_minutes",
            "multi_tier_checkpointing_backup_interval_steps",
        ],
        "there is one checkpoint directory per run",
    ),
    // MaxText reads both in its conversion scripts only (`checkpoint_conversion/to_maxtext.py`,
    // `standalone_scripts/llama_or_mistral_ckpt.py` at e591f30), never in training.
    refuse(
        &["hf_lora_adapter_path"],
        "a PEFT adapter is converted with `maxrs convert from-hf HF_DIR DST hf_lora_adapter_path=ADAPTER_DIR` (as MaxText's to_maxtext.py reads it), and a run loads it with load_parameters_path=DST",
    ),
    refuse(&["lora_input_adapters_path"], "Meta-format adapters (MaxText's llama_or_mistral_ckpt.py) are not converted yet; PEFT adapters are"),
    refuse(&["lora.lora_weight_qtype", "lora.lora_tile_size"], "maxrs has LoRA but no QLoRA (quantized base weights) yet"),

    // The encoders' own keys are inert without these (`maxtext_keys::inert`).
    refuse(
        &["use_multimodal", "use_audio"],
        "maxrs models text only: no vision or audio encoder (gemma3 and llama4 are their language models)",
    ),
    refuse(&["checkpoint_is_quantized"], "maxrs has no quantized checkpoints"),
    refuse(
        &["use_vertex_tensorboard", "vertex_tensorboard_project", "vertex_tensorboard_region", "enable_wandb"],
        "TensorBoard event files are written to base_output_directory/run_name/tensorboard/",
    ),
    refuse(
        &["tokenize_train_data", "tokenize_eval_data"],
        "pre-tokenized hf columns are not read; convert with `maxrs tokenize` and use dataset_type=tokens",
    ),
    refuse(
        &[
            "grain_train_files",
            "grain_eval_files",
            "grain_file_type",
            "dataset_name",
            "eval_dataset_name",
            "eval_split",
        ],
        "maxrs has no grain or tfds pipeline; use dataset_type=hf or tokens",
    ),
    refuse(
        &[
            "use_truncation",
            "num_epoch",
            "generate_padding_batch_train",
            "generate_padding_batch_eval",
            "expansion_factor_real_data",
            "use_chat_template",
        ],
        "maxrs always truncates documents and repeats epochs until `steps`",
    ),
];

/// Why MaxText key `key` is refused, if it is one maxrs refuses by name.
pub(crate) fn not_supported_yet(key: &str) -> Option<&'static str> {
    REFUSED.iter().find(|r| r.keys.contains(&key)).map(|r| r.reason)
}
