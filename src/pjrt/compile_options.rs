//! The compile options PJRT takes: `xla.CompileOptionsProto`, serialized with prost.
//!
//! The messages are written by hand with the field numbers of XLA's
//! `xla/pjrt/proto/compile_options.proto` and `xla/xla_data.proto`, holding only the fields
//! maxrs sets (protobuf skips the rest), so no protoc is needed to build maxrs.

use std::collections::HashMap;

use prost::Message;

/// `xla.DeviceAssignmentProto.ComputationDevice`.
#[derive(Clone, PartialEq, Message)]
pub struct ComputationDevice {
    #[prost(int64, repeated, tag = "1")]
    pub replica_device_ids: Vec<i64>,
}

/// `xla.DeviceAssignmentProto`: which device runs each (replica, partition).
#[derive(Clone, PartialEq, Message)]
pub struct DeviceAssignmentProto {
    #[prost(int32, tag = "1")]
    pub replica_count: i32,
    #[prost(int32, tag = "2")]
    pub computation_count: i32,
    #[prost(message, repeated, tag = "3")]
    pub computation_devices: Vec<ComputationDevice>,
}

/// `xla.ExecutableBuildOptionsProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ExecutableBuildOptionsProto {
    #[prost(int64, tag = "1")]
    pub device_ordinal: i64,
    #[prost(int64, tag = "4")]
    pub num_replicas: i64,
    #[prost(int64, tag = "5")]
    pub num_partitions: i64,
    #[prost(bool, tag = "6")]
    pub use_spmd_partitioning: bool,
    #[prost(message, optional, tag = "9")]
    pub device_assignment: Option<DeviceAssignmentProto>,
    #[prost(bool, tag = "19")]
    pub use_shardy_partitioner: bool,
    #[prost(int64, tag = "22")]
    pub process_index: i64,
    #[prost(int64, tag = "23")]
    pub process_count: i64,
}

/// `xla.OptionOverrideProto`: one XLA flag value in `env_option_overrides`.
#[derive(Clone, PartialEq, Message)]
pub struct OptionOverrideProto {
    #[prost(oneof = "OptionOverrideValue", tags = "1, 2, 3, 4")]
    pub value: Option<OptionOverrideValue>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum OptionOverrideValue {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(double, tag = "4")]
    Double(f64),
}

/// `xla.CompileOptionsProto`.
#[derive(Clone, PartialEq, Message)]
pub struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    pub executable_build_options: Option<ExecutableBuildOptionsProto>,
    #[prost(map = "string, message", tag = "7")]
    pub env_option_overrides: HashMap<String, OptionOverrideProto>,
}

/// What maxrs decides about a compilation; [`CompileOptions::to_proto_bytes`] makes the proto.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    pub num_replicas: i64,
    pub num_partitions: i64,
    pub use_spmd_partitioning: bool,
    pub use_shardy_partitioner: bool,
    /// Device ids, replica-major (`replica * num_partitions + partition`). `None` lets the
    /// plugin choose its default.
    pub device_assignment: Option<Vec<i64>>,
    pub process_index: i64,
    pub process_count: i64,
    /// Per-compile XLA debug option overrides (flag name without `--`, value as text).
    pub xla_option_overrides: Vec<(String, String)>,
}

impl CompileOptions {
    /// One replica, one partition.
    pub fn single_device() -> CompileOptions {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            use_shardy_partitioner: false,
            device_assignment: None,
            process_index: 0,
            process_count: 1,
            xla_option_overrides: Vec::new(),
        }
    }

    /// An SPMD program over `num_partitions` devices, partitioned by Shardy (the partitioner
    /// XLA's GPU plugin recommends; GSPMD is deprecated there).
    pub fn spmd(num_partitions: i64) -> CompileOptions {
        CompileOptions {
            num_partitions,
            use_spmd_partitioning: true,
            use_shardy_partitioner: true,
            device_assignment: Some((0..num_partitions).collect()),
            ..CompileOptions::single_device()
        }
    }

    pub fn to_proto(&self) -> CompileOptionsProto {
        // `ids` lists the devices replica-major: replica r, partition p runs on
        // ids[r * num_partitions + p]; the proto holds one list of replicas per partition.
        let device_assignment = self.device_assignment.as_ref().map(|ids| {
            let partitions = self.num_partitions.max(1) as usize;
            DeviceAssignmentProto {
                replica_count: self.num_replicas as i32,
                computation_count: self.num_partitions as i32,
                computation_devices: (0..partitions)
                    .map(|p| ComputationDevice {
                        replica_device_ids: ids.iter().skip(p).step_by(partitions).copied().collect(),
                    })
                    .collect(),
            }
        });
        let env_option_overrides = self
            .xla_option_overrides
            .iter()
            .map(|(name, value)| (name.clone(), OptionOverrideProto { value: Some(override_value(value)) }))
            .collect();
        CompileOptionsProto {
            executable_build_options: Some(ExecutableBuildOptionsProto {
                device_ordinal: -1,
                num_replicas: self.num_replicas,
                num_partitions: self.num_partitions,
                use_spmd_partitioning: self.use_spmd_partitioning,
                device_assignment,
                use_shardy_partitioner: self.use_shardy_partitioner,
                process_index: self.process_index,
                process_count: self.process_count,
            }),
            env_option_overrides,
        }
    }

    pub fn to_proto_bytes(&self) -> Vec<u8> {
        self.to_proto().encode_to_vec()
    }
}

/// XLA applies an override to the `DebugOptions` field of the same name and requires the value
/// to have that field's type, so a text value goes as the narrowest type it parses as.
fn override_value(text: &str) -> OptionOverrideValue {
    if let Ok(b) = text.parse::<bool>() {
        OptionOverrideValue::Bool(b)
    } else if let Ok(i) = text.parse::<i64>() {
        OptionOverrideValue::Int(i)
    } else if let Ok(f) = text.parse::<f64>() {
        OptionOverrideValue::Double(f)
    } else {
        OptionOverrideValue::String(text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spmd_options_round_trip_through_protobuf() {
        let mut options = CompileOptions::spmd(8);
        options.xla_option_overrides.push(("xla_cpu_enable_fast_math".into(), "false".into()));
        let bytes = options.to_proto_bytes();
        let decoded = CompileOptionsProto::decode(bytes.as_slice()).unwrap();
        let build = decoded.executable_build_options.unwrap();
        assert_eq!(build.num_partitions, 8);
        assert!(build.use_spmd_partitioning && build.use_shardy_partitioner);
        let assignment = build.device_assignment.unwrap();
        assert_eq!(assignment.computation_count, 8);
        assert_eq!(assignment.computation_devices[7].replica_device_ids, vec![7]);
        assert_eq!(
            decoded.env_option_overrides["xla_cpu_enable_fast_math"].value,
            Some(OptionOverrideValue::Bool(false))
        );
    }
}
