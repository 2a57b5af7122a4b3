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
    /// Measure speed. `nanoddp bench kernels` times the operations LeNet trains with, at its
    /// shapes (batch 256 by default), and a 1024³ GEMM, and prints GFLOP/s next to this
    /// CPU's measured peak.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
}

#[derive(Subcommand)]
enum BenchWhat {
    /// GEMM and convolution throughput per backend.
    Kernels {
        /// Where to run: cpu (native), simt (the kernels emulated on the CPU), cuda (GPU 0).
        #[arg(long, value_enum, default_value_t = cli::bench::Target::Cpu)]
        backend: cli::bench::Target,
        /// Images per batch for the LeNet shapes.
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Timed repetitions per operation (the median is reported).
        #[arg(long, default_value_t = 20)]
        repeats: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Info => cli::info::run(&mut std::io::stdout().lock()).map_err(Into::into),
        Command::Bench {
            what:
                BenchWhat::Kernels {
                    backend,
                    batch,
                    repeats,
                },
        } => cli::bench::run(&mut std::io::stdout().lock(), backend, batch, repeats),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
