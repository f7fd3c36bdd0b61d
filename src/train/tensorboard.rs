//! TensorBoard event files, as MaxText writes them (through tensorboardX): scalars under
//! MaxText's names (`learning/loss`, `learning/current_learning_rate`, `learning/grad_norm`,
//! `perf/per_device_tflops_per_sec`, ...) in `base_output_directory/run_name/tensorboard/
//! <run_name>/events.out.tfevents.<seconds>.<host>.<pid>.<n>` (maxtext `src/maxtext/utils/
//! max_utils.py` `initialize_summary_writer`, `common/metric_logger.py`
//! `write_metrics_to_tensorboard`, commit e591f30).
//!
//! The file is TensorFlow's TFRecord framing of `tensorflow.Event` protocol buffers: per record
//! the length (u64 little-endian), the masked CRC32C of those 8 bytes, the serialized event, the
//! masked CRC32C of the event (`tensorflow/core/lib/io/record_writer.cc`; mask:
//! `((crc >> 15) | (crc << 17)) + 0xa282ead8`). The first event is `file_version:
//! "brain.Event:2"`; each scalar is an event with `step`, `wall_time` and a `Summary.Value` with
//! `tag` and `simple_value` (`tensorflow/core/util/event.proto`, `framework/summary.proto`; field
//! numbers below).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use prost::Message;

use crate::storage::Appender;

use crate::files::Location;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "EventKind", tags = "3, 5")]
    pub what: Option<EventKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum EventKind {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A oneof in `summary.proto`, so a value of 0.0 is still written.
    #[prost(oneof = "ValueKind", tags = "2")]
    pub value: Option<ValueKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ValueKind {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
}

/// TFRecord's CRC mask: a checksum stored next to data that itself holds checksums must not be
/// a plain CRC of it.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its masked CRC, data, the data's masked CRC.
pub fn tfrecord(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&len);
    record.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    record
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Writes one event file; `flush` makes the events so far durable (and visible on GCS).
pub struct EventWriter {
    file: Appender,
}

impl EventWriter {
    /// A new event file in `dir` (tensorboardX's naming), starting with the file-version event.
    pub fn create(dir: &Location) -> Result<EventWriter> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        // tensorboardX's name, with a counter so two writers of one process never collide.
        static WRITERS: AtomicU64 = AtomicU64::new(0);
        let n = WRITERS.fetch_add(1, Ordering::Relaxed);
        let name = format!("events.out.tfevents.{}.{host}.{}.{n}", now() as u64, std::process::id());
        let mut writer = EventWriter { file: Appender::open("base_output_directory", &dir.join(&name), true)? };
        writer.write(&Event {
            wall_time: now(),
            step: 0,
            what: Some(EventKind::FileVersion("brain.Event:2".into())),
        })?;
        Ok(writer)
    }

    fn write(&mut self, event: &Event) -> Result<()> {
        self.file.append(&tfrecord(&event.encode_to_vec()))
    }

    /// One event holding every `(tag, value)` scalar of `step`.
    pub fn scalars(&mut self, step: u64, scalars: &[(String, f64)]) -> Result<()> {
        let value = scalars
            .iter()
            .map(|(tag, v)| SummaryValue { tag: tag.clone(), value: Some(ValueKind::SimpleValue(*v as f32)) })
            .collect();
        self.write(&Event { wall_time: now(), step: step as i64, what: Some(EventKind::Summary(Summary { value })) })
    }

    pub fn flush(&mut self) -> Result<()> {
        self.file.flush()
    }

    pub fn location(&self) -> &Location {
        self.file.location()
    }
}
