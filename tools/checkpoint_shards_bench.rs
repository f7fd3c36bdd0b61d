//! `tools/checkpoint_shards_bench`: a llama2-7b-shaped training state (MaxText's parameters,
//! float32, with Adam's `mu` and `nu` and the step count) saved and restored as files on local
//! disk by 16 processes at once, each writing the 1/16 of every array it owns (split along the
//! array's first dimension divisible by 16), against one process writing and reading everything.
//! The processes are threads of this program with the checkpoint code of a real job
//! (`checkpoint::dir::write_part`, `manifest_of`, `load_blocks`); the commit's key-value
//! exchange is left out (milliseconds).
//!
//! Usage: `cargo run --release --example checkpoint_shards_bench -- [--layers N] [--dir DIR]`
//! (`--layers 32`, the default, is llama2-7b: about 81 GiB per variant; fewer layers keep the
//! shapes and scale the bytes). Restores read what was just written, so they read from the page
//! cache unless the machine has less memory than the state. Prints one table.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Result};
use maxrs::checkpoint::dir::{load_blocks, manifest_of, write_manifest, write_part, Expected, Share};
use maxrs::checkpoint::shards::{Bounds, HostArray};
use maxrs::config;
use maxrs::files::Location;
use maxrs::host::{whole, DType, HostTensor};
use maxrs::model::Model;

const WAYS: usize = 16;

/// The state's arrays: every parameter, its `mu` and `nu`, and the count.
fn state(layers: usize) -> Result<Vec<Expected>> {
    let c = config::load(
        None,
        &[
            "model_name=llama2-7b".to_string(),
            "override_model_config=true".to_string(),
            format!("base_num_decoder_layers={layers}"),
        ],
    )?;
    let model = Model::from_config(&c)?;
    let mut out = Vec::new();
    for group in ["params", "opt_state.mu", "opt_state.nu"] {
        for p in model.param_defs() {
            out.push(Expected { name: format!("{group}.{}", p.name), ty: DType::F32, dims: p.shape.clone() });
        }
    }
    out.push(Expected { name: "opt_state.count".into(), ty: DType::S32, dims: vec![] });
    Ok(out)
}

/// Process `p` of `ways`' block of an array: 1/ways along its first dimension divisible by
/// `ways`; the whole array on process 0 when none is.
fn block(dims: &[i64], p: usize, ways: usize) -> Option<Bounds> {
    let mut bounds = whole(dims);
    match dims.iter().position(|&d| d % ways as i64 == 0) {
        Some(axis) => {
            let n = dims[axis] / ways as i64;
            bounds[axis] = (p as i64 * n, n);
            Some(bounds)
        }
        None => (p == 0).then_some(bounds),
    }
}

fn share(expected: &[Expected], p: usize, ways: usize) -> Share {
    let arrays = expected
        .iter()
        .map(|e| {
            let blocks = block(&e.dims, p, ways)
                .map(|b| {
                    let shape: Vec<i64> = b.iter().map(|r| r.1).collect();
                    let bytes = shape.iter().product::<i64>() as usize * e.ty.byte_size();
                    (b, HostTensor::new(e.ty, &shape, vec![1u8; bytes]))
                })
                .into_iter()
                .collect();
            HostArray { name: e.name.clone(), ty: e.ty, dims: e.dims.clone(), blocks }
        })
        .collect();
    Share { step: Some(0), arrays, model: BTreeMap::new(), data: None }
}

struct Row {
    writers: usize,
    save_s: f64,
    save_bytes_max: u64,
    restore_s: f64,
    restore_bytes_max: u64,
}

fn measure(expected: &[Expected], root: &std::path::Path, ways: usize) -> Result<Row> {
    let dir = Location::Local(root.join(format!("{ways}-way")));
    std::fs::create_dir_all(root.join(format!("{ways}-way")))?;
    let shares: Vec<Share> = (0..ways).map(|p| share(expected, p, ways)).collect();
    let t = Instant::now();
    let parts = std::thread::scope(|s| {
        let handles: Vec<_> = shares
            .iter()
            .enumerate()
            .map(|(p, sh)| {
                s.spawn({
                    let dir = &dir;
                    move || write_part(dir, sh, p, ways)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a writer thread")).collect::<Result<Vec<_>>>()
    })?;
    write_manifest(&dir, &manifest_of(&shares[0], ways, parts)?)?;
    let save_s = t.elapsed().as_secs_f64();
    let save_bytes_max = shares.iter().map(Share::bytes).max().unwrap_or(0);
    drop(shares);
    let t = Instant::now();
    let read = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ways)
            .map(|p| {
                let dir = &dir;
                s.spawn(move || {
                    let wanted: BTreeMap<String, Vec<Bounds>> = expected
                        .iter()
                        .map(|e| (e.name.clone(), block(&e.dims, p, ways).into_iter().collect()))
                        .collect();
                    load_blocks(dir, expected, &BTreeMap::new(), false, &wanted).map(|l| l.bytes_read)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a reader thread")).collect::<Result<Vec<_>>>()
    })?;
    let restore_s = t.elapsed().as_secs_f64();
    std::fs::remove_dir_all(root.join(format!("{ways}-way")))?;
    Ok(Row { writers: ways, save_s, save_bytes_max, restore_s, restore_bytes_max: read.into_iter().max().unwrap_or(0) })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut layers = 32;
    let mut root = std::env::temp_dir();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next()) {
            ("--layers", Some(n)) => layers = n.parse()?,
            ("--dir", Some(d)) => root = d.into(),
            _ => bail!("usage: checkpoint_shards_bench [--layers N] [--dir DIR]"),
        }
    }
    let expected = state(layers)?;
    let total: u64 = expected.iter().map(|e| e.dims.iter().product::<i64>() as u64 * 4).sum();
    let root = tempfile::tempdir_in(root)?;
    println!(
        "llama2-7b-shaped state, {layers} layers: {} arrays, {:.2} GiB (params, mu, nu in float32)",
        expected.len(),
        total as f64 / (1u64 << 30) as f64
    );
    println!(
        "| writers | save s | save GiB/s | largest write per process GiB | restore s | largest read per process GiB |"
    );
    println!("|---|---|---|---|---|---|");
    for ways in [1, WAYS] {
        let r = measure(&expected, root.path(), ways)?;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "| {} | {:.2} | {:.2} | {:.3} | {:.2} | {:.3} |",
            r.writers,
            r.save_s,
            gib(total) / r.save_s,
            gib(r.save_bytes_max),
            r.restore_s,
            gib(r.restore_bytes_max)
        );
    }
    Ok(())
}
