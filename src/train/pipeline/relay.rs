//! Arrays between pipeline stages of different processes on the CPU plugin, which has no
//! cross-process transfers (and no cross-process programs): through the coordination service's
//! key-value store that every process of the job already talks to. This is the CPU path, for
//! tests and CPU clusters; on GPUs a relay through the host is what issue 51 rules out (PJRT's
//! cross-host transfers, NCCL send/recv, are the GPU design: docs/design/cross-host-pipeline.md).
//!
//! An array goes block by block: the block at position `p` of the sending stage's mesh is read
//! by the device at position `p` of the receiving stage's, as a one-process pipeline copies it
//! device to device. Each block is a header (type and shape) and its bytes in chunks of at most
//! [`CHUNK`] bytes, under keys that name the step's round, the task that reads it and the
//! position. The key-value store keeps what was put until it is read, so a sender never waits
//! for its receiver and the stages' task orders cannot deadlock through the relay; a receiver
//! waits in short polls that check whether the step was aborted or the job failed (a dead peer
//! stops the job through the coordination service within `heartbeat_timeout_seconds`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::cluster::CoordinationClient;
use crate::host::{DType, HostTensor};

/// The most bytes in one value: the coordination service's gRPC messages are limited to 4 MiB
/// (tonic's default decoding limit, which the service keeps), and a value travels in one.
pub const CHUNK: usize = 1 << 20;

/// How long one poll of a key waits before checking for an abort.
const POLL: Duration = Duration::from_millis(500);

/// What a block's header says.
#[derive(Serialize, Deserialize)]
struct Header {
    ty: DType,
    dims: Vec<i64>,
    chunks: usize,
}

/// The relay of one process of a job.
#[derive(Clone)]
pub struct Relay {
    client: Arc<CoordinationClient>,
}

impl Relay {
    pub fn new(client: Arc<CoordinationClient>) -> Relay {
        Relay { client }
    }

    /// Puts `block` under `key`.
    pub fn put(&self, key: &str, block: &HostTensor) -> Result<()> {
        let chunks: Vec<&[u8]> = block.data.chunks(CHUNK).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            self.client.key_value_set(&format!("{key}/{i}"), chunk, false)?;
        }
        // The header last: a reader that has it finds every chunk.
        let header = Header { ty: block.ty, dims: block.dims.clone(), chunks: chunks.len() };
        self.client.key_value_set(&format!("{key}/header"), &serde_json::to_vec(&header)?, false)
    }

    /// Waits for the block under `key`, takes it and deletes it from the store; gives up with
    /// an error when `abort` is set (another stage of this process failed) or the job failed.
    pub fn take(&self, key: &str, abort: &AtomicBool) -> Result<HostTensor> {
        let header = self.wait(&format!("{key}/header"), abort)?;
        let header: Header =
            serde_json::from_slice(&header).with_context(|| format!("the header of the relayed array {key}"))?;
        let mut data = Vec::new();
        for i in 0..header.chunks {
            data.extend(self.wait(&format!("{key}/{i}"), abort)?);
        }
        self.client.key_value_delete(key)?;
        let elements = header.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?));
        if elements.and_then(|n| n.checked_mul(header.ty.byte_size())) != Some(data.len()) {
            bail!("the relayed array {key} has {} bytes, which is not {} {:?}", data.len(), header.ty, header.dims);
        }
        Ok(HostTensor::new(header.ty, &header.dims, data))
    }

    /// Puts a small value (a stage's step summary) under `key`.
    pub fn put_value(&self, key: &str, value: &[u8]) -> Result<()> {
        self.client.key_value_set(key, value, false)
    }

    /// Waits for the value under `key` (left in the store: several processes may read it).
    pub fn wait(&self, key: &str, abort: &AtomicBool) -> Result<Vec<u8>> {
        loop {
            if abort.load(Ordering::SeqCst) {
                bail!("{}", super::executor::STOPPED);
            }
            if let Some(failure) = self.client.failure() {
                return Err(anyhow!("waiting for {key} from another process: {failure}"));
            }
            match self.client.key_value_try_get(key)? {
                Some(value) => return Ok(value),
                None => {
                    // A blocking get returns as soon as the key is set; its timeout is the poll.
                    if let Ok(value) = self.client.blocking_key_value_get(key, POLL) {
                        return Ok(value);
                    }
                }
            }
        }
    }

    /// Deletes `key` and everything under it.
    pub fn delete(&self, key: &str) -> Result<()> {
        self.client.key_value_delete(key)
    }
}
