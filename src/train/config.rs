//! Training settings: [`TrainConfig`], and what a checkpoint
//! records of them so that a resumed run continues the same run.

use super::checkpoint;
use super::{Recipe, TrainError};
use crate::comm::communicator::CommConfig;
use crate::comm::schedule::Algorithm;
use crate::dtype::DType;

/// Training settings.
#[derive(Debug, Clone, Copy)]
pub struct TrainConfig {
    /// Recipe.
    pub recipe: Recipe,
    /// Passes over the training set.
    pub epochs: usize,
    /// Global batch (split over the devices).
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f32,
    /// Momentum (0 for plain SGD).
    pub momentum: f32,
    /// L2 weight decay.
    pub weight_decay: f32,
    /// Seed of the initial weights and the data order.
    pub seed: u64,
    /// Reshuffle every epoch (else file order).
    pub shuffle: bool,
    /// Stop after this many steps in total.
    pub max_steps: Option<usize>,
    /// Allreduce algorithm (`None`: by size).
    pub algorithm: Option<Algorithm>,
    /// Stop after this epoch without changing the learning-rate schedule (the schedule
    /// always spans `epochs`), as an interrupted run would.
    pub stop_after: Option<usize>,
    /// How activations are stored.
    pub precision: DType,
    /// Gradient bucket capacity in bytes (see [`gradient_buckets`](super::gradient_buckets)); 0 puts every gradient
    /// in one bucket, reduced after the backward pass.
    pub bucket_bytes: usize,
    /// How the ranks' communicator behaves (its timeout above all).
    pub comm: CommConfig,
    /// Capture each batch shape's step once as a graph and replay it, where the backend
    /// records work ([`Memory::can_capture`](crate::backend::Memory::can_capture): CUDA) and
    /// a rank's step waits for nothing on the host (one rank for now). The same kernels run
    /// either way, so the results are the same bits.
    pub cuda_graph: bool,
}

impl TrainConfig {
    /// The settings that define a run, as (name, value) pairs named after the command
    /// line's flags: what a checkpoint records, and what a resumed run must share with it so
    /// that it continues the same run (the same batches, learning-rate schedule and
    /// arithmetic). `ranks` is the number of replicas over all processes.
    pub fn run_settings(&self, ranks: usize, train_images: usize) -> Vec<(String, String)> {
        let lower = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
        [
            ("devices", ranks.to_string()),
            ("batch", self.batch.to_string()),
            ("epochs", self.epochs.to_string()),
            // The learning-rate schedule spans min(max_steps, every epoch's steps).
            (
                "max-steps",
                self.max_steps.map_or("none".into(), |m| m.to_string()),
            ),
            ("recipe", lower(&self.recipe)),
            ("lr", self.lr.to_string()),
            ("momentum", self.momentum.to_string()),
            ("weight-decay", self.weight_decay.to_string()),
            ("seed", self.seed.to_string()),
            (
                "shuffle",
                if self.shuffle { "epoch" } else { "none" }.into(),
            ),
            ("precision", self.precision.name().into()),
            ("training-images", train_images.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect::<std::collections::BTreeMap<_, _>>() // by name, as a checkpoint reads back
        .into_iter()
        .collect()
    }

    /// Whether `start` can be continued by this run: every setting its checkpoint recorded
    /// ([`TrainConfig::run_settings`]) must be the same. A checkpoint that records none (a
    /// weights-only file, or one from before settings were recorded) is accepted. The error
    /// names every setting that differs, with both values.
    pub fn check_resume(
        &self,
        start: &checkpoint::Checkpoint,
        ranks: usize,
        train_images: usize,
    ) -> Result<(), TrainError> {
        let now = self.run_settings(ranks, train_images);
        let differ: Vec<String> = start
            .settings
            .iter()
            .filter_map(|(name, saved)| {
                let current = now.iter().find(|(n, _)| n == name).map(|(_, v)| v)?;
                (current != saved).then(|| format!("{name} {saved} there, {current} here"))
            })
            .collect();
        if differ.is_empty() {
            return Ok(());
        }
        Err(TrainError::ResumeMismatch {
            differences: differ,
        })
    }
}
