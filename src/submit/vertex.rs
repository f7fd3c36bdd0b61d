//! The Vertex AI custom job for a [`Job`]: the request body of
//! `projects.locations.customJobs.create` (REST `v1`, `CustomJob` / `CustomJobSpec` /
//! `WorkerPoolSpec` / `MachineSpec` / `ContainerSpec` of the Vertex AI reference).
//!
//! Vertex AI's convention for distributed training: worker pool 0 is the primary replica
//! (exactly one), worker pool 1 holds the other N-1 with the same spec; Vertex AI gives every
//! replica `CLUSTER_SPEC` (and `MASTER_ADDR` / `RANK`), from which maxrs's runtime takes the
//! coordinator (the primary), the process count and its rank. The job sets none of the A3 recipe's
//! variables (`NNODES`, `NODE_RANK`, `JAX_COORDINATOR_*`): the runtime would take them as the
//! cluster's description and stop short of `CLUSTER_SPEC`.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use super::{shown_value, Job};

/// Where and as whom the job runs (the Google Cloud side of the request).
#[derive(Clone, Debug, Default)]
pub struct VertexOptions {
    pub project: String,
    pub region: String,
    /// `projects/{number}/global/networks/{name}`.
    pub network: Option<String>,
    /// `projects/{p}/zones/{z}/reservations/{r}`.
    pub reservation: Option<String>,
    pub service_account: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CustomJob {
    pub display_name: String,
    pub job_spec: CustomJobSpec,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CustomJobSpec {
    pub worker_pool_specs: Vec<WorkerPoolSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPoolSpec {
    pub machine_spec: MachineSpec,
    /// An int64, which the API's JSON writes as a string.
    pub replica_count: String,
    pub container_spec: ContainerSpec,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    pub machine_type: String,
    pub accelerator_type: String,
    pub accelerator_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_affinity: Option<ReservationAffinity>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReservationAffinity {
    pub reservation_affinity_type: String,
    pub key: String,
    pub values: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    pub image_uri: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// The custom job body for `job`.
pub fn custom_job(job: &Job, opts: &VertexOptions) -> Result<CustomJob> {
    let image = job.require_image("Vertex AI")?;
    if let Some(network) = &opts.network {
        let parts: Vec<&str> = network.split('/').collect();
        if !matches!(parts.as_slice(), ["projects", p, "global", "networks", n] if !p.is_empty() && !n.is_empty()) {
            bail!("--network {network:?}: Vertex AI takes the full name projects/PROJECT_NUMBER/global/networks/NAME");
        }
    }
    let reservation_affinity = match &opts.reservation {
        None => None,
        Some(r) => {
            let parts: Vec<&str> = r.split('/').collect();
            if !matches!(parts.as_slice(), ["projects", _, "zones", _, "reservations", _] if parts.iter().all(|p| !p.is_empty()))
            {
                bail!(
                    "--reservation {r:?}: Vertex AI takes the full name projects/PROJECT/zones/ZONE/reservations/NAME"
                );
            }
            Some(ReservationAffinity {
                reservation_affinity_type: "SPECIFIC_RESERVATION".into(),
                key: "compute.googleapis.com/reservation-name".into(),
                values: vec![r.clone()],
            })
        }
    };
    let env = job
        .env(job.machine.container_env(), Vec::new())
        .into_iter()
        .map(|(name, value)| EnvVar { name, value })
        .collect();
    let pool = |replicas: usize| WorkerPoolSpec {
        machine_spec: MachineSpec {
            machine_type: job.machine.name.into(),
            accelerator_type: job.machine.vertex_accelerator.into(),
            accelerator_count: job.machine.gpus_per_node as u32,
            reservation_affinity: reservation_affinity.clone(),
        },
        replica_count: replicas.to_string(),
        container_spec: ContainerSpec {
            image_uri: image.to_string(),
            command: vec![job.program.clone()],
            args: job.args.clone(),
            env: Vec::clone(&env),
        },
    };
    let mut pools = vec![pool(1)];
    if job.nodes > 1 {
        pools.push(pool(job.nodes - 1));
    }
    Ok(CustomJob {
        display_name: job.name.clone(),
        job_spec: CustomJobSpec {
            worker_pool_specs: pools,
            network: opts.network.clone(),
            service_account: opts.service_account.clone(),
        },
    })
}

impl CustomJob {
    /// The body as printed: secret environment values replaced by `<redacted>`.
    pub fn to_display_json(&self) -> String {
        let mut shown = self.clone();
        for pool in &mut shown.job_spec.worker_pool_specs {
            for var in &mut pool.container_spec.env {
                var.value = shown_value(&var.name, &var.value).to_string();
            }
        }
        serde_json::to_string_pretty(&shown).expect("a custom job serializes")
    }

    /// The body as sent.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a custom job serializes")
    }
}
