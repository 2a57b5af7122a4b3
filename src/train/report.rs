//! What a run reports while it trains: [`StepReport`], [`EpochReport`], and the [`Event`]s
//! that carry them (and each epoch's state to checkpoint) from the device threads.

use super::checkpoint;

/// One step's figures (global over all devices).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Step number, from 1.
    pub step: usize,
    /// Epoch, from 1.
    pub epoch: usize,
    /// Mean loss over the global batch.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f32,
    /// Loss scale used (1 in fp32).
    pub loss_scale: f32,
}

/// One epoch's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochReport {
    /// Epoch, from 1.
    pub epoch: usize,
    /// Steps taken in the whole run when the epoch ended.
    pub step: usize,
    /// Whether the epoch went over the whole training set (`false` when `max_steps` ended
    /// it early, or a resumed run started inside it).
    pub complete: bool,
    /// Mean training loss.
    pub train_loss: f64,
    /// Training accuracy (during the epoch).
    pub train_acc: f64,
    /// Test accuracy after the epoch.
    pub test_acc: f64,
    /// Seconds of training (evaluation excluded).
    pub seconds: f64,
    /// Training images per second.
    pub images_per_s: f64,
    /// Share of the training time spent in gradient allreduce.
    pub allreduce_share: f64,
}

/// Progress messages from the device threads.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// A step finished.
    Step(StepReport),
    /// Rank 0 evaluated `done` of its `total` test images after an epoch's training.
    Evaluating {
        /// Images done.
        done: usize,
        /// Images in rank 0's shard of the test set.
        total: usize,
    },
    /// An epoch finished; the state to checkpoint attached.
    Epoch(EpochReport, checkpoint::Checkpoint),
}
