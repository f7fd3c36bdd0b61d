//! Configuration with MaxText's conventions: `configs/base.yml`, `models/<model_name>.yml` and
//! `key=value` arguments load into a typed [`Config`] ([`load`], [`load_args`]); [`validate`] checks
//! it against the devices and derives the mesh, batch sizes and schedule ([`Derived`]);
//! [`axis_rules`] hands the logical axis rules to the sharding code.

mod builtin;
mod error;
mod keys;
mod load;
mod mesh;
mod pipeline;
mod rules;
mod validate;
mod value;

pub use builtin::MODELS;
pub use error::ConfigError;
pub use keys::{
    Config, DType, DatasetType, DecoderBlock, Hardware, LogicalAxisRule, LrScheduleType, PipelineSchedule, RematPolicy,
    RuleAxes, WsdDecayStyle,
};
pub use load::{load, load_args};
pub(crate) use mesh::plural;
pub use mesh::{Mesh, MeshAxis, MESH_AXES};
pub use pipeline::PipelinePlan;
pub use rules::{axis_rules, logical_rules};
pub use validate::{validate, Derived, PLUGINS};
pub use value::key_names;
