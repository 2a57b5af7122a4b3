//! Data-parallel training: one thread and one model replica per device. Every step each
//! device runs forward and backward on its shard of the global batch, the gradients are
//! summed across devices by the hand-rolled allreduce ([`crate::comm`]), and every replica
//! applies the same SGD update, so the replicas stay bitwise identical.

pub mod checkpoint;
#[cfg(feature = "mpi")]
pub mod mpi;

use std::sync::mpsc;
use std::time::Instant;

use thiserror::Error;

use crate::backend::SgdStep;
use crate::backend::{Backend, BackendError, Fence, Memory, Precision};
use crate::comm::communicator::{communicator, CommConfig, CommError, Rank, ReduceOp};
use crate::comm::schedule::Algorithm;
use crate::comm::transport::CommDevice;
use crate::data::{Batches, Dataset};
use crate::model::{Replica, ShardStats, BACKWARD_ORDER, IMAGE, PARAMS};
use half::f16;

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

/// How the weights start and the optimizer behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// The reference chapter exactly: N(0, 0.01²) weights, zero biases, plain SGD.
    Chapter,
    /// Ours: He-scaled init, SGD with momentum 0.9, cosine learning-rate decay.
    Default,
}

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
    pub precision: Storage,
    /// Gradient bucket capacity in bytes (see [`gradient_buckets`]); 0 puts every gradient
    /// in one bucket, reduced after the backward pass.
    pub bucket_bytes: usize,
    /// How the ranks' communicator behaves (its timeout above all).
    pub comm: CommConfig,
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
            ("precision", lower(&self.precision)),
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
        Err(TrainError::Config(format!(
            "the checkpoint belongs to a run with other settings ({}): resume with that run's \
             settings, or start a new run from its weights with --init",
            differ.join("; ")
        )))
    }
}

/// Gradient buckets, as PyTorch DDP forms them: tensors in the order the backward pass
/// finishes them ([`BACKWARD_ORDER`]), a bucket closed once it holds at least `cap_bytes`
/// (so a bucket is never split inside a tensor). `cap_bytes` 0 means one bucket.
///
/// ```
/// // LeNet at 64 KiB: [fc2.weight, fc2.bias, fc1.weight], [fc1.bias, conv2.weight],
/// // [conv2.bias, conv1.weight, conv1.bias].
/// assert_eq!(
///     nanoddp::train::gradient_buckets(64 << 10),
///     vec![vec![6, 7, 4], vec![5, 2], vec![3, 0, 1]]
/// );
/// ```
pub fn gradient_buckets(cap_bytes: usize) -> Vec<Vec<usize>> {
    let mut buckets = vec![Vec::new()];
    let mut bytes = 0;
    for i in BACKWARD_ORDER {
        let open = buckets.last_mut().expect("never empty");
        open.push(i);
        bytes += PARAMS[i].len() * std::mem::size_of::<f32>();
        if cap_bytes > 0 && bytes >= cap_bytes {
            buckets.push(Vec::new());
            bytes = 0;
        }
    }
    buckets.retain(|b| !b.is_empty());
    buckets
}

/// Activation storage: f32, or f16 with f32 master weights and dynamic loss scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Everything in f32.
    Fp32,
    /// Half activations and weight copies, f32 master weights, gradients and optimizer state.
    Fp16,
}

/// Dynamic loss scaling, as PyTorch's GradScaler: multiply the loss (so the half-precision
/// gradients keep their small values) by a scale that starts at 2^16, halves and skips the
/// step when a gradient overflows, and doubles after 2000 clean steps in a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaler {
    /// The current scale (1 when disabled).
    pub scale: f32,
    /// Whether scaling (and the overflow check) is on.
    pub enabled: bool,
    clean: usize,
}

impl LossScaler {
    /// Starting scale.
    pub const INITIAL: f32 = 65536.0;
    /// Clean steps before the scale doubles.
    pub const GROWTH_INTERVAL: usize = 2000;

    /// A scaler; `enabled` for half precision.
    pub fn new(enabled: bool) -> Self {
        LossScaler {
            scale: if enabled { Self::INITIAL } else { 1.0 },
            enabled,
            clean: 0,
        }
    }

    /// A scaler continuing from a saved `(scale, clean steps)` (see [`LossScaler::state`]).
    pub fn restored(scale: f32, clean: usize) -> Self {
        LossScaler {
            scale,
            enabled: true,
            clean: clean % Self::GROWTH_INTERVAL,
        }
    }

    /// The scale and the clean steps since it last changed.
    pub fn state(&self) -> (f32, usize) {
        (self.scale, self.clean)
    }

    /// Records a step: `overflow` means it was skipped.
    pub fn update(&mut self, overflow: bool) {
        if overflow {
            self.scale = (self.scale / 2.0).max(1.0);
            self.clean = 0;
        } else {
            self.clean += 1;
            if self.clean == Self::GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.clean = 0;
            }
        }
    }
}

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

/// splitmix64: the seeded generator of the initial weights.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A standard normal draw (Box-Muller).
fn normal(state: &mut u64) -> f64 {
    let u1 = ((splitmix(state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (splitmix(state) >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Initial weights for `recipe`, one vector per tensor of [`PARAMS`]; the same on every device.
pub fn initial_weights(recipe: Recipe, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed ^ 0x5eed_1e7e_0000_0000;
    PARAMS
        .iter()
        .map(|p| {
            let std = match (recipe, p.fan_in) {
                (_, 0) => 0.0, // biases start at zero
                (Recipe::Chapter, _) => 0.01,
                (Recipe::Default, fan_in) => (2.0 / fan_in as f64).sqrt(), // He: keeps ReLU activations' scale
            };
            (0..p.len())
                .map(|_| (normal(&mut state) * std) as f32)
                .collect()
        })
        .collect()
}

/// The learning rate of `step` (0-based) of `total`.
pub fn learning_rate(cfg: &TrainConfig, step: usize, total: usize) -> f32 {
    match cfg.recipe {
        Recipe::Chapter => cfg.lr,
        // Cosine decay to zero over the run: large steps early, fine ones at the end.
        Recipe::Default => {
            let t = step as f64 / total.max(1) as f64;
            (cfg.lr as f64 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())) as f32
        }
    }
}

fn gather(data: &crate::data::Images, labels: &[u8], indices: &[usize]) -> (Vec<u8>, Vec<u8>) {
    let mut pixels = Vec::with_capacity(indices.len() * data.size());
    for &i in indices {
        pixels.extend_from_slice(data.image(i));
    }
    (pixels, indices.iter().map(|&i| labels[i]).collect())
}

/// A fresh start from `weights`.
pub fn from_weights(weights: Vec<Vec<f32>>) -> checkpoint::Checkpoint {
    checkpoint::Checkpoint {
        weights,
        velocity: None,
        epoch: 0,
        step: 0,
        loss_scale: None,
        settings: Vec::new(),
    }
}

/// Checks that `data` holds images LeNet takes: 28x28, training and test alike.
pub fn check_data(data: &Dataset) -> Result<(), TrainError> {
    for (what, images) in [
        ("training", &data.train_images),
        ("test", &data.test_images),
    ] {
        if images.rows != IMAGE || images.cols != IMAGE {
            return Err(TrainError::Config(format!(
                "{}: LeNet expects 28x28 images, the {what} images are {}x{}",
                data.dir.display(),
                images.rows,
                images.cols
            )));
        }
    }
    Ok(())
}

/// How a training rank sums buffers with all the others: an in-process [`Rank`], or (feature
/// `mpi`) a rank of a process group, reduced locally and then across processes.
pub trait Collective: Send {
    /// The device this rank trains on.
    type Device: CommDevice + Backend + Clone + 'static;
    /// This rank among all ranks (all processes).
    fn rank(&self) -> usize;
    /// All ranks.
    fn size(&self) -> usize;
    /// The device.
    fn device(&self) -> &Self::Device;
    /// Sums `buf` over all ranks, in place (`algorithm: None` picks by size).
    fn sum(
        &mut self,
        buf: &mut <Self::Device as Memory>::Buffer<f32>,
        algorithm: Option<Algorithm>,
    ) -> Result<(), TrainError>;
}

impl<D: CommDevice + Backend + Clone + 'static> Collective for Rank<D> {
    type Device = D;
    fn rank(&self) -> usize {
        Rank::rank(self)
    }
    fn size(&self) -> usize {
        Rank::size(self)
    }
    fn device(&self) -> &D {
        Rank::device(self)
    }
    fn sum(
        &mut self,
        buf: &mut <D as Memory>::Buffer<f32>,
        algorithm: Option<Algorithm>,
    ) -> Result<(), TrainError> {
        Ok(self.all_reduce(buf, ReduceOp::Sum, algorithm)?)
    }
}

/// Sums `stats` over all ranks. The buffer lives on the rank's own queue, which the
/// collective waits for before peers read it.
fn reduce_stats<C: Collective>(rank: &mut C, s: ShardStats) -> Result<ShardStats, TrainError> {
    let dev = rank.device().clone();
    let mut buf = dev.upload(&[s.loss_sum as f32, s.correct as f32, s.count as f32])?;
    rank.sum(&mut buf, Some(Algorithm::OneShot))?;
    let v = dev.download(&buf)?;
    Ok(ShardStats {
        loss_sum: v[0] as f64,
        correct: v[1] as usize,
        count: v[2] as usize,
    })
}

/// Evaluates the test set, sharded over the ranks; returns the global accuracy.
fn evaluate<C: Collective, T: Precision>(
    rank: &mut C,
    replica: &mut Replica<C::Device, T>,
    data: &Dataset,
    batch: usize,
    progress: Option<&mpsc::Sender<Event>>,
) -> Result<f64, TrainError> {
    let (n, me) = (rank.size(), rank.rank());
    let total = data.test_labels.len();
    let (lo, hi) = (total * me / n, total * (me + 1) / n);
    let mut mine = ShardStats::default();
    let mut start = lo;
    while start < hi {
        let end = (start + batch).min(hi);
        let idx: Vec<usize> = (start..end).collect();
        let (images, labels) = gather(&data.test_images, &data.test_labels, &idx);
        let s = replica.step(&images, &labels, None)?;
        mine.correct += s.correct;
        mine.count += s.count;
        start = end;
        if let Some(events) = progress {
            let _ = events.send(Event::Evaluating {
                done: start - lo,
                total: hi - lo,
            });
        }
    }
    let all = reduce_stats(rank, mine)?;
    Ok(all.correct as f64 / all.count.max(1) as f64)
}

/// Forward and backward on this rank's shard with the gradients' allreduce overlapped: a
/// communication thread owns the rank for the step and reduces each bucket (tensor by tensor,
/// in bucket order, the same on every rank) as soon as the backward pass hands it over.
/// Returns the shard's statistics and the seconds the compute thread waited for
/// communication after its backward pass (the part not hidden behind compute).
fn step_and_reduce<C, T>(
    rank: &mut C,
    replica: &mut Replica<C::Device, T>,
    (images, labels, grad_scale): (&[u8], &[u8], f32),
    bucket_of: &[usize; PARAMS.len()],
    algorithm: Option<Algorithm>,
) -> Result<(ShardStats, f64), TrainError>
where
    C: Collective,
    <C::Device as Memory>::Buffer<f32>: Send,
    T: Precision,
{
    // The replica computes on its own queue (a fork of the rank's device handle): each bucket
    // travels with a fence marking the backward work that produced it, and the communication
    // thread waits for that fence, not for the whole queue, before the peers may read it.
    let compute = replica.dev.clone();
    type Bucket<'b, D> = (
        Vec<&'b mut <D as Memory>::Buffer<f32>>,
        Result<Fence, BackendError>,
    );
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Bucket<'_, C::Device>>();
        let comm = scope.spawn(move || -> Result<(), TrainError> {
            for (bucket, fence) in rx {
                fence?.wait()?;
                for g in bucket {
                    rank.sum(g, algorithm)?;
                }
            }
            Ok(())
        });
        let mut open = Vec::new();
        let mut filled = [0usize; PARAMS.len()];
        let mut sizes = [0usize; PARAMS.len()];
        for &b in bucket_of {
            sizes[b] += 1;
        }
        let computed = replica.step_with(images, labels, Some(grad_scale), |i, g| {
            open.push(g);
            filled[bucket_of[i]] += 1;
            if filled[bucket_of[i]] == sizes[bucket_of[i]] {
                // A failed send means the communication thread already stopped on an
                // error, which its join below reports.
                let _ = tx.send((std::mem::take(&mut open), compute.fence()));
            }
        });
        drop(tx);
        // What follows backward on the device is communication left exposed: finish the
        // compute queue first, so that its tail is not counted as waiting for the reduction.
        let finished = compute.synchronize();
        let t = Instant::now();
        let reduced = comm
            .join()
            .map_err(|_| TrainError::Config("the gradient communication thread panicked".into()))?;
        let exposed = t.elapsed().as_secs_f64();
        let stats = computed?;
        reduced?;
        finished?;
        Ok((stats, exposed))
    })
}

/// One device's training loop.
fn run_rank<C: Collective, T: Precision>(
    mut rank: C,
    start: &checkpoint::Checkpoint,
    data: &Dataset,
    cfg: &TrainConfig,
    events: &mpsc::Sender<Event>,
) -> Result<Vec<Vec<f32>>, TrainError>
where
    <C::Device as Memory>::Buffer<f32>: Send,
{
    let (n, me) = (rank.size(), rank.rank());
    // Its own queue, so that the gradients' reduction (on the rank's queue) overlaps backward.
    let mut replica = Replica::<C::Device, T>::new(rank.device().fork()?, &start.weights)?;
    let mut scaler = match start.loss_scale {
        Some((scale, clean)) if T::DTYPE.is_half() => LossScaler::restored(scale, clean),
        _ => LossScaler::new(T::DTYPE.is_half()),
    };
    let mut found = replica.dev.alloc_zeros::<i32>(1)?;
    if let Some(velocity) = &start.velocity {
        for (buf, v) in replica.velocity.iter_mut().zip(velocity) {
            replica.dev.write(v, buf)?;
        }
    }
    let steps_per_epoch = data.train_labels.len().div_ceil(cfg.batch);
    let total_steps = cfg
        .max_steps
        .unwrap_or(usize::MAX)
        .min(steps_per_epoch * cfg.epochs);
    let mut bucket_of = [0; PARAMS.len()];
    let buckets = gradient_buckets(cfg.bucket_bytes);
    for (b, tensors) in buckets.iter().enumerate() {
        for &i in tensors {
            bucket_of[i] = b;
        }
    }
    // The step count places a resumed run: a checkpoint written when `max_steps` stopped an
    // epoch early continues inside that epoch, at the batch after the last one it took.
    let mut step = start.step;
    let first_epoch = step / steps_per_epoch + 1;
    let last_epoch = cfg.stop_after.unwrap_or(cfg.epochs).min(cfg.epochs);
    for epoch in first_epoch..=last_epoch {
        if step >= total_steps {
            break;
        }
        let batches = Batches::new(
            data.train_labels.len(),
            cfg.batch,
            cfg.shuffle,
            cfg.seed,
            epoch as u64,
        );
        let (start, mut allreduce_s) = (Instant::now(), 0.0);
        let mut epoch_stats = ShardStats::default();
        let first_batch = if epoch == first_epoch {
            step % steps_per_epoch
        } else {
            0
        };
        for b in first_batch..batches.len() {
            if step >= total_steps {
                break;
            }
            let shards = batches.shards(b, n);
            let global: usize = shards.iter().map(|s| s.indices.len()).sum();
            let (images, labels) =
                gather(&data.train_images, &data.train_labels, &shards[me].indices);
            let grad_scale = scaler.scale / global as f32;
            let (local, exposed) = step_and_reduce(
                &mut rank,
                &mut replica,
                (&images, &labels, grad_scale),
                &bucket_of,
                cfg.algorithm,
            )?;
            allreduce_s += exposed;
            let lr = learning_rate(cfg, step, total_steps);
            let sgd = SgdStep {
                lr,
                inv_scale: 1.0 / scaler.scale,
                momentum: cfg.momentum,
                weight_decay: cfg.weight_decay,
            };
            let loss_scale = scaler.scale;
            if scaler.enabled {
                // Every replica holds the same reduced gradients, so every replica decides alike.
                replica.dev.write(&[0], &mut found)?;
                replica.check_gradients(&mut found)?;
                replica.update(sgd, Some(&found))?;
                scaler.update(replica.dev.download(&found)?[0] != 0);
            } else {
                replica.update(sgd, None)?;
            }
            let s = reduce_stats(&mut rank, local)?;
            epoch_stats.loss_sum += s.loss_sum;
            epoch_stats.correct += s.correct;
            epoch_stats.count += s.count;
            step += 1;
            if me == 0 {
                let _ = events.send(Event::Step(StepReport {
                    step,
                    epoch,
                    loss: s.loss_sum / s.count.max(1) as f64,
                    lr,
                    loss_scale,
                }));
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let test_acc = evaluate(
            &mut rank,
            &mut replica,
            data,
            cfg.batch,
            (me == 0).then_some(events),
        )?;
        if me == 0 {
            let report = EpochReport {
                epoch,
                step,
                complete: first_batch == 0 && step == epoch * steps_per_epoch,
                train_loss: epoch_stats.loss_sum / epoch_stats.count.max(1) as f64,
                train_acc: epoch_stats.correct as f64 / epoch_stats.count.max(1) as f64,
                test_acc,
                seconds,
                images_per_s: epoch_stats.count as f64 / seconds,
                allreduce_share: allreduce_s / seconds,
            };
            let velocity = replica
                .velocity
                .iter()
                .map(|v| replica.dev.download(v))
                .collect::<Result<Vec<_>, _>>()?;
            let state = checkpoint::Checkpoint {
                weights: replica.weights()?,
                velocity: Some(velocity),
                epoch: step / steps_per_epoch,
                step,
                loss_scale: scaler.enabled.then(|| scaler.state()),
                settings: cfg.run_settings(n, data.train_labels.len()),
            };
            let _ = events.send(Event::Epoch(report, state));
        }
    }
    Ok(replica.weights()?)
}

/// Trains from `start` (weights, and optionally the optimizer state and the epochs and steps
/// already done, to resume a run) on `devices` (one replica each). Progress arrives through `on_event`
/// on the calling thread. Returns every replica's final weights, in device order (they are
/// identical: every replica applies the same update to the same reduced gradients).
pub fn train<D>(
    devices: Vec<D>,
    data: &Dataset,
    start: checkpoint::Checkpoint,
    cfg: &TrainConfig,
    on_event: impl FnMut(Event) -> Result<(), TrainError>,
) -> Result<Vec<Vec<Vec<f32>>>, TrainError>
where
    D: CommDevice + Backend + Clone + Send + 'static,
    <D as Memory>::Buffer<f32>: Send,
{
    if devices.is_empty() {
        return Err(TrainError::Config("no device to train on".into()));
    }
    let ranks = communicator(devices, cfg.comm)?;
    train_ranks(ranks, data, start, cfg, on_event)
}

/// [`train`] over ranks already connected: this process's share of all the ranks (every
/// rank of an in-process communicator, or the local ranks of one MPI process). Events come
/// from global rank 0 only; returns this process's replicas' final weights.
pub fn train_ranks<C>(
    ranks: Vec<C>,
    data: &Dataset,
    start: checkpoint::Checkpoint,
    cfg: &TrainConfig,
    mut on_event: impl FnMut(Event) -> Result<(), TrainError>,
) -> Result<Vec<Vec<Vec<f32>>>, TrainError>
where
    C: Collective,
    <C::Device as Memory>::Buffer<f32>: Send,
{
    if cfg.batch == 0 || cfg.epochs == 0 {
        return Err(TrainError::Config(
            "--batch and --epochs must be at least 1".into(),
        ));
    }
    let total = ranks.first().map_or(0, |r| r.size());
    if total > cfg.batch {
        return Err(TrainError::Config(format!(
            "{total} devices need a batch of at least {total} images"
        )));
    }
    check_data(data)?;
    if data.train_labels.is_empty() {
        return Err(TrainError::Config(format!(
            "{}: the training set has no images",
            data.dir.display()
        )));
    }
    cfg.check_resume(&start, total, data.train_labels.len())?;
    let (tx, rx) = mpsc::channel();
    let local = ranks.len();
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|rank| {
                let tx = tx.clone();
                let start = &start;
                scope.spawn(move || {
                    let _pool = rank_thread_pool(local);
                    match cfg.precision {
                        Storage::Fp32 => run_rank::<C, f32>(rank, start, data, cfg, &tx),
                        Storage::Fp16 => run_rank::<C, f16>(rank, start, data, cfg, &tx),
                    }
                })
            })
            .collect();
        drop(tx);
        let mut failure = None;
        for event in rx {
            if let Err(e) = on_event(event) {
                failure.get_or_insert(e);
            }
        }
        let mut finals = Vec::new();
        for (i, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(w)) => finals.push(w),
                Ok(Err(e)) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {
                    failure.get_or_insert(TrainError::Panicked(i));
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(finals),
        }
    })
}

/// With several local ranks, gives the calling rank thread its own rayon pool of its share
/// of the cores, the thread itself being the pool's first worker (`use_current_thread`).
/// The CPU backend's parallel loops then run on the rank's own thread(s) instead of all
/// ranks queueing every operation on the one global pool and sleeping until a worker
/// finishes it: with 4 ranks on 2 cores each rank computes inline and the OS shares the
/// cores. One rank keeps the global pool (all cores). The pool lives as long as the value.
fn rank_thread_pool(local_ranks: usize) -> Option<rayon::ThreadPool> {
    if local_ranks < 2 {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    rayon::ThreadPoolBuilder::new()
        .num_threads((cores / local_ranks).max(1))
        .use_current_thread()
        .build()
        .ok()
}

/// Test accuracy of `weights`, evaluated data-parallel over `devices`.
pub fn test_accuracy<D>(
    devices: Vec<D>,
    data: &Dataset,
    weights: &[Vec<f32>],
    batch: usize,
) -> Result<f64, TrainError>
where
    D: CommDevice + Backend + Clone + Send + 'static,
{
    check_data(data)?;
    let ranks = communicator(devices, CommConfig::default())?;
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|mut rank| {
                scope.spawn(move || -> Result<f64, TrainError> {
                    let mut replica = Replica::<D, f32>::new(rank.device().clone(), weights)?;
                    evaluate(&mut rank, &mut replica, data, batch.max(1), None)
                })
            })
            .collect();
        let mut acc = Err(TrainError::Config("no device".into()));
        for (i, h) in handles.into_iter().enumerate() {
            let r = h.join().map_err(|_| TrainError::Panicked(i))?;
            if i == 0 {
                acc = r;
            } else {
                r?;
            }
        }
        acc
    })
}
