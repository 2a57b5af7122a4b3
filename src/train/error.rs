//! What can stop training, in the library's terms: [`TrainError`]. Each variant says what
//! happened; advice in terms of a front end (a command line's flags) is the front end's to add.

use std::path::PathBuf;

use thiserror::Error;

use super::checkpoint::CheckpointError;
use crate::backend::BackendError;
use crate::comm::communicator::CommError;

/// What can stop training.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A device failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Settings that cannot work together (a zero batch, more ranks than images a batch).
    #[error("{0}")]
    Config(String),
    /// There is no device to run on.
    #[error("no device to run on")]
    NoDevices,
    /// The data set cannot be trained or evaluated on.
    #[error("{}: {problem}", dir.display())]
    Data {
        /// The data set's folder.
        dir: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The checkpoint to resume from was written by a run with other settings
    /// ([`TrainConfig::run_settings`](super::TrainConfig::run_settings)).
    #[error("the checkpoint belongs to a run with other settings ({})", differences.join("; "))]
    ResumeMismatch {
        /// Each setting that differs, with the checkpoint's value and this run's.
        differences: Vec<String>,
    },
    /// A rank's thread panicked.
    #[error("the thread of rank {0} panicked")]
    RankPanicked(usize),
    /// A step's loss is not finite or past [`diverged_loss`](super::training_loop::diverged_loss),
    /// or the weights hold a value that is not finite: the run stopped at that step.
    #[error("training diverged at step {step} (epoch {epoch}): {problem}")]
    Diverged {
        /// The step (from 1) whose loss, or the epoch whose weights, showed it.
        step: usize,
        /// The epoch of that step (from 1).
        epoch: usize,
        /// What showed it.
        problem: String,
    },
    /// The caller's event handler (on global rank 0's process) failed, so the ranks stopped
    /// together at their next step. Where the handler runs, its own error is what
    /// [`train`](super::train) returns; other processes of an MPI run return this.
    #[error("stopped with rank 0, whose outputs failed (rank 0 reports why)")]
    Stopped,
    /// Saving or loading a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing one of the run's output files failed.
    #[error("writing {what}: {source}")]
    Io {
        /// What was being written.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The caller's event handler stopped the run for a reason of its own.
    #[error("{0}")]
    Handler(Box<dyn std::error::Error + Send + Sync>),
}
