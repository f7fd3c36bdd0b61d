//! The `maxrs` command line: MaxText's conventions (`maxrs train configs/base.yml key=value ...`)
//! on top of the library. Each subcommand lives in `cli/<name>.rs`.

mod cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "maxrs", version, about = "MaxText's job in Rust: train LLMs through XLA PJRT plugins")]
struct Args {
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
    /// List the ahead-of-time targets (compile_topology names) and their devices.
    Topologies(cli::topologies::TopologiesArgs),
    /// Run N local processes of one job: `maxrs launch --num-processes N -- train ...`.
    Launch(cli::launch::LaunchArgs),
    /// Serve a job's coordination service on its own (instead of process 0).
    Coordinator(cli::coordinator::CoordinatorArgs),
    /// Check a cluster: registration, key-value store, barriers, devices, collective bandwidth.
    ClusterCheck(cli::cluster_check::ClusterCheckArgs),
    /// Run a train command on a cluster: a Vertex AI custom job, a Slurm batch script or a GKE JobSet.
    Submit(Box<cli::submit::SubmitArgs>),
}

fn main() -> std::process::ExitCode {
    // XLA's own INFO lines (one per client, per compile) drown maxrs's output; users who want
    // them set TF_CPP_MIN_LOG_LEVEL=0. Set before any plugin is loaded, while single-threaded.
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    }
    cli::init_logging();
    let args = Args::parse();
    let result = match args.command {
        Command::Devices(a) => cli::devices::run(a),
        Command::Train(a) => cli::train::run(a),
        Command::Decode(a) => cli::decode::run(a),
        Command::TrainCompile(a) => cli::train_compile::run(a),
        Command::Topologies(a) => cli::topologies::run(a),
        Command::Launch(a) => match cli::launch::run(a) {
            Ok(code) => return std::process::ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Coordinator(a) => cli::coordinator::run(a),
        Command::ClusterCheck(a) => cli::cluster_check::run(a),
        Command::Submit(a) => cli::submit::run(*a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
