//! The training loop: one thread and one model replica per rank, each step's forward and
//! backward with the gradients' reduction overlapped bucket by bucket, the SGD update, the
//! epoch's evaluation and report; [`train`] and [`train_ranks`] run it on every rank, and
//! [`test_accuracy`] evaluates weights data-parallel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use half::{bf16, f16};

use super::resident::{DeviceSet, EvalState, Lagged, Planned, Record, StepState, LAG};
use super::step_graph::Between;
use super::{
    checkpoint, gradient_buckets, rank_cores, EpochReport, Event, LossScaler, StepReport,
    TrainConfig, TrainError,
};
use crate::backend::op::BeginStep;
use crate::backend::{Backend, BackendError, Graph, Memory, Precision, SgdStep, Staging};
use crate::comm::collective::Collective;
use crate::comm::communicator::{communicator, CommConfig};
use crate::comm::patience::RunningClock;
use crate::comm::rank_threads::{on_each_rank, RankPanicked};
use crate::comm::schedule::Algorithm;
use crate::comm::transport::CommDevice;
use crate::data::{Batches, Dataset};
use crate::dtype::DType;
use crate::model::{GatheredShard, Replica, ShardStats, IMAGE, PARAMS};

/// How many times the loss of a model that guesses uniformly (ln 10 for ten classes) a
/// step's mean loss may reach before the run counts as diverged: [`divergence`].
pub const DIVERGED_LOSS_FACTOR: f64 = 100.0;

/// The step mean loss above which a run has diverged: [`DIVERGED_LOSS_FACTOR`] x ln(classes),
/// about 230 for LeNet. A loss that high means the model puts e^-230 on the right class:
/// its logits have blown up, and training does not come back from there (a run that trains
/// starts at about 2.3 and stays below about 10 even in the spikes of a high learning rate).
pub fn diverged_loss() -> f64 {
    DIVERGED_LOSS_FACTOR * (crate::model::CLASSES as f64).ln()
}

/// Why a step's mean `loss` says the run diverged, if it does: not a finite number, or above
/// [`diverged_loss`].
pub fn divergence(loss: f64) -> Option<String> {
    if !loss.is_finite() {
        Some(format!("the loss is {loss}"))
    } else if loss > diverged_loss() {
        Some(format!(
            "the loss is {loss:.3e}, over {:.0} ({DIVERGED_LOSS_FACTOR} times an untrained \
             model's ln {})",
            diverged_loss(),
            crate::model::CLASSES
        ))
    } else {
        None
    }
}

/// Checks that `data` holds images LeNet takes: 28x28, training and test alike.
pub fn check_data(data: &Dataset) -> Result<(), TrainError> {
    for (what, images) in [
        ("training", &data.train_images),
        ("test", &data.test_images),
    ] {
        if images.rows != IMAGE || images.cols != IMAGE {
            return Err(TrainError::Data {
                dir: data.dir.clone(),
                problem: format!(
                    "LeNet expects 28x28 images, the {what} images are {}x{}",
                    images.rows, images.cols
                ),
            });
        }
    }
    Ok(())
}

/// Sums `stats` over all ranks (the evaluation's counts). The buffer (`buf`, made at the
/// first call and kept by the caller) lives on the rank's own queue.
fn reduce_stats<C: Collective>(
    rank: &mut C,
    buf: &mut Option<StatsBuffer<C>>,
    s: ShardStats,
) -> Result<ShardStats, TrainError> {
    // One rank holds the sums already: no upload, collective or read back (the loss rounded
    // to f32 as the reduction carries it, so one rank reports what it always did).
    if rank.size() == 1 {
        let s = ShardStats {
            loss_sum: f64::from(s.loss_sum as f32),
            ..s
        };
        return Ok(s);
    }
    let dev = rank.device().clone();
    let values = [s.loss_sum as f32, s.correct as f32, s.count as f32];
    let buf = match buf {
        Some(b) => {
            dev.write(&values, b)?;
            b
        }
        None => buf.insert(dev.upload(&values)?),
    };
    rank.sum(buf, Some(Algorithm::OneShot))?;
    let v = dev.download(buf)?;
    let all = ShardStats {
        loss_sum: v[0] as f64,
        correct: v[1] as usize,
        count: v[2] as usize,
    };
    Ok(all)
}

/// The statistics' reduction buffer of a rank ([`reduce_stats`]).
type StatsBuffer<C> = <<C as Collective>::Device as Memory>::Buffer<f32>;

/// Evaluates the test set, sharded over the ranks (each rank's share on its device in
/// `eval`); returns the global accuracy.
fn evaluate<C: Collective, T: Precision>(
    rank: &mut C,
    stats: &mut Option<StatsBuffer<C>>,
    replica: &mut Replica<C::Device, T>,
    eval: &mut EvalState<C::Device>,
    (batch, capture): (usize, bool),
    progress: Option<&mpsc::Sender<Event>>,
) -> Result<f64, TrainError> {
    let total = eval.count;
    let (correct, count) = eval.run(replica, batch, capture, |done| {
        if let Some(events) = progress {
            let _ = events.send(Event::Evaluating { done, total });
        }
    })?;
    let mine = ShardStats {
        loss_sum: 0.0,
        correct,
        count,
    };
    let all = reduce_stats(rank, stats, mine)?;
    Ok(all.correct as f64 / all.count.max(1) as f64)
}

/// The marks that order a rank's two queues within a step at several ranks: `produced` on
/// the compute queue (the replica's fork) after a bucket's backward, for the rank's queue
/// to wait for before reducing it; `reduced` on the rank's queue after the reductions, for
/// the compute queue to wait for before the update.
pub(super) struct QueueMarks<D: Memory> {
    produced: D::Mark,
    reduced: D::Mark,
}

impl<D: Memory> QueueMarks<D> {
    fn new(dev: &D) -> Result<Self, BackendError> {
        Ok(QueueMarks {
            produced: dev.new_mark()?,
            reduced: dev.new_mark()?,
        })
    }
}

/// Orders the rank's queue (where its collectives run) after the compute queue's work so
/// far, by a mark: the backward work that produced the bucket about to be reduced.
fn after_compute<C: Collective>(
    rank: &C,
    compute: &C::Device,
    marks: &QueueMarks<C::Device>,
) -> Result<(), BackendError> {
    compute.record(&marks.produced)?;
    rank.device().wait_mark(&marks.produced)
}

/// Queues the sum of the step's statistics `out` over the ranks, then orders the compute
/// queue after every reduction of the step; returns the seconds it took the host.
fn reduce_step_stats<C: Collective>(
    rank: &mut C,
    compute: &C::Device,
    marks: &QueueMarks<C::Device>,
    out: &mut StatsBuffer<C>,
) -> Result<f64, TrainError> {
    let t = Instant::now();
    after_compute(rank, compute, marks)?;
    // One-shot, as the evaluation's sums: each element summed in rank order.
    rank.sum(out, Some(Algorithm::OneShot))?;
    rank.device().record(&marks.reduced)?;
    compute.wait_mark(&marks.reduced)?;
    Ok(t.elapsed().as_secs_f64())
}

/// Forward and backward on this rank's shard (gathered by the device: `shard`, with the
/// step's scalars computed as `begin` says, its statistics into `out`) with the gradients' allreduce overlapped,
/// as DDP does it: as soon as the backward pass hands a bucket over, the rank's thread
/// queues the bucket's reduction (tensor by tensor, in bucket order, the same on every
/// rank) on the rank's own queue, ordered after the backward work that produced it by a
/// mark, and goes on queueing backward. The statistics are summed the same way after the
/// backward pass, so every rank's record of the step holds the global loss. Nothing here
/// waits for a device: on a GPU the reductions run beside the rest of backward. The compute
/// between the collectives is queued as `between` says (captured stretches, or the stream).
/// Returns the seconds spent in the collectives (queueing them and waiting for the peers to
/// queue theirs; on devices whose work is done when queued, reducing).
fn step_and_reduce<C, T>(
    rank: &mut C,
    replica: &mut Replica<C::Device, T>,
    (shard, begin, out): (
        &GatheredShard<'_, C::Device>,
        BeginStep<'_, C::Device>,
        &mut StatsBuffer<C>,
    ),
    (bucket_of, marks): (&[usize; PARAMS.len()], Option<&QueueMarks<C::Device>>),
    algorithm: Option<Algorithm>,
    between: &mut Between<'_>,
) -> Result<f64, TrainError>
where
    C: Collective,
    T: Precision,
{
    // One rank has nothing to reduce.
    let Some(marks) = marks.filter(|_| rank.size() > 1) else {
        replica.step_gathered(shard, Some(begin), out, false, |_, _| {})?;
        return Ok(0.0);
    };
    let compute = replica.dev.clone();
    let mut in_collectives = 0.0;
    let mut failed: Option<TrainError> = None;
    let mut open = Vec::new();
    let mut filled = [0usize; PARAMS.len()];
    let mut sizes = [0usize; PARAMS.len()];
    for &b in bucket_of {
        sizes[b] += 1;
    }
    let computed = replica.step_gathered(shard, Some(begin), out, false, |i, g| {
        open.push(g);
        filled[bucket_of[i]] += 1;
        if filled[bucket_of[i]] < sizes[bucket_of[i]] || failed.is_some() {
            return;
        }
        let mut reduce = || -> Result<f64, TrainError> {
            between.cut(&compute)?;
            let t = Instant::now();
            after_compute(rank, &compute, marks)?;
            for g in open.drain(..) {
                rank.sum(g, algorithm)?;
            }
            let seconds = t.elapsed().as_secs_f64();
            between.begin(&compute)?;
            Ok(seconds)
        };
        match reduce() {
            Ok(seconds) => in_collectives += seconds,
            Err(e) => failed = Some(e),
        }
    });
    computed?;
    if let Some(e) = failed {
        return Err(e);
    }
    between.cut(&compute)?;
    in_collectives += reduce_step_stats(rank, &compute, marks, out)?;
    between.begin(&compute)?;
    Ok(in_collectives)
}

/// Replays a step captured by [`queue_step`] with [`Between::Capture`]: each stretch of
/// compute, and after stretch k the collective that followed it when it was captured (the
/// reduction of bucket k of `buckets`, then the statistics'). Returns the seconds spent in
/// the collectives.
fn replay_step<C, T>(
    rank: &mut C,
    replica: &mut Replica<C::Device, T>,
    (stretches, buckets): (&[Graph], &[Vec<usize>]),
    (marks, out): (Option<&QueueMarks<C::Device>>, &mut StatsBuffer<C>),
    algorithm: Option<Algorithm>,
) -> Result<f64, TrainError>
where
    C: Collective,
    T: Precision,
{
    let mut in_collectives = 0.0;
    for (k, stretch) in stretches.iter().enumerate() {
        stretch.launch()?;
        let Some(marks) = marks.filter(|_| rank.size() > 1) else {
            continue;
        };
        let compute = replica.dev.clone();
        if let Some(bucket) = buckets.get(k) {
            let t = Instant::now();
            after_compute(rank, &compute, marks)?;
            // In the bucket's order, as `step_and_reduce` reduced them.
            for &i in bucket {
                rank.sum(&mut replica.grads[i], algorithm)?;
            }
            in_collectives += t.elapsed().as_secs_f64();
        } else if k == buckets.len() {
            in_collectives += reduce_step_stats(rank, &compute, marks, out)?;
        }
    }
    Ok(in_collectives)
}

/// Queues one training step on the rank's device: the step's scalars, forward and backward
/// with the gradients' and the statistics' reduction ([`step_and_reduce`]), the overflow
/// check in half precision, the update, and the step's end (its record into `ring`, host
/// memory the device writes). Nothing in it is a host value that changes from step to step,
/// so the compute between its collectives can be captured (`between`). Returns the seconds
/// spent in the collectives.
#[allow(clippy::too_many_arguments)]
fn queue_step<C, T>(
    rank: &mut C,
    replica: &mut Replica<C::Device, T>,
    set: &DeviceSet<C::Device>,
    state: &mut StepState<C::Device>,
    ring: &mut Staging<f32>,
    (p, sgd): (&Planned, SgdStep),
    buckets: (&[usize; PARAMS.len()], Option<&QueueMarks<C::Device>>),
    algorithm: Option<Algorithm>,
    between: &mut Between<'_>,
) -> Result<f64, TrainError>
where
    C: Collective,
    T: Precision,
{
    let dev = replica.dev.clone();
    between.begin(&dev)?;
    let shard = set.shard(&state.order, &state.batch, state.stride, p.n);
    // The step's scalars come from the gather's launch (Backend::gather_batch_and_begin).
    let begin = BeginStep {
        lr_table: &state.lr_table,
        loss_scale: &state.loss_scale,
        global: p.global,
        out: &mut state.scalars,
    };
    let exposed = step_and_reduce(
        rank,
        replica,
        (&shard, begin, &mut state.current),
        buckets,
        algorithm,
        between,
    )?;
    if let Some(found) = &mut state.found {
        // 16-bit activations can overflow: a step whose gradients are not all finite is
        // skipped (and under fp16 the loss scale halves, on the device). Every replica holds
        // the same reduced gradients, so every replica decides alike.
        replica.check_gradients(found)?;
    }
    replica.update(sgd, Some(&state.scalars), state.found.as_ref())?;
    dev.step_end(
        &mut state.loss_scale,
        state.clean.as_mut(),
        state.found.as_mut(),
        LossScaler::GROWTH_INTERVAL,
        &mut state.batch,
        &state.current,
        ring,
    )?;
    between.cut(&dev)?;
    Ok(exposed)
}

/// One device's training loop. The data set, the epoch's order and learning rates, and the
/// step's scalars live on the device ([`resident`](super::resident)), so a step is queued
/// with no host value in it, and the host reads each step's record (the statistics summed
/// over the ranks) a few steps late ([`LAG`]): it never waits for the device inside an
/// epoch. At several ranks the ranks' threads agree after each step whether to stop (a host
/// exchange, [`Collective::any`]).
fn run_rank<C: Collective, T: Precision>(
    mut rank: C,
    start: &checkpoint::Checkpoint,
    data: &Dataset,
    cfg: &TrainConfig,
    events: &mpsc::Sender<Event>,
    stop: &AtomicBool,
) -> Result<Vec<Vec<f32>>, TrainError>
where
    <C::Device as Memory>::Buffer<f32>: Send,
{
    let (n, me) = (rank.size(), rank.rank());
    // Its own queue, so that the gradients' reduction (on the rank's queue) overlaps backward.
    let mut replica = Replica::<C::Device, T>::new(rank.device().fork()?, &start.weights)?;
    let scaler = match start.loss_scale {
        Some((scale, clean)) if T::DTYPE.needs_loss_scaling() => LossScaler::restored(scale, clean),
        _ => LossScaler::new(T::DTYPE.needs_loss_scaling()),
    };
    let mut stats_buf = None;
    let marks = (n > 1).then(|| QueueMarks::new(&replica.dev)).transpose()?;
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
    let dev = replica.dev.clone();
    let train_set = DeviceSet::upload(&dev, &data.train_images, &data.train_labels)?;
    let mut eval = EvalState::new(&dev, &data.test_images, &data.test_labels, (n, me))?;
    let kinds = (T::DTYPE.is_half(), scaler.enabled);
    let mut state = StepState::new(&dev, cfg, (n, me), &scaler, kinds, steps_per_epoch)?;
    let mut lagged = Lagged::new(&dev)?;
    // Graphs of the step per batch shape (the shard's and the global batch's sizes), and the
    // shapes whose first step has run. One rank's step waits for nothing on the host, so it
    // can be captured; several ranks' allreduce still waits on the host.
    let capture = cfg.cuda_graph && dev.can_capture();
    let mut graphs: Vec<((usize, usize), Vec<Graph>)> = Vec::new();
    let mut warmed: Vec<(usize, usize)> = Vec::new();
    let sgd = SgdStep {
        lr: 0.0,
        inv_scale: 1.0,
        momentum: cfg.momentum,
        weight_decay: cfg.weight_decay,
    };
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
        // The epoch's time leaves out a pause of the whole process (Ctrl-Z, kill -STOP), as
        // the collectives' timeout does: images/s is over the time the run was running.
        // Only rank 0 reports, so only rank 0 keeps the clock (and its ticker thread).
        let (clock, mut allreduce_s) = ((me == 0).then(RunningClock::start), 0.0);
        let mut epoch_stats = ShardStats::default();
        let first_batch = if epoch == first_epoch {
            step % steps_per_epoch
        } else {
            0
        };
        let plan = state.begin_epoch(
            &dev,
            cfg,
            &batches,
            (n, me),
            first_batch,
            (step, total_steps),
        )?;
        // What the host learns of a step, at once (several ranks) or late (one).
        let mut seen = |r: Record| -> Result<(), TrainError> {
            let [loss_sum, correct, count] = r.stats;
            epoch_stats.loss_sum += loss_sum as f64;
            epoch_stats.correct += correct as usize;
            epoch_stats.count += count as usize;
            let loss = loss_sum as f64 / (count as f64).max(1.0);
            if me == 0 {
                let _ = events.send(Event::Step(StepReport {
                    step: r.step,
                    epoch,
                    loss,
                    lr: r.lr,
                    loss_scale: r.loss_scale,
                }));
            }
            // Every rank holds the same reduced loss, so every rank stops at this step. In
            // fp16/bf16 a diverged step is skipped and the weights stay finite, but the loss
            // says it; in fp32 the loss can grow to 1e37 and stay finite. Either way the run
            // never goes on to checkpoint such a state.
            if let Some(problem) = divergence(loss) {
                return Err(TrainError::Diverged {
                    step: r.step,
                    epoch,
                    problem,
                });
            }
            Ok(())
        };
        for (i, p) in plan.iter().enumerate() {
            if step >= total_steps {
                break;
            }
            let mut queue_one = |between: &mut Between<'_>| -> Result<f64, TrainError> {
                queue_step(
                    &mut rank,
                    &mut replica,
                    &train_set,
                    &mut state,
                    lagged.ring(),
                    (p, sgd),
                    (&bucket_of, marks.as_ref()),
                    cfg.algorithm,
                    between,
                )
            };
            let shape = (p.n, p.global);
            allreduce_s += match graphs.iter().find(|(s, _)| *s == shape) {
                Some((_, stretches)) => replay_step(
                    &mut rank,
                    &mut replica,
                    (stretches, &buckets),
                    (marks.as_ref(), &mut state.current),
                    cfg.algorithm,
                )?,
                // A shape's first step runs from the stream: it allocates the shape's
                // activations and loads the kernels, which a capture may not. Its second is
                // captured, then launched. (A rank with no image in the batch writes its
                // zero statistics from the host: it runs from the stream.)
                None if capture && warmed.contains(&shape) && p.n > 0 => {
                    let mut stretches = Vec::new();
                    let exposed = queue_one(&mut Between::Capture(&mut stretches))?;
                    graphs.push((shape, stretches));
                    exposed
                }
                None => {
                    warmed.push(shape);
                    queue_one(&mut Between::Stream)?
                }
            };
            step += 1;
            // The caller's request to stop (its event handler failed) reaches rank 0's
            // thread; at several ranks every rank learns it at the same step, so that all
            // stop together.
            let asked = stop.load(Ordering::Relaxed);
            let stopping = if n == 1 {
                asked
            } else {
                rank.any(me == 0 && asked)?
            };
            if stopping {
                return Err(TrainError::Stopped);
            }
            lagged.mark((step, i, p.lr))?;
            for r in lagged.take(LAG)? {
                seen(r)?;
            }
        }
        for r in lagged.drain()? {
            seen(r)?;
        }
        let seconds = clock.as_ref().map_or(0.0, RunningClock::seconds);
        let test_acc = evaluate(
            &mut rank,
            &mut stats_buf,
            &mut replica,
            &mut eval,
            (cfg.batch, cfg.cuda_graph),
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
            let weights = replica.weights()?;
            // A NaN can sit in the weights while the loss stays finite: such a state is never
            // handed out to be saved.
            if let Some(name) = checkpoint::first_not_finite(&weights) {
                return Err(TrainError::Diverged {
                    step,
                    epoch,
                    problem: format!("`{name}` holds a value that is not finite"),
                });
            }
            let scaler = state.scaler(&dev, scaler.enabled)?;
            let state = checkpoint::Checkpoint {
                weights,
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
        return Err(TrainError::NoDevices);
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
        return Err(TrainError::Config(format!(
            "the batch and the number of epochs must be at least 1 (batch {}, epochs {})",
            cfg.batch, cfg.epochs
        )));
    }
    let total = ranks.first().map_or(0, |r| r.size());
    if total > cfg.batch {
        return Err(TrainError::Config(format!(
            "{total} ranks need a batch of at least {total} images, not {}",
            cfg.batch
        )));
    }
    check_data(data)?;
    if data.train_labels.is_empty() {
        return Err(TrainError::Data {
            dir: data.dir.clone(),
            problem: "the training set has no images".into(),
        });
    }
    cfg.check_resume(&start, total, data.train_labels.len())?;
    let (tx, rx) = mpsc::channel();
    let stop = AtomicBool::new(false);
    let local = ranks.len();
    // Pinned only where every rank is in this process (see rank_cores).
    let allowed = if local > 1 && local == total {
        rank_cores::allowed_cpus()
    } else {
        Vec::new()
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(i, rank)| {
                let tx = tx.clone();
                let (start, stop) = (&start, &stop);
                let cores = rank_cores::cores_of(i, local, &allowed);
                scope.spawn(move || {
                    rank_cores::pin_current_thread(cores);
                    let _pool = rank_thread_pool(local, cores.len());
                    match cfg.precision {
                        DType::F32 => run_rank::<C, f32>(rank, start, data, cfg, &tx, stop),
                        DType::F16 => run_rank::<C, f16>(rank, start, data, cfg, &tx, stop),
                        DType::BF16 => run_rank::<C, bf16>(rank, start, data, cfg, &tx, stop),
                    }
                })
            })
            .collect();
        drop(tx);
        let mut failure = None;
        for event in rx {
            // After the handler fails, the ranks stop at their next step; the events still
            // on their way are not handed to it.
            if failure.is_none() {
                if let Err(e) = on_event(event) {
                    failure = Some(e);
                    stop.store(true, Ordering::Relaxed);
                }
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
                    failure.get_or_insert(TrainError::RankPanicked(i));
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
/// cores. One rank keeps the global pool (all cores). `pinned` is the number of CPUs the
/// rank was pinned to ([`rank_cores`]; 0 if it was not). The pool lives as long as the value.
fn rank_thread_pool(local_ranks: usize, pinned: usize) -> Option<rayon::ThreadPool> {
    if local_ranks < 2 {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = match pinned {
        0 => (cores / local_ranks).max(1),
        share => share,
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
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
    let accuracies = on_each_rank(ranks, |mut rank| -> Result<f64, TrainError> {
        let (ranks, me) = (rank.size(), rank.rank());
        let dev = rank.device().clone();
        let mut eval = EvalState::new(&dev, &data.test_images, &data.test_labels, (ranks, me))?;
        let mut replica = Replica::<D, f32>::new(dev, weights)?;
        // One pass: nothing to replay, so no graph.
        let once = (batch.max(1), false);
        evaluate(&mut rank, &mut None, &mut replica, &mut eval, once, None)
    })
    .map_err(|RankPanicked(i)| TrainError::RankPanicked(i))?;
    // Every rank computed the same (reduced) accuracy; any rank's failure is the result.
    accuracies
        .into_iter()
        .reduce(|first, r| first.and_then(|a| r.map(|_| a)))
        .unwrap_or(Err(TrainError::NoDevices))
}
