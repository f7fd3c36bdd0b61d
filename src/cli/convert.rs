//! `maxrs convert`: Hugging Face checkpoints to and from maxrs's parameter layout
//! (see `model::hf` for the mapping, `checkpoint::hf` for the files), and a maxrs train state
//! to MaxText's Orbax checkpoint (`checkpoint::orbax::write`). DST is a new directory in every
//! direction, checked by `output::check` before SRC is read.

use anyhow::{bail, Result};
use clap::Subcommand;
use maxrs::checkpoint::hf;
use maxrs::files::Kind;
use maxrs::files::Location;
use maxrs::output::{self, Input, Output};
use maxrs::submit::shell_join;

#[derive(clap::Args)]
pub struct ConvertArgs {
    #[command(subcommand)]
    direction: Direction,
}

#[derive(Subcommand)]
enum Direction {
    /// A Hugging Face checkpoint directory (config.json + model*.safetensors) -> a maxrs
    /// parameters-only checkpoint directory, for `maxrs train load_parameters_path=DST`.
    FromHf {
        /// Hugging Face checkpoint directory (local or gs://).
        src: String,
        /// New maxrs checkpoint directory (local or gs://); must not exist.
        dst: String,
        /// Weight dtype of the result: float32, bfloat16 or float16 (default: the source's).
        #[arg(long)]
        dtype: Option<String>,
        /// maxrs keys for the layout, e.g. scan_layers=false; hf_lora_adapter_path=DIR adds a
        /// PEFT LoRA adapter's adapters (unmerged, with the lora.* keys that give them).
        #[arg(value_name = "key=value")]
        overrides: Vec<String>,
    },
    /// maxrs parameters (a checkpoint directory, or a params safetensors file with the model's
    /// CONFIG/key=value) -> a Hugging Face checkpoint directory.
    ToHf {
        /// maxrs checkpoint directory or parameters file (local or gs://).
        src: String,
        /// New Hugging Face checkpoint directory (local or gs://); must not exist.
        dst: String,
        /// Weight dtype of the result: float32, bfloat16 or float16 (default: the source's).
        #[arg(long)]
        dtype: Option<String>,
        /// Largest weight file: bytes, or with a unit (KB, MB, GB as powers of 1000; KiB, MiB, GiB).
        #[arg(long, default_value = "5GB")]
        max_shard_size: String,
        /// A LoRA run's parameters: the model with the adapters merged into its weights
        /// (without it: a PEFT adapter directory).
        #[arg(long)]
        merge_lora: bool,
        /// The model: a config file and/or key=value (needed for a bare parameters file).
        #[arg(value_name = "CONFIG | key=value")]
        args: Vec<String>,
    },
    /// A maxrs train state (a checkpoint step directory, or a run's directory: its newest step)
    /// -> a MaxText checkpoint directory (Orbax, OCDBT + zarr v3: DST/<step>/items), which
    /// MaxText resumes from with load_full_state_path=DST/<step>/items, or as a run's
    /// checkpoints/ folder.
    ToMaxtext {
        /// maxrs checkpoint step directory, run directory or checkpoints directory (local or gs://).
        src: String,
        /// New MaxText checkpoints directory (local or gs://); must not exist.
        dst: String,
        /// The parameters alone, as MaxText's generate_param_only_checkpoint writes them
        /// (DST/0/items, for MaxText's load_parameters_path); SRC may be a parameters-only
        /// checkpoint.
        #[arg(long)]
        params_only: bool,
    },
}

/// `5GB`, `100KiB`, `123` as bytes (`transformers`' `max_shard_size` spelling): at least one
/// byte, or every tensor would get a shard of its own.
fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: Option<u64> = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => Some(1),
        "KB" => Some(1_000),
        "MB" => Some(1_000_000),
        "GB" => Some(1_000_000_000),
        "KIB" => Some(1 << 10),
        "MIB" => Some(1 << 20),
        "GIB" => Some(1 << 30),
        _ => None,
    };
    match (number.parse::<f64>(), scale) {
        (Ok(n), Some(scale)) if n * scale as f64 >= 1.0 => Ok((n * scale as f64) as u64),
        _ => bail!(
            "--max-shard-size {text:?}: give a size of at least 1 byte, as bytes or with a unit: 5GB, 500MB, 100KiB \
             (KB, MB, GB are powers of 1000; KiB, MiB, GiB of 1024)"
        ),
    }
}

/// SRC and DST as locations, checked before SRC is read: both directions write DST whole, as
/// a new directory, never over SRC or inside it.
fn locations(src: &str, dst: &str) -> Result<(Location, Location)> {
    let (src, dst) = (Location::parse(src)?, Location::parse(dst)?);
    output::check(
        &[Input { name: "SRC", location: src.clone(), directory: true }],
        &[Output { name: "DST", location: dst.clone(), kind: Kind::NewDir }],
    )?;
    Ok((src, dst))
}

pub fn run(args: ConvertArgs) -> Result<()> {
    match args.direction {
        Direction::FromHf { src, dst, dtype, overrides } => {
            let (src, dst) = locations(&src, &dst)?;
            let done = hf::from_hf(&src, &dst, dtype.as_deref(), &overrides)?;
            println!("wrote {} tensors ({:.1} MiB) to {dst}", done.tensors, done.bytes as f64 / (1 << 20) as f64);
            // A model name the keys load over (DeepSeek-V3's routing, Gemma 3's query scale) reads
            // best first; each word is quoted for a shell where it needs it
            // (`mlp_activations=[silu, linear]`).
            let (named, keys): (Vec<String>, Vec<String>) = done
                .model_args
                .into_iter()
                .partition(|a| a.starts_with("model_name=") || a.starts_with("override_model_config="));
            let words = [vec!["maxrs".into(), "train".into(), format!("load_parameters_path={dst}")], named, keys];
            println!(
                "train from it with the model's keys:\n  {}",
                shell_join(words.iter().flatten().map(String::as_str))
            );
        }
        Direction::ToHf { src, dst, dtype, max_shard_size, merge_lora, args } => {
            let limit = parse_size(&max_shard_size)?;
            let (src, dst) = locations(&src, &dst)?;
            let done = hf::to_hf(&src, &dst, dtype.as_deref(), limit, merge_lora, &args)?;
            println!(
                "wrote {} tensors ({:.1} MiB) to {dst}: {}",
                done.tensors,
                done.bytes as f64 / (1 << 20) as f64,
                done.files.join(", ")
            );
        }
        Direction::ToMaxtext { src, dst, params_only } => {
            let (src, dst) = locations(&src, &dst)?;
            let done = maxrs::checkpoint::orbax::to_maxtext(&src, &dst, params_only)?;
            let (mib, items) = (done.bytes as f64 / (1 << 20) as f64, done.step_dir.join("items"));
            print!("wrote {} arrays ({mib:.1} MiB) to {}", done.arrays, done.step_dir);
            match done.next_step {
                Some(next) => {
                    println!(": MaxText's step {next} comes next");
                    println!("resume MaxText from it with load_full_state_path={items}");
                }
                None => println!("\nload it in MaxText with load_parameters_path={items}"),
            }
        }
    }
    Ok(())
}
