//! The `nanoddp` command line.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::CliError;

/// Data-parallel training from scratch: hand-written CUDA kernels, hand-rolled collectives,
/// a LeNet trainer. Runs on the CPU when there is no GPU.
#[derive(Parser)]
#[command(name = "nanoddp", version, about, long_about = None, after_help = cli::EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train LeNet on Fashion-MNIST, data-parallel over --devices replicas (on the CPU by
    /// default): each step every device runs its shard of the batch, the gradients are summed
    /// by nanoddp's own allreduce, and every replica applies the same update.
    ///
    /// Example: nanoddp train --devices 4 --epochs 10 --metrics run.jsonl --save lenet.safetensors
    #[command(after_help = cli::EXIT_CODES)]
    Train(cli::train::TrainArgs),
    /// Test accuracy of a checkpoint written by `train --save`.
    Eval(cli::train::EvalArgs),
    /// Show how the kernels were built, their register and shared-memory use, the CUDA
    /// driver and GPUs found (or why none), and the CPU.
    ///
    /// Kernels are prebuilt when nvcc was found at build time (set NVCC or CUDA_HOME);
    /// otherwise they are compiled by NVRTC on first use on a GPU.
    Info,
    /// Show an allreduce algorithm's steps: as text, or with --svg FILE as a picture (ranks as
    /// lanes, one column per step, chunks as colored blocks) drawn from the same schedule
    /// the transports execute.
    ///
    /// Example: nanoddp schedule --algo ring -n 4 --svg ring.svg
    Schedule(cli::schedule::ScheduleArgs),
    /// Check the MPI transport on this machine or cluster, under mpirun: every algorithm
    /// exact on every rank for counts 0, 1, 7, 99,991 and 2^20+3, results bitwise identical
    /// across ranks, and a deliberate disagreement reported on every rank. Needs a build
    /// with --features mpi.
    ///
    /// Example: mpirun -n 4 target/release/nanoddp check-mpi
    CheckMpi {
        /// Instead, check that a rank that never arrives is an error, not a hang: the last
        /// rank sleeps 3 s before its first collective and the others, with a 1 s timeout,
        /// must fail naming the wait.
        #[arg(long)]
        late_rank: bool,
    },
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
    /// Allreduce bandwidth and latency, as nccl-tests' all_reduce_perf prints them: size,
    /// count, type, redop, time, algbw, busbw = algbw·2(n-1)/n, #wrong, out of place and in
    /// place, plus the fraction of the memory-traffic bound (2·n·S / copy bandwidth).
    Allreduce(cli::bench_allreduce::Sweep),
    /// GEMM and convolution throughput per backend.
    Kernels {
        /// Where to run: cpu (native), simt (the kernels emulated on the CPU), cuda (GPU 0).
        #[arg(long, default_value = "cpu", value_parser = cli::args::backend_values([
            "The native CPU backend",
            "The kernels under the SIMT emulator (correctness tool: expect it to be slow)",
            "The kernels on GPU 0",
        ]))]
        backend: cli::args::BackendArg,
        /// Images per batch for the LeNet shapes.
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Timed repetitions per operation (the median is reported).
        #[arg(long, default_value_t = 20)]
        repeats: usize,
        /// Storage type of the convolutions' and linear layers' operands (as `train
        /// --precision`; weight gradients are f32 at every precision).
        #[arg(long, value_enum, default_value_t = nanoddp::dtype::DType::F32)]
        precision: nanoddp::dtype::DType,
    },
}

#[cfg(feature = "mpi")]
fn check_mpi(late_rank: bool) -> Result<(), CliError> {
    if late_rank {
        cli::mpi::check_late_rank()
    } else {
        cli::mpi::check(&mut std::io::stdout().lock())
    }
}

#[cfg(not(feature = "mpi"))]
fn check_mpi(_: bool) -> Result<(), CliError> {
    Err(CliError::Input(cli::args::NO_MPI.into()))
}

/// glibc gives every thread that allocates its own malloc arena (up to 8 per core) and keeps
/// freed memory in each, so a process with a thread per rank grows its resident size over a
/// run. One arena per core keeps it flat at no measurable cost.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    use std::ffi::c_int;
    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    const M_ARENA_MAX: c_int = -8;
    const M_MMAP_THRESHOLD: c_int = -3;
    const M_TRIM_THRESHOLD: c_int = -1;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: mallopt is glibc's documented tuning call, M_ARENA_MAX accepts any positive
    // count, M_MMAP_THRESHOLD any size up to 32 MiB, M_TRIM_THRESHOLD any size, and no
    // other thread exists yet.
    unsafe {
        mallopt(M_ARENA_MAX, c_int::try_from(cores).unwrap_or(c_int::MAX));
        // Activations of 2 MiB and more get their own mappings: zeroed by the kernel and
        // resident only once touched (the fused CPU operations never touch the workspaces
        // the GPU path needs), and returned to the system when freed. glibc's default
        // raises this threshold as big blocks are freed, after which such buffers come from
        // the heap and are zeroed, so resident, at once. The per-call scratch blocks of the
        // convolutions (1.3 MB) stay below it and are reused from the heap.
        mallopt(M_MMAP_THRESHOLD, 2 << 20);
        // Fixing the mmap threshold also fixes the trim threshold at 128 KiB, which would
        // hand the heap's top back to the system after every call and fault the
        // convolutions' scratch blocks in again (37% slower training): keep up to 64 MiB.
        mallopt(M_TRIM_THRESHOLD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    // A misspelt NANODDP_CPU_ISA would otherwise measure the wrong path: refuse it up front,
    // except in `info`, which says what is wrong with it and which levels this CPU allows.
    if let (Err(why), false) = (
        nanoddp::backend::cpu::isa::requested(),
        matches!(cli.command, Command::Info),
    ) {
        return failed(&CliError::Input(why.to_string()));
    }
    let result = match cli.command {
        Command::Info => cli::info::run(&mut stdout),
        Command::CheckMpi { late_rank } => check_mpi(late_rank),
        Command::Schedule(args) => cli::schedule::run(&mut stdout, args),
        Command::Eval(args) => cli::train::eval(&mut stdout, args),
        Command::Train(args) => cli::train::run(&mut stdout, args),
        Command::Bench {
            what:
                BenchWhat::Kernels {
                    backend,
                    batch,
                    repeats,
                    precision,
                },
        } => cli::bench_kernels::run(&mut stdout, backend, batch, repeats, precision),
        Command::Bench {
            what: BenchWhat::Allreduce(sweep),
        } => cli::bench_allreduce::run(&mut stdout, sweep),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): the output ends there, and that is not an error.
        Err(CliError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => failed(&e),
    }
}

/// Reports `e` and returns its exit code ([`cli::EXIT_CODES`]).
fn failed(e: &CliError) -> ExitCode {
    report_error(e);
    ExitCode::from(match e {
        CliError::Input(_) | CliError::Data(_) | CliError::Checkpoint(_) | CliError::Device(_) => 2,
        CliError::Write(_)
        | CliError::Backend(_)
        | CliError::Comm(_)
        | CliError::Train(_)
        | CliError::Running(_) => 1,
        CliError::Interrupted { signal, .. } => u8::try_from(128 + signal).unwrap_or(1),
    })
}

/// Prints `error: {e}` to stderr in one write: under mpirun every rank may fail at once,
/// and `eprintln!` writes the pieces of a formatted line separately, so the ranks' messages
/// interleaved mid-line. One write of a short line to a pipe is atomic.
fn report_error(e: &dyn std::fmt::Display) {
    use std::io::Write;
    let line = format!("error: {e}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
