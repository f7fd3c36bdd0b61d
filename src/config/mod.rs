//! Configuration with MaxText's conventions: `configs/base.yml`, `models/<model_name>.yml` and
//! `key=value` arguments load into a typed [`Config`] ([`load`], [`load_args`]); [`validate`] checks
//! it against the devices and derives the mesh, batch sizes and schedule ([`Derived`]);
//! [`axis_rules`] hands the logical axis rules to the sharding code. Every key is declared once
//! in `keys.rs`; [`registry`] answers what is known of each.

mod builtin;
mod choices;
mod context_parallel;
pub mod docs;
mod error;
mod keys;
mod load;
mod maxtext_keys;
mod mesh;
mod mla;
mod nested;
mod pipeline;
mod quantization;
mod ranges;
mod refused;
pub mod registry;
mod rules;
mod validate;
mod value;

pub use builtin::MODELS;
pub use choices::{
    AttentionKernel, AttentionType, ContextParallelStrategy, DType, DatasetType, DecoderBlock, DpoAlgo, Hardware,
    LogicalAxisRule, LrScheduleType, OnCheckpointError, PipelineSchedule, ProfilerKind, Quantization, RematPolicy,
    ReorderStrategy, RopeType, RoutedScoreFunc, RuleAxes, SamplingStrategy, TokenizerType, WsdDecayStyle,
    MLP_ACTIVATIONS,
};
pub use context_parallel::{load_balance, Reorder};
pub use error::{escape, quote, ConfigError};
pub use keys::Config;
pub use load::{load, load_args, load_over, resolve, resolve_args, Resolved, Source};
pub(crate) use mesh::plural;
pub use mesh::{Mesh, MeshAxis, MESH_AXES};
pub use pipeline::PipelinePlan;
pub use quantization::FP8_FAMILIES;
pub use ranges::{range, Range, MAX_CPU_DEVICES, MAX_GPU_HOSTS};
pub use rules::{axis_rules, logical_rules};
pub use validate::{
    check, check_host_memory, parameter_scales, validate, validate_decode, Derived, MEMORY_REMEDIES, PLUGINS,
};
pub use value::{key_names, non_default_value};
