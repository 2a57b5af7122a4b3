//! Subcommands of the `nanoddp` binary, one module each, the argument types and the table
//! they share, and the error they all return ([`CliError`]).

pub mod args;
pub mod bench_allreduce;
pub mod bench_kernels;
pub mod bench_profile;
pub mod info;
pub mod interrupt;
pub mod metrics;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod nccl_table;
pub mod outputs;
pub mod plot;
pub mod schedule;
pub mod train;

use nanoddp::backend::BackendError;
use nanoddp::comm::communicator::CommError;
use nanoddp::data::DataError;
use nanoddp::train::checkpoint::CheckpointError;
use nanoddp::train::TrainError;

/// The exit codes, as `nanoddp --help` states them.
pub const EXIT_CODES: &str = "Exit codes: 0 done (also when a reader of the output went away, \
as with `| head`); 2 bad input or settings, refused before any work (flags, data files, \
checkpoints, output paths, a device that is not there); 1 a failure while running (a device \
or collective error, a timeout, a diverging run, a write that failed); 130 or 143 a run that \
SIGINT (Ctrl-C) or SIGTERM stopped at a step, having said what its checkpoint holds.";

/// Why a subcommand stopped. Every subcommand returns it; the variant decides the exit code
/// ([`EXIT_CODES`]), in `main`: the first four are bad input or settings, refused before any
/// work (2), the others failures while running (1).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A flag, setting, path or build the command line refuses, in its own words.
    #[error("{0}")]
    Input(String),
    /// A data set that cannot be used.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A checkpoint that cannot be read, or a place one cannot be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A device that is not there or cannot be opened.
    #[error(transparent)]
    Device(BackendError),
    /// Writing the output failed (a reader that went away ends it quietly: exit code 0).
    #[error(transparent)]
    Write(#[from] std::io::Error),
    /// A device operation failed while working.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Training or evaluation failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// Another failure while running, in the command line's words.
    #[error("{0}")]
    Running(String),
    /// SIGINT or SIGTERM stopped the run ([`interrupt`]): exit code 128 + the signal's number,
    /// as a shell reports a process the signal ended.
    #[error("{message}")]
    Interrupted {
        /// The signal.
        signal: i32,
        /// What stopped, what was kept, and how to go on.
        message: String,
    },
}
