//! `maxrs topologies`: the ahead-of-time targets maxrs can compile for (`compile_topology`),
//! one row per family of names.

use anyhow::Result;
use indicatif::HumanBytes;
use maxrs::aot::topology::catalog;

/// The long lists of sizes (v5p) wrap at this width.
const SIZES_WIDTH: usize = 64;

#[derive(clap::Args)]
pub struct TopologiesArgs {}

pub fn run(_: TopologiesArgs) -> Result<()> {
    let rows: Vec<[String; 6]> = catalog()
        .into_iter()
        .map(|f| {
            [
                f.pattern.to_string(),
                f.platform.to_string(),
                f.device_kind.to_string(),
                f.memory_bytes_per_device.map_or("host".to_string(), |n| HumanBytes(n).to_string()),
                f.devices_per_host.map_or("-".to_string(), |n| n.to_string()),
                f.sizes,
            ]
        })
        .collect();
    let header = ["name", "platform", "device", "memory", "per host", "sizes N"].map(String::from);
    let widths: Vec<usize> =
        (0..5).map(|c| rows.iter().chain([&header]).map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let indent = widths.iter().map(|w| w + 2).sum::<usize>();
    for row in [&header].into_iter().chain(&rows) {
        let cells: Vec<String> = (0..5).map(|c| format!("{:<w$}", row[c], w = widths[c])).collect();
        let sizes = wrap(&row[5], SIZES_WIDTH).join(&format!(",\n{:indent$}", ""));
        println!("{}  {sizes}", cells.join("  "));
    }
    println!(
        "\nmemory is per device; \"per host\" is devices per host, `-` where it depends on N (cpu-N: N devices \
         in one process; v5e-1 and v6e-1: 1 chip, larger ones 4).\nWith compile_topology_num_slices=S, a target \
         has S slices (TPU) or S times the hosts (GPU)."
    );
    Ok(())
}

/// Splits a comma-separated list into lines of at most `width` characters (a longer item stays whole).
fn wrap(list: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for item in list.split(", ") {
        match lines.last_mut() {
            Some(line) if line.len() + 2 + item.len() <= width => {
                line.push_str(", ");
                line.push_str(item);
            }
            _ => lines.push(item.to_string()),
        }
    }
    lines
}
