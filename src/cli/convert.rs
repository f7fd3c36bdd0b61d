//! `maxrs convert`: Hugging Face Llama-family checkpoints to and from maxrs's parameter layout
//! (see `model::llama_hf` for the mapping, `checkpoint::hf` for the files).

use anyhow::{anyhow, Result};
use clap::Subcommand;
use maxrs::checkpoint::hf;
use maxrs::storage::Location;

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
        /// maxrs keys for the layout, e.g. scan_layers=false.
        #[arg(value_name = "key=value")]
        overrides: Vec<String>,
    },
    /// maxrs parameters (a checkpoint directory, or a params safetensors file with the model's
    /// CONFIG/key=value) -> a Hugging Face checkpoint directory.
    ToHf {
        /// maxrs checkpoint directory or parameters file (local or gs://).
        src: String,
        /// Hugging Face checkpoint directory to write (local or gs://).
        dst: String,
        /// Weight dtype of the result: float32, bfloat16 or float16 (default: the source's).
        #[arg(long)]
        dtype: Option<String>,
        /// Largest weight file: bytes, or with a unit (KB, MB, GB as powers of 1000; KiB, MiB, GiB).
        #[arg(long, default_value = "5GB")]
        max_shard_size: String,
        /// The model: a config file and/or key=value (needed for a bare parameters file).
        #[arg(value_name = "CONFIG | key=value")]
        args: Vec<String>,
    },
}

/// `5GB`, `100KiB`, `123` as bytes (`transformers`' `max_shard_size` spelling).
fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        _ => return Err(anyhow!("--max-shard-size {text}: unknown unit `{unit}` (B, KB, MB, GB, KiB, MiB, GiB)")),
    };
    let n: f64 = number.parse().map_err(|_| anyhow!("--max-shard-size {text}: expected a size such as 5GB"))?;
    Ok((n * scale as f64) as u64)
}

pub fn run(args: ConvertArgs) -> Result<()> {
    match args.direction {
        Direction::FromHf { src, dst, dtype, overrides } => {
            let done = hf::from_hf(&Location::parse(&src)?, &Location::parse(&dst)?, dtype.as_deref(), &overrides)?;
            println!("wrote {} tensors ({:.1} MiB) to {dst}", done.tensors, done.bytes as f64 / (1 << 20) as f64);
            println!(
                "train from it with the model's keys:\n  maxrs train load_parameters_path={dst} {}",
                done.model_args.join(" ")
            );
        }
        Direction::ToHf { src, dst, dtype, max_shard_size, args } => {
            let limit = parse_size(&max_shard_size)?;
            let done = hf::to_hf(&Location::parse(&src)?, &Location::parse(&dst)?, dtype.as_deref(), limit, &args)?;
            println!(
                "wrote {} tensors ({:.1} MiB) to {dst}: {}",
                done.tensors,
                done.bytes as f64 / (1 << 20) as f64,
                done.files.join(", ")
            );
        }
    }
    Ok(())
}
