//! Issue 47's read throughput: maxrs's reader of MaxText's Orbax checkpoints (OCDBT + zarr v3,
//! `checkpoint::orbax`) on a large generated checkpoint, against Orbax's own restore of the same
//! folder. `tools/orbax_read_bench.py` writes the checkpoint as MaxText does and times Orbax
//! (its `orbax_restore.json` beside the folder); this reads every array whole into host memory,
//! as Orbax's restore does, and then as 8 devices' row blocks (each array's first axis cut in
//! 8), read in one call per array as a host with 8 devices reads its blocks. Warm page cache for
//! both.
//!
//!     python tools/orbax_read_bench.py --out /tmp/obench --gib 3
//!     cargo bench --bench orbax_read -- /tmp/obench/ckpt

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use maxrs::checkpoint::orbax::{read_in_parallel, Checkpoint};
use maxrs::files::Location;

const REPEATS: usize = 3;
const BLOCKS: u64 = 8;

fn median(mut seconds: Vec<f64>) -> f64 {
    seconds.sort_by(f64::total_cmp);
    seconds[seconds.len() / 2]
}

/// Reads every array of the checkpoint, whole or as `BLOCKS` row blocks, arrays in parallel as a
/// run reads them (`checkpoint::orbax::read_in_parallel`); returns the bytes read.
fn read_all(ckpt: &Checkpoint, blocks: bool) -> Result<u64> {
    let names: Vec<&str> = ckpt.names().collect();
    let bytes = read_in_parallel(&names, |name| {
        let array = ckpt.array(name)?;
        if !blocks || array.shape.is_empty() || array.shape[0] < BLOCKS {
            return Ok(ckpt.read(name)?.data.len() as u64);
        }
        let rows = array.shape[0] / BLOCKS;
        let blocks: Vec<(Vec<u64>, Vec<u64>)> = (0..BLOCKS)
            .map(|b| {
                let start = std::iter::once(b * rows).chain(array.shape[1..].iter().map(|_| 0)).collect();
                let mut shape = array.shape.clone();
                shape[0] = if b + 1 == BLOCKS { array.shape[0] - b * rows } else { rows };
                (start, shape)
            })
            .collect();
        Ok(ckpt.read_blocks(name, &blocks)?.iter().map(|t| t.data.len() as u64).sum::<u64>())
    })?;
    Ok(bytes.iter().sum())
}

fn main() -> Result<()> {
    let dir: PathBuf = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .context("usage: cargo bench --bench orbax_read -- <checkpoint folder written by tools/orbax_read_bench.py>")?
        .into();
    let location = Location::Local(dir.clone());
    let orbax: Option<serde_json::Value> = std::fs::read_to_string(dir.with_file_name("orbax_restore.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    println!("| reader | GiB | median s | GiB/s |");
    println!("|---|---|---|---|");
    for (what, blocks) in [("maxrs, whole arrays", false), ("maxrs, 8 row blocks of each array", true)] {
        let mut seconds = Vec::new();
        let mut bytes = 0;
        for _ in 0..REPEATS {
            let started = Instant::now();
            let ckpt = Checkpoint::open(&location)?;
            bytes = read_all(&ckpt, blocks)?;
            seconds.push(started.elapsed().as_secs_f64());
        }
        let (gib, s) = (bytes as f64 / (1u64 << 30) as f64, median(seconds));
        println!("| {what} | {gib:.2} | {s:.2} | {:.2} |", gib / s);
    }
    if let Some(o) = orbax {
        let gib = o["array_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64;
        let s = o["orbax_restore_median_seconds"].as_f64().unwrap_or(f64::NAN);
        println!("| Orbax restore (numpy), tools/orbax_read_bench.py | {gib:.2} | {s:.2} | {:.2} |", gib / s);
    }
    Ok(())
}
