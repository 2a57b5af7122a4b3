//! The argument types several subcommands share: the allreduce algorithm (`--algo`), where
//! ranks or replicas run (`--backend`), how ranks reach each other (`--comm`), and message
//! sizes (`-b 4K`).

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;
use nanoddp::comm::schedule::Algorithm;
use nanoddp::comm::transport::MAX_RANKS;

/// Algorithm choice on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AlgoArg {
    /// Pick per size from the cost model.
    Auto,
    /// Ring reduce-scatter + all-gather.
    Ring,
    /// Pipelined double binary tree.
    Tree,
    /// Two-shot: reduce own chunk from all peers, then gather.
    Direct,
    /// Every rank sums all inputs.
    Oneshot,
    /// The MPI library's own MPI_Allreduce across processes (with --comm mpi; the baseline).
    Mpi,
}

impl AlgoArg {
    /// The algorithm, or `None` for auto.
    pub fn algorithm(self) -> Option<Algorithm> {
        match self {
            AlgoArg::Auto => None,
            AlgoArg::Ring => Some(Algorithm::Ring),
            AlgoArg::Tree => Some(Algorithm::Tree),
            AlgoArg::Direct => Some(Algorithm::Direct),
            AlgoArg::Oneshot => Some(Algorithm::OneShot),
            AlgoArg::Mpi => None,
        }
    }

    /// Refuses `--algo mpi` where the ranks are not MPI processes (`--comm local`).
    pub fn check_local(self) -> Result<(), String> {
        if self == AlgoArg::Mpi {
            return Err("--algo mpi is MPI's own allreduce across processes: use it with --comm mpi under mpirun".into());
        }
        Ok(())
    }
}

/// How ranks reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CommArg {
    /// Threads of this process, over shared memory (the in-process transports).
    Local,
    /// Processes started by mpirun (build with `--features mpi`): each process's devices
    /// reduce locally, then one leader per process crosses MPI.
    Mpi,
}

/// Refuses a count of ranks or devices that no communicator holds (1 to [`MAX_RANKS`]),
/// naming `flag` and the value given.
pub fn check_ranks(flag: &str, n: usize) -> Result<(), String> {
    if n == 0 || n > MAX_RANKS {
        return Err(format!(
            "{flag} {n} is out of range: it must be between 1 and {MAX_RANKS}"
        ));
    }
    Ok(())
}

/// What `--comm mpi` says in a build without MPI.
#[cfg_attr(feature = "mpi", allow(dead_code))]
pub const NO_MPI: &str = "this nanoddp was built without MPI: rebuild with `cargo build --release --features mpi` (Debian: apt-get install openmpi-bin libopenmpi-dev libclang-dev)";

/// Where ranks or replicas run (`--backend`). Each subcommand describes the values in its
/// own terms ([`backend_values`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The native CPU backend.
    Cpu,
    /// The CUDA kernels under the SIMT emulator, on the CPU (slow).
    Simt,
    /// GPUs through the CUDA driver (or its CPU stand-in, where timings mean nothing).
    Cuda,
}

/// `--backend`'s parser, with `help` describing cpu, simt and cuda, in that order, as the
/// subcommand uses them. Use with `default_value = "cpu"`.
pub fn backend_values(help: [&'static str; 3]) -> impl TypedValueParser<Value = BackendArg> {
    PossibleValuesParser::new(
        BackendArg::value_variants()
            .iter()
            .zip(help)
            .filter_map(|(b, help)| b.to_possible_value().map(|v| v.help(help))),
    )
    .try_map(|name| BackendArg::from_str(&name, false))
}

/// Parses `4096`, `4K`, `64M`, `1G` (binary multiples, as nccl-tests).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let base: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size (examples: 4096, 64K, 16M, 1G)"))?;
    let mult = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" => 1 << 10,
        "M" | "MB" => 1 << 20,
        "G" | "GB" => 1 << 30,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (use K, M or G)")),
    };
    base.checked_mul(mult)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// `n` of a thing, in the singular or the plural as `n` wants: `1 test image`, `2 test images`.
pub fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
