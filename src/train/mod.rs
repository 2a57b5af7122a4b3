//! Data-parallel training (the DDP layer): one thread and one model replica per device.
//! Every step each device runs forward and backward on its shard of the global batch, the
//! gradients are summed across devices by the hand-rolled allreduce (through
//! [`crate::comm::collective::Collective`]), and every replica applies the same SGD update,
//! so the replicas stay bitwise identical.
//!
//! * [`training_loop`]: the loop ([`train`], [`train_ranks`], [`test_accuracy`]).
//! * [`buckets`]: which gradients are reduced together ([`gradient_buckets`]).
//! * [`loss_scaler`]: dynamic loss scaling for half precision ([`LossScaler`]).
//! * [`recipe`]: how weights start and the optimizer behaves, with each recipe's default
//!   hyper-parameters ([`Recipe`]).
//! * [`config`]: the run's settings ([`TrainConfig`]).
//! * [`init`]: seeded initial weights ([`initial_weights`], [`from_weights`]).
//! * [`lr_schedule`]: the learning rate of each step ([`learning_rate`]).
//! * [`report`]: what a run reports ([`StepReport`], [`EpochReport`], [`Event`]).
//! * [`error`]: what can stop training ([`TrainError`]).
//! * [`checkpoint`]: saving and loading a run's state.
//! * `rank_cores`: which cores each local rank's threads are pinned to.
//! * `resident`: what a rank keeps on its device for the run (the data set, the step's
//!   scalars, the ring of step records the host reads late).
//! * `step_graph`: a step captured as CUDA graphs (the compute between its collectives).
//!
//! Across MPI processes the ranks are `comm::hierarchical::Hierarchical` (feature
//! `mpi`), handed to [`train_ranks`].

pub mod buckets;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod init;
pub mod loss_scaler;
pub mod lr_schedule;
mod rank_cores;
pub mod recipe;
pub mod report;
mod resident;
mod step_graph;
pub mod training_loop;

pub use buckets::gradient_buckets;
pub use config::TrainConfig;
pub use error::TrainError;
pub use init::{from_weights, initial_weights};
pub use loss_scaler::LossScaler;
pub use lr_schedule::learning_rate;
pub use recipe::Recipe;
pub use report::{EpochReport, Event, StepReport};
pub use training_loop::{check_data, diverged_loss, test_accuracy, train, train_ranks};

pub use crate::comm::collective::Collective;

/// The hierarchical MPI ranks under their former path (feature `mpi`); they live in
/// [`crate::comm::hierarchical`].
#[cfg(feature = "mpi")]
pub mod mpi {
    pub use crate::comm::hierarchical::Hierarchical;
}
