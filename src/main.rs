//! The `maxrs` command line: MaxText's conventions (`maxrs train configs/base.yml key=value ...`)
//! on top of the library. Each subcommand lives in `cli/<name>.rs`.

mod cli;

use clap::{Parser, Subcommand};
use maxrs::pjrt::xla_flags;

#[derive(Parser)]
#[command(name = "maxrs", version, about = "MaxText's job in Rust: train LLMs through XLA PJRT plugins")]
struct Args {
    /// More output: the resolved config with each key's source, debug logs, XLA's warnings
    /// (-vv: XLA's info logs too).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the PJRT plugin, its platform and the devices it sees.
    Devices(cli::devices::DevicesArgs),
    /// Train a model: `maxrs train [CONFIG] [key=value ...]` (MaxText's train.py conventions).
    Train(cli::train::TrainArgs),
    /// Generate from prompts with a key/value cache: `maxrs decode [CONFIG] [key=value ...]` (MaxText's decode.py).
    Decode(cli::decode::DecodeArgs),
    /// Compile the train step for a target without its hardware (MaxText's train_compile.py).
    TrainCompile(cli::train_compile::TrainCompileArgs),
    /// Plugin builds for machines without network: `maxrs plugins fetch cuda13 --dest DIR`.
    Plugins(cli::plugins::PluginsArgs),
    /// List the ahead-of-time targets (compile_topology names) and their devices.
    Topologies(cli::topologies::TopologiesArgs),
    /// Run N local processes of one job: `maxrs launch --num-processes N -- train ...`.
    Launch(cli::launch::LaunchArgs),
    /// Serve a job's coordination service on its own (instead of process 0).
    Coordinator(cli::coordinator::CoordinatorArgs),
    /// Check a cluster: registration, key-value store, barriers, devices, collective bandwidth.
    ClusterCheck(cli::cluster_check::ClusterCheckArgs),
    /// Check a job's checkpoints with a synthetic sharded state: save, kill, restore on any process count.
    CheckpointCheck(cli::checkpoint_check::CheckpointCheckArgs),
    /// Convert Hugging Face checkpoints (Llama, Mistral, Gemma, Qwen, DeepSeek families) to and from maxrs's layout, and maxrs's to MaxText's.
    Convert(cli::convert::ConvertArgs),
    /// Convert text, JSON Lines or Parquet files to a `dataset_type=tokens` file.
    Tokenize(cli::tokenize::TokenizeArgs),
    /// Run a train command on a cluster: a Vertex AI custom job, a Slurm batch script or a GKE JobSet.
    Submit(Box<cli::submit::SubmitArgs>),
}

fn main() -> std::process::ExitCode {
    // The XLA flag probe: this binary re-run to try XLA_FLAGS' values in a process of its own.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.len() == 3 && argv[1] == xla_flags::probe::PROBE_ARG {
        return xla_flags::probe::probe_main(std::path::Path::new(&argv[2]));
    }
    if let Ok(exe) = std::env::current_exe() {
        xla_flags::probe::enable(exe);
    }
    let args = Args::parse();
    // `maxrs devices | head` must end quietly like any Unix tool when the reader goes away, not
    // panic in `println!`: the listing commands take back the default SIGPIPE action that Rust's
    // runtime replaced. The others keep it ignored: a peer closing a socket (the coordination
    // service, GCS) must be an error they report, not a silent death by signal.
    if matches!(args.command, Command::Devices(_) | Command::Topologies(_)) {
        // SAFETY: called before this process starts any thread; SIG_DFL is a valid action.
        #[cfg(unix)]
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    cli::init_logging(args.verbose);
    let result = match args.command {
        Command::Devices(a) => cli::devices::run(a),
        Command::Train(a) => cli::train::run(a),
        Command::Decode(a) => cli::decode::run(a),
        Command::TrainCompile(a) => cli::train_compile::run(a),
        Command::Topologies(a) => cli::topologies::run(a),
        Command::Plugins(a) => cli::plugins::run(a),
        Command::Launch(a) => match cli::launch::run(a) {
            Ok(code) => return std::process::ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Coordinator(a) => cli::coordinator::run(a),
        Command::ClusterCheck(a) => cli::cluster_check::run(a),
        Command::CheckpointCheck(a) => cli::checkpoint_check::run(a),
        Command::Convert(a) => cli::convert::run(a),
        Command::Tokenize(a) => cli::tokenize::run(a),
        Command::Submit(a) => cli::submit::run(*a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::error_report(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
