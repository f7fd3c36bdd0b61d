//! The cloud machine types `maxrs submit` knows: GPUs per node, the names each launcher uses for
//! them, the NCCL environment their network stack needs, and the XLA flags tuned for a node count.
//!
//! Sources (read, not copied):
//! - GPUDirect-TCPXO environment inside a container (Vertex AI, GKE): the NCCL settings of
//!   ../shared/REFERENCE.md §2 and Google's `nccl-env-profile.sh` values as a Vertex AI A3 Mega
//!   launch script exports them, plus what xpk adds to GPU containers on A3 Mega
//!   (`LD_LIBRARY_PATH`, `NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY`: AI-Hypercomputer/xpk
//!   `src/xpk/core/workload_decorators/tcpxo_decorator.py` at 01706daf).
//! - On Slurm (Cluster Toolkit's A3 Mega image) the profile and plugin live in `/var/lib/tcpxo/lib64`
//!   and the NICs have PCI names: GoogleCloudPlatform/cluster-toolkit
//!   `examples/machine-learning/a3-megagpu-8g/nccl-tests/run-nccl-tests.sh` at 2452d0dc.
//! - XLA flags: the built-in `xla_flags/a3mega-N.flags` set for the job's node count
//!   (`xla_flags::a3mega_for_nodes`: MaxText's `src/maxtext/configs/gpu/a3/llama_2_7b/{1,2,4,8,16}vm.sh`).

use anyhow::{bail, Result};

use crate::pjrt::xla_flags::{a3mega_for_nodes, builtin_flag_set, XlaFlags};

/// One machine type.
#[derive(Debug)]
pub struct MachineType {
    /// Compute Engine's name (`a3-megagpu-8g`).
    pub name: &'static str,
    /// What it is, for messages.
    pub description: &'static str,
    pub gpus_per_node: usize,
    /// Vertex AI's `machineSpec.acceleratorType`.
    pub vertex_accelerator: &'static str,
    /// GKE's `cloud.google.com/gke-accelerator` node label.
    pub gke_accelerator: &'static str,
    /// The built-in XLA flag set (`xla_flags/<name>.flags`).
    pub xla_flag_set: &'static str,
    /// The maxrs AOT target for N of these nodes (`maxrs train-compile --topology=<prefix>-N`).
    pub aot_topology_prefix: &'static str,
}

/// Every machine type `maxrs submit` can target.
pub const MACHINE_TYPES: &[MachineType] = &[MachineType {
    name: "a3-megagpu-8g",
    description: "8 x NVIDIA H100 80GB, GPUDirect-TCPXO",
    gpus_per_node: 8,
    vertex_accelerator: "NVIDIA_H100_MEGA_80GB",
    gke_accelerator: "nvidia-h100-mega-80gb",
    xla_flag_set: "a3mega",
    aot_topology_prefix: "a3mega",
}];

/// The default machine: A3 Mega.
pub const DEFAULT_MACHINE_TYPE: &str = "a3-megagpu-8g";

/// Looks a machine type up by name; the error lists the known ones and the closest.
pub fn machine_type(name: &str) -> Result<&'static MachineType> {
    if let Some(m) = MACHINE_TYPES.iter().find(|m| m.name == name) {
        return Ok(m);
    }
    let known: Vec<String> = MACHINE_TYPES.iter().map(|m| format!("{} ({})", m.name, m.description)).collect();
    let hint = super::closest(name, MACHINE_TYPES.iter().map(|m| m.name))
        .map(|s| format!("; did you mean `{s}`?"))
        .unwrap_or_default();
    bail!("unknown machine type `{name}`{hint} (maxrs submit knows {})", known.join(", "))
}

/// The NCCL plugin, tuner and profile inside a container on A3 Mega (Vertex AI and GKE mount
/// the host's GPUDirect-TCPXO libraries here).
const CONTAINER_NCCL_LIB_DIR: &str = "/usr/local/nvidia/lib64";

impl MachineType {
    /// The environment NCCL needs inside a container on this machine (Vertex AI, GKE), in order.
    pub fn container_env(&self) -> Vec<(String, String)> {
        let lib = CONTAINER_NCCL_LIB_DIR;
        let nics = (1..=8).map(|i| format!("eth{i}")).collect::<Vec<_>>().join(",");
        [
            ("LD_LIBRARY_PATH", lib.to_string()),
            ("NCCL_FASTRAK_CTRL_DEV", "eth0".into()),
            ("NCCL_FASTRAK_IFNAME", nics),
            ("NCCL_SOCKET_IFNAME", "eth0".into()),
            ("NCCL_CROSS_NIC", "0".into()),
            ("NCCL_ALGO", "Ring,Tree".into()),
            ("NCCL_PROTO", "Simple".into()),
            ("NCCL_MIN_NCHANNELS", "4".into()),
            ("NCCL_P2P_NET_CHUNKSIZE", "524288".into()),
            ("NCCL_P2P_PCI_CHUNKSIZE", "524288".into()),
            ("NCCL_P2P_NVL_CHUNKSIZE", "1048576".into()),
            ("NCCL_FASTRAK_NUM_FLOWS", "2".into()),
            ("NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL", "0".into()),
            ("NCCL_BUFFSIZE", "8388608".into()),
            ("NCCL_FASTRAK_USE_SNAP", "1".into()),
            ("NCCL_FASTRAK_USE_LLCM", "1".into()),
            ("NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY", "/dev/aperture_devices".into()),
            ("NCCL_NET_GDR_LEVEL", "PIX".into()),
            ("NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING", "0".into()),
            ("NCCL_TUNER_PLUGIN", "libnccl-tuner.so".into()),
            ("NCCL_TUNER_CONFIG_PATH", format!("{lib}/a3plus_tuner_config.textproto")),
            ("NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE", format!("{lib}/a3plus_guest_config.textproto")),
            ("NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS", "600000".into()),
            ("NCCL_NVLS_ENABLE", "0".into()),
            ("CUDA_DEVICE_MAX_CONNECTIONS", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Shell lines that set NCCL up on a Slurm node of this machine type (Cluster Toolkit's image:
    /// the profile sets the tuned values, the lines after it name the NICs).
    pub fn slurm_nccl_lines(&self) -> Vec<String> {
        let lib = "/var/lib/tcpxo/lib64";
        vec![
            format!("NCCL_LIB_DIR={lib} source {lib}/nccl-env-profile.sh"),
            "export NCCL_FASTRAK_CTRL_DEV=enp0s12".into(),
            "export NCCL_FASTRAK_IFNAME=enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0".into(),
            "export NCCL_SOCKET_IFNAME=enp0s12".into(),
            "export NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY=/dev/aperture_devices".into(),
            "export NCCL_NVLS_ENABLE=0".into(),
            "export CUDA_DEVICE_MAX_CONNECTIONS=1".into(),
            format!("export LD_LIBRARY_PATH={lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"),
        ]
    }

    /// The directory a Slurm container needs mounted for the NCCL plugin.
    pub fn slurm_container_mounts(&self) -> Vec<&'static str> {
        vec!["/var/lib/tcpxo/lib64"]
    }

    /// The tuned XLA flags for `nodes` of these machines: the built-in set for that node count
    /// (the same one `xla_flags_file=a3mega` picks inside the job).
    pub fn xla_flags(&self, nodes: usize) -> XlaFlags {
        let name = match self.xla_flag_set {
            "a3mega" => a3mega_for_nodes(u32::try_from(nodes).unwrap_or(u32::MAX)),
            other => other,
        };
        builtin_flag_set(name).expect("MACHINE_TYPES names built-in flag sets")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_follow_the_node_count() {
        // The all-reduce combine thresholds written in MaxText's 1vm/2vm/4vm/8vm/16vm.sh.
        let m = machine_type("a3-megagpu-8g").unwrap();
        for (nodes, bytes) in
            [(1, "134217728"), (2, "67108864"), (4, "536870912"), (8, "1073741824"), (16, "1073741824")]
        {
            let flags = m.xla_flags(nodes);
            assert_eq!(flags.get("xla_gpu_all_reduce_combine_threshold_bytes"), Some(Some(bytes)), "{nodes} nodes");
            assert_eq!(flags.get("xla_gpu_enable_latency_hiding_scheduler"), Some(Some("true")));
        }
    }

    #[test]
    fn unknown_machine_names_the_known_ones() {
        let e = machine_type("a3-megagpu-4g").unwrap_err().to_string();
        assert!(
            e.contains("unknown machine type `a3-megagpu-4g`") && e.contains("did you mean `a3-megagpu-8g`"),
            "{e}"
        );
    }
}
