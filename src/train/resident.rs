//! What a rank keeps on its device for the whole run, so that a training step needs nothing
//! from the host and the host waits for no step: the data set, uploaded once
//! ([`DeviceSet`]); each epoch's order and learning rates, uploaded once an epoch, the step's
//! scalars and the loss scaler's state ([`StepState`]); and a ring of step records in
//! page-locked host memory that the device writes and the host reads a few steps late,
//! through fences it asks, never waits for, while the device is busy ([`Lagged`]).

use std::collections::VecDeque;

use super::{learning_rate, LossScaler, TrainConfig};
use crate::backend::{Backend, BackendError, Fence, Graph, Staging, StepScalars, RECORD, STATS};
use crate::data::{Batches, Images};
use crate::model::GatheredShard;

type Buf<B, T> = <B as crate::backend::Memory>::Buffer<T>;

/// Step records the ring holds.
pub(super) const RING: usize = 8;

/// How many steps the host may queue beyond the last one it has read. When the device is
/// that far behind, the host waits for the oldest: the device then has this many steps
/// queued and never idles. A diverged run stops at most this many steps after the step
/// whose loss showed it (it reports that step).
pub(super) const LAG: usize = 4;

// The host reads a record before the device can overwrite it: at most LAG steps queued beyond
// the one being read, and the ring only comes round after RING.
const _: () = assert!(LAG < RING);

/// A data set on the device: pixels (one byte each) and labels, uploaded once.
pub(super) struct DeviceSet<B: Backend> {
    pixels: Buf<B, u8>,
    labels: Buf<B, u8>,
}

impl<B: Backend> DeviceSet<B> {
    /// Uploads `images` and `labels`.
    pub(super) fn upload(dev: &B, images: &Images, labels: &[u8]) -> Result<Self, BackendError> {
        Ok(DeviceSet {
            pixels: dev.upload(&images.pixels)?,
            labels: dev.upload(labels)?,
        })
    }

    /// Shard `n` of the batch `batch[0]` (its images at `order[batch[0] · stride ..]`).
    pub(super) fn shard<'a>(
        &'a self,
        order: &'a Buf<B, u32>,
        batch: &'a Buf<B, u32>,
        stride: usize,
        n: usize,
    ) -> GatheredShard<'a, B> {
        GatheredShard {
            pixels: &self.pixels,
            labels: &self.labels,
            order,
            batch,
            stride,
            n,
        }
    }
}

/// One batch of an epoch, as this rank takes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Planned {
    /// The rank's shard size.
    pub(super) n: usize,
    /// The global batch's size.
    pub(super) global: usize,
    /// The learning rate.
    pub(super) lr: f32,
}

/// A rank's training state on its device.
pub(super) struct StepState<B: Backend> {
    /// This rank's image indices for the epoch, batch after batch (room for a whole epoch).
    pub(super) order: Buf<B, u32>,
    /// The learning rate of each batch of the epoch.
    pub(super) lr_table: Buf<B, f32>,
    /// The batch the next step takes, counted from the epoch's first (advanced by
    /// [`Backend::step_end`]).
    pub(super) batch: Buf<B, u32>,
    /// The step's learning rate and loss factors ([`Backend::step_begin`]).
    pub(super) scalars: StepScalars<B>,
    /// The loss scale (1 without scaling).
    pub(super) loss_scale: Buf<B, f32>,
    /// fp16's clean steps since the scale last changed.
    pub(super) clean: Option<Buf<B, i32>>,
    /// A half-precision step's overflow flag.
    pub(super) found: Option<Buf<B, i32>>,
    /// The step's statistics ([`STATS`]).
    pub(super) current: Buf<B, f32>,
    /// The stride between batches in `order`: this rank's shard of a full batch.
    pub(super) stride: usize,
}

impl<B: Backend> StepState<B> {
    /// State for rank `me` of `ranks`, with `scaler`'s scale and clean steps; `half` and
    /// `dynamic` say whether steps check for overflows and whether the scale moves.
    pub(super) fn new(
        dev: &B,
        cfg: &TrainConfig,
        (ranks, me): (usize, usize),
        scaler: &LossScaler,
        (half, dynamic): (bool, bool),
        steps_per_epoch: usize,
    ) -> Result<Self, BackendError> {
        let stride = cfg.batch / ranks + usize::from(me < cfg.batch % ranks);
        let (scale, clean) = scaler.state();
        Ok(StepState {
            order: dev.alloc_zeros((steps_per_epoch * stride).max(1))?,
            lr_table: dev.alloc_zeros(steps_per_epoch.max(1))?,
            batch: dev.alloc_zeros(1)?,
            scalars: StepScalars::new(dev)?,
            loss_scale: dev.upload(&[scale])?,
            clean: dynamic.then(|| dev.upload(&[clean as i32])).transpose()?,
            found: half.then(|| dev.alloc_zeros(1)).transpose()?,
            current: dev.alloc_zeros(STATS)?,
            stride,
        })
    }

    /// Uploads the epoch's order and learning rates for batches `first..` of `batches` (the
    /// run's steps so far are `step`, of `total`), and points the device at the first.
    /// Returns each batch's plan, in order.
    pub(super) fn begin_epoch(
        &mut self,
        dev: &B,
        cfg: &TrainConfig,
        batches: &Batches,
        (ranks, me): (usize, usize),
        first: usize,
        (step, total): (usize, usize),
    ) -> Result<Vec<Planned>, BackendError> {
        let mut order = vec![u32::MAX; self.order_len()];
        let mut lrs = vec![f32::NAN; self.lr_len()];
        let mut plan = Vec::new();
        for b in first..batches.len() {
            let shards = batches.shards(b, ranks);
            let global = shards.iter().map(|s| s.indices.len()).sum();
            let mine = &shards[me].indices;
            let at = (b - first) * self.stride;
            for (o, &i) in order[at..at + mine.len()].iter_mut().zip(mine) {
                *o = i as u32;
            }
            let lr = learning_rate(cfg, step + b - first, total);
            lrs[b - first] = lr;
            plan.push(Planned {
                n: mine.len(),
                global,
                lr,
            });
        }
        dev.write(&order, &mut self.order)?;
        dev.write(&lrs, &mut self.lr_table)?;
        dev.write(&[0], &mut self.batch)?;
        Ok(plan)
    }

    fn order_len(&self) -> usize {
        crate::backend::DeviceBuffer::len(&self.order)
    }

    fn lr_len(&self) -> usize {
        crate::backend::DeviceBuffer::len(&self.lr_table)
    }

    /// The loss scaler as the device holds it (a read back: at an epoch's end).
    pub(super) fn scaler(&self, dev: &B, enabled: bool) -> Result<LossScaler, BackendError> {
        if !enabled {
            return Ok(LossScaler::new(false));
        }
        let scale = dev.download(&self.loss_scale)?[0];
        let clean = match &self.clean {
            Some(c) => dev.download(c)?[0].max(0) as usize,
            None => 0,
        };
        Ok(LossScaler::restored(scale, clean))
    }
}

/// A step queued on the device whose record the host has not read yet.
pub(super) struct Pending {
    /// The step's number in the run, from 1.
    pub(super) step: usize,
    /// Its batch, counted from the epoch's first: its record's slot in the ring.
    pub(super) batch: usize,
    /// Its learning rate.
    pub(super) lr: f32,
    fence: Fence,
}

/// A step's record as the host reads it.
pub(super) struct Record {
    /// The step's number in the run, from 1.
    pub(super) step: usize,
    /// Its learning rate.
    pub(super) lr: f32,
    /// Σ loss, correct, count ([`STATS`]).
    pub(super) stats: [f32; STATS],
    /// The loss scale it ran with.
    pub(super) loss_scale: f32,
}

/// The host's late reading of the ring: each step's end writes its record into its slot of
/// the ring, in page-locked host memory the device writes directly
/// ([`Backend::step_end`], [`Staging`]), and a fence marks the step; a record is read once
/// its fence is done. Each record is written by one kernel and no copy ever lands on the
/// ring, so the records the host reads are never in flight.
pub(super) struct Lagged<B: Backend + Clone> {
    ring: Staging<f32>,
    queue: VecDeque<Pending>,
    /// The queue that writes `ring`.
    dev: B,
}

impl<B: Backend + Clone> Drop for Lagged<B> {
    fn drop(&mut self) {
        // The device may still be writing the page-locked memory (a run that stops on an
        // error leaves steps queued): it is freed only after the queue has finished.
        let _ = self.dev.synchronize();
    }
}

impl<B: Backend + Clone> Lagged<B> {
    /// A ring in page-locked memory that `dev`'s kernels write.
    pub(super) fn new(dev: &B) -> Result<Self, BackendError> {
        Ok(Lagged {
            ring: dev.alloc_staging(RING * RECORD)?,
            queue: VecDeque::new(),
            dev: dev.clone(),
        })
    }

    /// The ring a step's end writes its record into ([`Backend::step_end`]).
    pub(super) fn ring(&mut self) -> &mut Staging<f32> {
        &mut self.ring
    }

    /// Marks a step whose work (its record's write included) is queued: step `step` of the run,
    /// batch `batch` of the epoch, at learning rate `lr`.
    pub(super) fn mark(
        &mut self,
        (step, batch, lr): (usize, usize, f32),
    ) -> Result<(), BackendError> {
        let fence = self.dev.fence()?;
        self.queue.push_back(Pending {
            step,
            batch,
            lr,
            fence,
        });
        Ok(())
    }

    /// Every record still unread, after the device's queue is finished (an epoch's end).
    pub(super) fn drain(&mut self) -> Result<Vec<Record>, BackendError> {
        self.dev.synchronize()?;
        let mut out = Vec::new();
        while let Some(p) = self.queue.pop_front() {
            out.push(self.record(&p));
        }
        Ok(out)
    }

    /// The record of `p`, whose copy is done.
    fn record(&self, p: &Pending) -> Record {
        let ring = self.ring.read();
        let at = (p.batch % RING) * RECORD;
        let r = &ring[at..at + RECORD];
        Record {
            step: p.step,
            lr: p.lr,
            stats: [r[0], r[1], r[2]],
            loss_scale: r[STATS],
        }
    }

    /// The records the host may read now, oldest first: every step whose copy is done, and
    /// the oldest ones beyond the last `keep` queued, for which it waits (once, for the
    /// newest of them: the queue runs in order).
    pub(super) fn take(&mut self, keep: usize) -> Result<Vec<Record>, BackendError> {
        let beyond = self.queue.len().saturating_sub(keep);
        if let Some(newest) = beyond.checked_sub(1).map(|i| &self.queue[i]) {
            if !newest.fence.is_done()? {
                newest.fence.wait()?;
            }
        }
        let mut out = Vec::new();
        while let Some(front) = self.queue.front() {
            if out.len() >= beyond && !front.fence.is_done()? {
                break;
            }
            let p = self.queue.pop_front().expect("front exists");
            out.push(self.record(&p));
        }
        Ok(out)
    }
}

/// A rank's evaluation state: its shard of the test set and the running totals.
pub(super) struct EvalState<B: Backend + Clone> {
    set: DeviceSet<B>,
    order: Buf<B, u32>,
    batch: Buf<B, u32>,
    totals: Buf<B, f32>,
    /// Where each evaluation step's end writes its record (read by no one: the totals are).
    ring: Staging<f32>,
    unit: Buf<B, f32>,
    /// The rank's test images.
    pub(super) count: usize,
    /// Graphs of an evaluation step per shard size, and the sizes whose first step has run
    /// (as the training steps': see `run_rank`).
    graphs: Vec<(usize, Graph)>,
    warmed: Vec<usize>,
    /// The queue that writes `ring`.
    dev: B,
}

impl<B: Backend + Clone> Drop for EvalState<B> {
    fn drop(&mut self) {
        // As `Lagged`'s: the ring is freed only after the steps that write it have run.
        let _ = self.dev.synchronize();
    }
}

impl<B: Backend + Clone> EvalState<B> {
    /// Rank `me` of `ranks`'s share of the test set `images`/`labels`.
    pub(super) fn new(
        dev: &B,
        images: &Images,
        labels: &[u8],
        (ranks, me): (usize, usize),
    ) -> Result<Self, BackendError> {
        let total = labels.len();
        let (lo, hi) = (total * me / ranks, total * (me + 1) / ranks);
        let order: Vec<u32> = (lo as u32..hi as u32).collect();
        Ok(EvalState {
            set: DeviceSet::upload(dev, images, labels)?,
            order: dev.upload(if order.is_empty() { &[0] } else { &order })?,
            batch: dev.alloc_zeros(1)?,
            totals: dev.alloc_zeros(STATS)?,
            ring: dev.alloc_staging(RECORD)?,
            unit: dev.upload(&[1.0])?,
            count: hi - lo,
            graphs: Vec::new(),
            warmed: Vec::new(),
            dev: dev.clone(),
        })
    }

    /// Evaluates `replica` on the shard in batches of `batch`, calling `progress` with the
    /// images done after each; returns (correct, count), read back once at the end. With
    /// `capture` (and a backend that records work) each batch shape's step is captured at
    /// its second evaluation and replayed from then on.
    pub(super) fn run<T: crate::backend::Precision>(
        &mut self,
        replica: &mut crate::model::Replica<B, T>,
        batch: usize,
        capture: bool,
        mut progress: impl FnMut(usize),
    ) -> Result<(usize, usize), BackendError>
    where
        B: 'static,
    {
        let capture = capture && replica.dev.can_capture();
        replica.dev.write(&[0], &mut self.batch)?;
        replica.dev.write(&[0.0; STATS], &mut self.totals)?;
        let mut done = 0;
        while done < self.count {
            let n = batch.min(self.count - done);
            if let Some((_, graph)) = self.graphs.iter().find(|(size, _)| *size == n) {
                graph.launch()?;
            } else if capture && self.warmed.contains(&n) {
                replica.dev.begin_capture()?;
                let queued = self.queue(replica, batch, n);
                let graph = replica.dev.end_capture();
                queued?;
                let graph = graph?;
                graph.launch()?;
                self.graphs.push((n, graph));
            } else {
                self.warmed.push(n);
                self.queue(replica, batch, n)?;
            }
            done += n;
            progress(done);
        }
        let v = replica.dev.download(&self.totals)?;
        Ok((v[1] as usize, v[2] as usize))
    }

    /// Queues one evaluation step of `n` images (`batch` apart in the order): forward, the
    /// statistics added to the totals, the next batch.
    fn queue<T: crate::backend::Precision>(
        &mut self,
        replica: &mut crate::model::Replica<B, T>,
        batch: usize,
        n: usize,
    ) -> Result<(), BackendError>
    where
        B: 'static,
    {
        let shard = self.set.shard(&self.order, &self.batch, batch, n);
        replica.step_gathered(&shard, None, &mut self.totals, true, |_, _| {})?;
        replica.dev.step_end(
            &mut self.unit,
            None,
            None,
            1,
            &mut self.batch,
            &self.totals,
            &mut self.ring,
        )
    }
}
