//! What can stop training, in the library's terms: [`TrainError`].

use thiserror::Error;

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
    /// Settings that cannot work.
    #[error("{0}")]
    Config(String),
    /// A device thread panicked.
    #[error("device thread {0} panicked")]
    Panicked(usize),
}
