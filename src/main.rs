//! The `nanoddp` command line.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Data-parallel training from scratch: hand-written CUDA kernels, hand-rolled collectives,
/// a LeNet trainer. Runs on the CPU when there is no GPU.
#[derive(Parser)]
#[command(name = "nanoddp", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show how the kernels were built, their register and shared-memory use, the CUDA
    /// driver and GPUs found (or why none), and the CPU.
    ///
    /// Kernels are prebuilt when nvcc was found at build time (set NVCC or CUDA_HOME);
    /// otherwise they are compiled by NVRTC on first use on a GPU.
    Info,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => cli::info::run(&mut std::io::stdout().lock()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
