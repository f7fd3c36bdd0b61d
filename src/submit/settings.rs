//! Team settings for `maxrs submit`: the `submit:` section of a YAML file (`--submit-config FILE`
//! or `$MAXRS_SUBMIT_CONFIG`), so that project, region, image, network and reservation live in
//! one place. Command-line flags override the file. The file holds no secrets: credentials come
//! from Application Default Credentials, never from here.
//!
//! ```yaml
//! submit:
//!   project: my-project
//!   region: us-central1
//!   image: us-docker.pkg.dev/my-project/maxrs/maxrs:latest
//!   network: projects/123456789/global/networks/my-vpc
//!   reservation: projects/my-project/zones/us-central1-a/reservations/a3mega-pool
//!   slurm: {partition: a3mega}
//!   gke: {namespace: training, queue: multislice-queue}
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, Result};
use serde::Deserialize;

use crate::net::google;

/// The `submit:` section. Every field is optional; unknown keys are errors.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Google Cloud project (Vertex AI).
    pub project: Option<String>,
    /// Vertex AI region (`us-central1`).
    pub region: Option<String>,
    /// Container image with `maxrs` on its PATH (Vertex AI, GKE; the Slurm container image).
    pub image: Option<String>,
    /// Vertex AI: the VPC to peer with, `projects/{number}/global/networks/{name}`.
    pub network: Option<String>,
    /// Vertex AI: a specific Compute Engine reservation, `projects/{p}/zones/{z}/reservations/{r}`.
    pub reservation: Option<String>,
    /// Vertex AI: the service account the job runs as.
    pub service_account: Option<String>,
    pub machine_type: Option<String>,
    pub nodes: Option<usize>,
    /// Job name (Vertex display name, Slurm job name, JobSet name).
    pub name: Option<String>,
    /// The maxrs program on the nodes (default `maxrs`, found on PATH).
    pub maxrs: Option<String>,
    /// Extra environment for every process; the command line's `--env` wins.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub slurm: SlurmSettings,
    #[serde(default)]
    pub gke: GkeSettings,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SlurmSettings {
    pub partition: Option<String>,
    /// Wall-clock limit, as sbatch takes it (`24:00:00`).
    pub time: Option<String>,
    pub account: Option<String>,
    /// `module load` lines before the run.
    #[serde(default)]
    pub modules: Vec<String>,
    /// Extra pyxis `--container-mounts` entries (`src:dst`).
    #[serde(default)]
    pub container_mounts: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GkeSettings {
    pub namespace: Option<String>,
    /// Kueue LocalQueue (`kueue.x-k8s.io/queue-name` label).
    pub queue: Option<String>,
    /// GKE Network objects for eth1..eth8 (GPUDirect-TCPXO multi-networking).
    #[serde(default)]
    pub networks: Vec<String>,
}

impl Settings {
    /// Reads the `submit:` section of the YAML file at `path`; other top-level keys are left to
    /// whoever else reads the file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string("submit settings file", path, crate::input::SETTINGS)?;
        Self::parse(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
    }

    /// Parses a YAML document's `submit:` section.
    pub fn parse(text: &str) -> Result<Self> {
        let doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| anyhow!("not valid YAML: {e}"))?;
        let section = doc.get("submit").ok_or_else(|| {
            anyhow!("no `submit:` section (the settings are read from a top-level `submit:` mapping)")
        })?;
        let settings: Settings =
            serde_yaml::from_value(section.clone()).map_err(|e| anyhow!("in the `submit:` section: {e}"))?;
        // They go into request URLs (the region into the endpoint's host name).
        if let Some(project) = &settings.project {
            google::check_project("`project:`", project)?;
        }
        if let Some(region) = &settings.region {
            google::check_region("`region:`", region)?;
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_section_and_ignores_other_keys() {
        let s = Settings::parse(
            "team: x\nsubmit:\n  project: my-project\n  region: us-central1\n  nodes: 2\n  env: {A: b}\n  slurm: {partition: a3mega, modules: [cuda]}\n",
        )
        .unwrap();
        assert_eq!(s.project.as_deref(), Some("my-project"));
        assert_eq!(s.nodes, Some(2));
        assert_eq!(s.env.get("A").map(String::as_str), Some("b"));
        assert_eq!(s.slurm.partition.as_deref(), Some("a3mega"));
        assert_eq!(s.slurm.modules, ["cuda"]);
    }

    #[test]
    fn unknown_keys_and_missing_section_are_named() {
        let e = Settings::parse("submit:\n  regoin: us-central1\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `regoin`") && e.contains("region"), "{e}");
        let e = Settings::parse("submit:\n  gke: {namespce: x}\n").unwrap_err().to_string();
        assert!(e.contains("namespce"), "{e}");
        let e = Settings::parse("project: p\n").unwrap_err().to_string();
        assert!(e.contains("no `submit:` section"), "{e}");
        let e = Settings::parse("submit:\n  region: evil.example.com/x?\n").unwrap_err().to_string();
        assert!(e.starts_with("`region:` \"evil.example.com/x?\" is not a Google Cloud region"), "{e}");
        let e = Settings::parse("submit:\n  project: ../../evil\n").unwrap_err().to_string();
        assert!(e.starts_with("`project:` \"../../evil\" is not a Google Cloud project"), "{e}");
    }
}
