//! The communicator: ranks (one per device, each driven by its own thread) that run
//! collectives together by executing verified schedules over each other's memory.
//!
//! Protocol of one collective, per rank:
//! 1. **Announce**: write what is being called (kind, element type, count, algorithm, root,
//!    in place, buffer addresses) to this rank's slot, then raise the rank's flag to
//!    "announced". Wait until every peer has announced the same collective and compare:
//!    any difference is an error on every rank, naming the rank and both calls.
//! 2. **Steps**: for each step of the schedule, wait for the flags it names, move the data
//!    through the device's transport, raise the flag by one.
//! 3. **Drain**: wait until every peer is done with this rank's memory, then return.
//!
//! A flag says that a rank has *queued* its work up to that point, not that the work is
//! done: with every raise the rank records a mark in its device's queue ([`Memory::Mark`](crate::backend::Memory::Mark),
//! a CUDA event), and a rank that waits for the flag then makes its own queue wait for that
//! mark. So the host threads wait only for each other's queueing, never for a GPU, and the
//! GPUs order the data between them (`cuStreamWaitEvent`). On a device whose work is done
//! when queued (the CPU, the SIMT emulator) a flag means done, and marks are nothing.
//! A rank keeps one mark per flag value, for two collectives in turn: a rank can record
//! collective s + 2's marks only after every peer announced s + 1, so after every peer has
//! made its queue wait for s's marks.
//!
//! Flags are 64-bit and only grow: `sequence << 32 | (1 + steps completed)`, so a flag never
//! has to be reset and a slow rank can never mistake an old collective's progress for the
//! current one's. Each sits alone on its own cache lines. A wait ([`super::wait`]) spins
//! briefly, yields, then sleeps on the flag's doorbell (woken by the flag's owner), so eight
//! ranks on two cores still progress. Every wait gives up after the configured timeout, and watches the abort
//! flag and the peer's departure: a rank that panics or drops its handle mid-collective
//! aborts the communicator, and every other rank returns [`CommError`] instead of hanging.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use thiserror::Error;

pub use super::agreement::ReduceOp;
use super::agreement::{self, Call};
use super::cost::CostModel;
use super::schedule::{self, Algorithm, Buffer, Schedule};
use super::transport::{ensure_scratch, CommDevice, Reduction, MAX_RANKS};
use super::wait::{Signal, WaitEnd};
use crate::backend::{BackendError, DeviceBuffer, Precision};
use crate::dtype::DType;

/// How a communicator behaves.
#[derive(Debug, Clone, Copy)]
pub struct CommConfig {
    /// Longest any rank waits for a peer before giving up with an error, not counting time
    /// this process was stopped ([`super::patience`]). Default 5 minutes.
    ///
    /// Why 5 minutes: within one process a rank that fails or panics aborts the others at
    /// once, so the timeout only decides how long a genuine hang (a stuck kernel, a rank
    /// stuck in user code, an MPI peer gone quiet) takes to become an error. It must not
    /// fire on a healthy run that is slow: a first step that JIT-compiles the kernels with
    /// NVRTC, a loaded machine, a peer process stopped on its own. For comparison, NCCL
    /// waits forever (a timeout is the caller's job); PyTorch gives NCCL process groups 10
    /// minutes and gloo ones 30; gloo alone defaults to 30 s. Pauses of the whole process
    /// (Ctrl-Z, `kill -STOP`, a paused VM) are left out of the count, so they need no
    /// margin here.
    pub timeout: Duration,
    /// Pipelining granularity of ring and tree, in bytes.
    pub slice_bytes: usize,
    /// Largest in-place one-shot (it needs a scratch copy of the buffer), in bytes.
    pub oneshot_max_bytes: usize,
    /// How `auto` picks an algorithm.
    pub cost: CostModel,
}

impl CommConfig {
    /// This configuration with its timeout scaled for the slowest of `devices`: emulated
    /// devices run kernels orders of magnitude slower than GPUs, and a peer still computing
    /// must not be taken for a dead one ([`CommDevice::slowdown`]).
    pub fn scaled_for<D: CommDevice>(mut self, devices: &[D]) -> CommConfig {
        let slowdown = devices.iter().map(|d| d.slowdown()).max().unwrap_or(1);
        self.timeout *= slowdown.max(1);
        self
    }
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            timeout: Duration::from_secs(300),
            slice_bytes: 256 << 10,
            oneshot_max_bytes: 4 << 20,
            cost: CostModel::default(),
        }
    }
}

/// What went wrong in a collective.
#[derive(Debug, Error)]
pub enum CommError {
    /// Ranks called different collectives (or with different arguments).
    #[error("rank {me}: rank {rank} called {theirs}, but this rank called {ours}")]
    Mismatch {
        /// The reporting rank.
        me: usize,
        /// The rank that differs.
        rank: usize,
        /// This rank's call.
        ours: String,
        /// The other rank's call.
        theirs: String,
    },
    /// A peer did not progress within the timeout.
    #[error("rank {me}: timed out after {seconds:.1} s waiting for rank {peer} ({what})")]
    Timeout {
        /// The reporting rank.
        me: usize,
        /// Who it waited for.
        peer: usize,
        /// What it waited for.
        what: String,
        /// How long.
        seconds: f64,
    },
    /// A collective with no single peer to blame (all ranks must join) did not complete.
    #[error("rank {me}: timed out after {seconds:.1} s waiting for {what}; a rank has stopped or never called it")]
    TimeoutAll {
        /// The reporting rank.
        me: usize,
        /// What it waited for.
        what: String,
        /// How long.
        seconds: f64,
    },
    /// A peer dropped its handle.
    #[error("rank {me}: rank {peer} left the communicator before finishing this collective")]
    PeerGone {
        /// The reporting rank.
        me: usize,
        /// The rank that left.
        peer: usize,
    },
    /// The communicator was aborted by an earlier failure and is no longer usable (a
    /// program that wants to go on creates a new one).
    #[error("rank {me}: the communicator is aborted ({reason})")]
    Aborted {
        /// The reporting rank.
        me: usize,
        /// The first failure.
        reason: String,
        /// Whether that failure was a timeout.
        timed_out: bool,
    },
    /// The device failed.
    #[error("rank {me}: {source}")]
    Device {
        /// The reporting rank.
        me: usize,
        /// The device's error.
        #[source]
        source: BackendError,
    },
    /// Arguments no collective accepts.
    #[error("rank {me}: {detail}")]
    Invalid {
        /// The reporting rank.
        me: usize,
        /// What is wrong.
        detail: String,
    },
}

impl CommError {
    /// Whether this is a timeout, or an abort that a timeout caused: a peer too slow or
    /// gone quiet, or a pause longer than the timeout that this process could not see.
    pub fn is_timeout(&self) -> bool {
        match self {
            CommError::Timeout { .. } | CommError::TimeoutAll { .. } => true,
            CommError::Aborted { timed_out, .. } => *timed_out,
            _ => false,
        }
    }
}

type Kind = agreement::Kind<Algorithm>;

/// One rank's call, as announced to the others: what every rank must agree on, and where
/// this rank's buffers are.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Announce {
    call: Call<Algorithm>,
    /// Input, Output, Scratch base addresses.
    bases: [u64; 3],
    /// This rank's vote ([`Rank::any`]), not compared.
    vote: bool,
}

struct Shared {
    n: usize,
    config: CommConfig,
    /// Each rank's progress flag and doorbell.
    signals: Vec<Signal>,
    slots: Vec<Mutex<[Option<Announce>; 2]>>,
    departed: Vec<AtomicBool>,
    aborted: AtomicBool,
    /// The first failure, and whether it was a timeout.
    reason: Mutex<Option<(String, bool)>>,
}

impl Shared {
    fn abort(&self, reason: String, timed_out: bool) {
        {
            let mut r = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
            if r.is_none() {
                *r = Some((reason, timed_out));
            }
        }
        self.aborted.store(true, Ordering::SeqCst);
        for signal in &self.signals {
            signal.wake();
        }
    }

    fn reason(&self) -> (String, bool) {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| ("unknown".into(), false))
    }
}

/// One rank's marks ([`Memory::Mark`](crate::backend::Memory::Mark)), by the parity of the collective's number and the
/// flag value each stands for (mark k: the flag at `1 + k`). Grown by its owner as
/// schedules need, read by peers.
struct Marks<M> {
    by_parity: [Mutex<Vec<M>>; 2],
}

impl<M> Default for Marks<M> {
    fn default() -> Self {
        Marks {
            by_parity: [Mutex::new(Vec::new()), Mutex::new(Vec::new())],
        }
    }
}

/// Creates the ranks of a communicator over `devices` (rank i drives device i). Move each
/// rank to its own thread; every rank must call the same collectives in the same order.
pub fn communicator<D: CommDevice>(
    devices: Vec<D>,
    config: CommConfig,
) -> Result<Vec<Rank<D>>, CommError> {
    let n = devices.len();
    if n == 0 || n > MAX_RANKS {
        return Err(CommError::Invalid {
            me: 0,
            detail: format!("a communicator needs 1 to {MAX_RANKS} devices, got {n}"),
        });
    }
    let shared = Arc::new(Shared {
        n,
        config: config.scaled_for(&devices),
        signals: (0..n).map(|_| Signal::default()).collect(),
        slots: (0..n).map(|_| Mutex::new([None, None])).collect(),
        departed: (0..n).map(|_| AtomicBool::new(false)).collect(),
        aborted: AtomicBool::new(false),
        reason: Mutex::new(None),
    });
    let states = devices
        .iter()
        .enumerate()
        .map(|(rank, device)| {
            device
                .comm_state(&devices)
                .map_err(|source| CommError::Device { me: rank, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let oversubscribed = n > std::thread::available_parallelism().map_or(1, |c| c.get());
    let marks: Arc<Vec<Marks<D::Mark>>> = Arc::new((0..n).map(|_| Marks::default()).collect());
    Ok(devices
        .into_iter()
        .zip(states)
        .enumerate()
        .map(|(rank, (device, state))| Rank {
            shared: shared.clone(),
            rank,
            device,
            state,
            marks: marks.clone(),
            scratch: None,
            seq: 0,
            busy: false,
            oversubscribed,
            schedules: HashMap::new(),
        })
        .collect())
}

type ScheduleKey = (Kind, usize, bool);

/// One rank of a communicator: its device and its side of every collective.
pub struct Rank<D: CommDevice> {
    shared: Arc<Shared>,
    rank: usize,
    device: D,
    state: D::State,
    /// Every rank's marks (this rank's at `rank`).
    marks: Arc<Vec<Marks<D::Mark>>>,
    scratch: Option<D::Buffer<u64>>,
    seq: u64,
    busy: bool,
    oversubscribed: bool,
    schedules: HashMap<ScheduleKey, Arc<Schedule>>,
}

impl<D: CommDevice> Drop for Rank<D> {
    fn drop(&mut self) {
        self.shared.departed[self.rank].store(true, Ordering::SeqCst);
        if self.busy {
            // Unwinding out of a collective (a panic, or a device error we could not report):
            // the others must not wait for steps that will never come.
            self.shared.abort(
                format!(
                    "rank {} left in the middle of collective #{}",
                    self.rank, self.seq
                ),
                false,
            );
        } else {
            for signal in &self.shared.signals {
                signal.ring();
            }
        }
    }
}

impl<D: CommDevice> Rank<D> {
    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.shared.n
    }

    /// The device this rank drives.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// What `auto` would pick for `count` elements of `T`.
    pub fn auto_algorithm<T: Precision>(&self, count: usize) -> Algorithm {
        self.shared
            .config
            .cost
            .choose(self.shared.n, count * T::DTYPE.size())
    }

    /// Sums (or averages) `buf` across ranks, in place. `algorithm: None` picks by size.
    ///
    /// A collective is queued, not waited for. The peers' reads of `buf` run after the
    /// work queued on this rank's device handle before the call; the work queued on it
    /// after the call runs after the whole collective (the peers' part in it included).
    /// A buffer produced through another handle with its own queue
    /// ([`Memory::fork`](crate::backend::Memory::fork)) must be ordered first: make this
    /// rank's handle wait for a mark recorded there ([`Memory::wait_mark`](crate::backend::Memory::wait_mark)). Read the result
    /// from another handle the same way, or download it (which waits).
    pub fn all_reduce<T: Precision>(
        &mut self,
        buf: &mut D::Buffer<T>,
        op: ReduceOp,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CommError> {
        let count = buf.len();
        let algo = algorithm.unwrap_or_else(|| self.auto_algorithm::<T>(count));
        let addr = buf.device_addr();
        self.run(Kind::AllReduce(algo, op), T::DTYPE, count, true, addr, addr)
    }

    /// Sums (or averages) `src` across ranks into `dst` (same length).
    pub fn all_reduce_into<T: Precision>(
        &mut self,
        src: &D::Buffer<T>,
        dst: &mut D::Buffer<T>,
        op: ReduceOp,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CommError> {
        self.expect(src.len() == dst.len(), || {
            format!(
                "all_reduce_into: src has {} elements, dst {}",
                src.len(),
                dst.len()
            )
        })?;
        let algo = algorithm.unwrap_or_else(|| self.auto_algorithm::<T>(src.len()));
        self.run_out_of_place(Kind::AllReduce(algo, op), src.len(), src, dst)
    }

    /// Rank r's `dst` (count elements) = the reduction over ranks of block r of `src` (size·count).
    pub fn reduce_scatter<T: Precision>(
        &mut self,
        src: &D::Buffer<T>,
        dst: &mut D::Buffer<T>,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.expect_n_times("reduce_scatter", ("src", src.len()), ("dst", dst.len()))?;
        self.run_out_of_place(Kind::ReduceScatter(op), dst.len(), src, dst)
    }

    /// Every rank's `dst` (size·count) = all ranks' `src` (count each), in rank order.
    pub fn all_gather<T: Precision>(
        &mut self,
        src: &D::Buffer<T>,
        dst: &mut D::Buffer<T>,
    ) -> Result<(), CommError> {
        self.expect_n_times("all_gather", ("dst", dst.len()), ("src", src.len()))?;
        self.run_out_of_place(Kind::AllGather, src.len(), src, dst)
    }

    /// Copies `root`'s `buf` into every other rank's `buf`.
    pub fn broadcast<T: Precision>(
        &mut self,
        buf: &mut D::Buffer<T>,
        root: usize,
    ) -> Result<(), CommError> {
        self.expect(root < self.shared.n, || {
            format!(
                "broadcast: root {root} is not a rank (size {})",
                self.shared.n
            )
        })?;
        let addr = buf.device_addr();
        self.run(Kind::Broadcast(root), T::DTYPE, buf.len(), true, addr, addr)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&mut self) -> Result<(), CommError> {
        self.run(Kind::Barrier, DType::F32, 0, false, 0, 0)
    }

    /// Whether `flag` is true on any rank: a [`barrier`](Self::barrier) whose announces
    /// carry each rank's flag, so every rank gets the same answer from the same call. The
    /// ranks' threads exchange it; no device work is involved.
    pub fn any(&mut self, flag: bool) -> Result<bool, CommError> {
        self.run_voting(Kind::Barrier, DType::F32, 0, false, (0, 0), flag)
    }

    fn expect(&self, ok: bool, detail: impl FnOnce() -> String) -> Result<(), CommError> {
        if ok {
            Ok(())
        } else {
            Err(CommError::Invalid {
                me: self.rank,
                detail: detail(),
            })
        }
    }

    /// Checks that a collective's (`call`'s) buffer `whole` holds one `part` per rank; each
    /// is a name and an element count.
    fn expect_n_times(
        &self,
        call: &str,
        (whole, whole_len): (&str, usize),
        (part, part_len): (&str, usize),
    ) -> Result<(), CommError> {
        let n = self.shared.n;
        self.expect(whole_len == part_len * n, || {
            format!("{call}: {whole} must hold {n} x {part} ({part_len}), has {whole_len}")
        })
    }

    /// [`run`](Self::run)s a collective from `src` into another buffer, `dst`.
    fn run_out_of_place<T: Precision>(
        &mut self,
        kind: Kind,
        count: usize,
        src: &D::Buffer<T>,
        dst: &D::Buffer<T>,
    ) -> Result<(), CommError> {
        let (input, output) = (src.device_addr(), dst.device_addr());
        self.run(kind, T::DTYPE, count, false, input, output)
    }

    fn schedule(
        &mut self,
        kind: Kind,
        count: usize,
        in_place: bool,
        esize: usize,
    ) -> Arc<Schedule> {
        let n = self.shared.n;
        let slice = (self.shared.config.slice_bytes / esize).max(1);
        self.schedules
            .entry((kind, count, in_place))
            .or_insert_with(|| {
                Arc::new(match kind {
                    Kind::AllReduce(algo, _) => {
                        schedule::all_reduce(algo, n, count, slice, in_place)
                    }
                    Kind::ReduceScatter(_) => schedule::reduce_scatter(n, count),
                    Kind::AllGather => schedule::all_gather(n, count),
                    Kind::Broadcast(root) => schedule::broadcast(n, count, root, in_place),
                    Kind::Barrier => schedule::barrier(n),
                })
            })
            .clone()
    }

    fn run(
        &mut self,
        kind: Kind,
        dtype: DType,
        count: usize,
        in_place: bool,
        input: u64,
        output: u64,
    ) -> Result<(), CommError> {
        self.run_voting(kind, dtype, count, in_place, (input, output), false)
            .map(|_| ())
    }

    /// Runs a collective on `input` and `output` with this rank's `vote`; returns whether
    /// any rank voted.
    fn run_voting(
        &mut self,
        kind: Kind,
        dtype: DType,
        count: usize,
        in_place: bool,
        (input, output): (u64, u64),
        vote: bool,
    ) -> Result<bool, CommError> {
        let me = self.rank;
        if self.shared.aborted.load(Ordering::SeqCst) {
            let (reason, timed_out) = self.shared.reason();
            return Err(CommError::Aborted {
                me,
                reason,
                timed_out,
            });
        }
        let esize = dtype.size();
        let sched = self.schedule(kind, count, in_place, esize);
        if sched.scratch * esize > self.shared.config.oneshot_max_bytes {
            return Err(CommError::Invalid {
                me,
                detail: format!(
                    "one-shot in place needs a scratch copy of the buffer: {} bytes is over the {} byte limit; use it out of place, or another algorithm",
                    sched.scratch * esize,
                    self.shared.config.oneshot_max_bytes
                ),
            });
        }
        let scratch = if sched.scratch > 0 {
            ensure_scratch(&self.device, &mut self.scratch, sched.scratch * esize)
                .map_err(|source| CommError::Device { me, source })?
        } else {
            0
        };
        self.seq += 1;
        let seq = self.seq;
        let ours = Announce {
            call: Call {
                seq,
                kind,
                dtype,
                count,
                in_place,
            },
            bases: [input, output, scratch],
            vote,
        };
        self.busy = true;
        let result = self.announce_and_execute(&sched, ours);
        self.busy = false;
        if let Err(e) = &result {
            if !matches!(e, CommError::Aborted { .. }) {
                self.shared.abort(e.to_string(), e.is_timeout());
            }
        }
        result
    }

    /// Records the mark for flag `value` after the work queued so far, then raises this
    /// rank's flag to it.
    fn publish(&self, value: u64) -> Result<(), CommError> {
        let me = self.rank;
        let (parity, k) = Self::mark_of(value);
        let mut marks = self.marks[me].by_parity[parity]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while marks.len() <= k {
            marks.push(
                self.device
                    .new_mark()
                    .map_err(|source| CommError::Device { me, source })?,
            );
        }
        self.device
            .record(&marks[k])
            .map_err(|source| CommError::Device { me, source })?;
        drop(marks);
        self.shared.signals[me].raise(value);
        Ok(())
    }

    /// Which mark stands for flag `value`: the collective's parity, and the index.
    fn mark_of(value: u64) -> (usize, usize) {
        let seq = value >> 32;
        let low = value & 0xffff_ffff;
        ((seq % 2) as usize, low.saturating_sub(1) as usize)
    }

    /// Waits until `peer`'s flag reaches `target`, then orders this rank's queue after the
    /// work the peer queued before raising it (its mark).
    fn wait_for(
        &self,
        peer: usize,
        target: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), CommError> {
        self.wait_for_flag(peer, target, what)?;
        let me = self.rank;
        let (parity, k) = Self::mark_of(target);
        let marks = self.marks[peer].by_parity[parity]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(mark) = marks.get(k) else {
            return Err(CommError::Invalid {
                me,
                detail: format!("rank {peer} raised its flag to {target:#x} without its mark"),
            });
        };
        self.device
            .wait_mark(mark)
            .map_err(|source| CommError::Device { me, source })
    }

    /// Waits until `peer`'s flag reaches `target` ([`Signal::wait_for`]).
    fn wait_for_flag(
        &self,
        peer: usize,
        target: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), CommError> {
        let sh = &*self.shared;
        let me = self.rank;
        sh.signals[peer]
            .wait_for(
                target,
                &sh.aborted,
                &sh.departed[peer],
                sh.config.timeout,
                self.oversubscribed,
            )
            .map_err(|end| match end {
                WaitEnd::Aborted => {
                    let (reason, timed_out) = sh.reason();
                    CommError::Aborted {
                        me,
                        reason,
                        timed_out,
                    }
                }
                WaitEnd::Departed => CommError::PeerGone { me, peer },
                WaitEnd::TimedOut(waited) => CommError::Timeout {
                    me,
                    peer,
                    what: what(),
                    seconds: waited.as_secs_f64(),
                },
            })
    }

    fn announce_and_execute(
        &mut self,
        sched: &Schedule,
        ours: Announce,
    ) -> Result<bool, CommError> {
        let (me, n, seq) = (self.rank, self.shared.n, ours.call.seq);
        let hi = seq << 32;
        self.shared.slots[me]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[(seq % 2) as usize] = Some(ours);
        self.publish(hi | 1)?;
        let mut bases = vec![[0u64; 3]; n];
        let mut voted = ours.vote;
        for (p, base) in bases.iter_mut().enumerate() {
            if p != me {
                self.wait_for(p, hi | 1, &|| format!("its call of collective #{seq}"))?;
            }
            let theirs = self.shared.slots[p]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)[(seq % 2) as usize];
            let Some(theirs) = theirs.filter(|t| t.call.seq == seq) else {
                return Err(CommError::Invalid {
                    me,
                    detail: format!("rank {p} announced no collective #{seq}"),
                });
            };
            if theirs.call != ours.call {
                return Err(CommError::Mismatch {
                    me,
                    rank: p,
                    ours: ours.call.describe(),
                    theirs: theirs.call.describe(),
                });
            }
            *base = theirs.bases;
            voted |= theirs.vote;
        }
        let index = |b: Buffer| match b {
            Buffer::Input => 0,
            Buffer::Output => 1,
            Buffer::Scratch => 2,
        };
        let esize = ours.call.dtype.size() as u64;
        let (mut sources, mut dsts) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (i, step) in sched.steps[me].iter().enumerate() {
            for &(p, k) in &step.waits {
                self.wait_for(p, hi | (1 + k as u64), &|| {
                    format!("its step {k} of collective #{seq}")
                })?;
            }
            if step.len > 0 {
                sources.clear();
                sources.extend(
                    step.sources
                        .iter()
                        .map(|o| bases[o.rank][index(o.buffer)] + o.offset as u64 * esize),
                );
                dsts.clear();
                dsts.extend(
                    step.dsts
                        .iter()
                        .map(|o| bases[o.rank][index(o.buffer)] + o.offset as u64 * esize),
                );
                // SAFETY: the schedule is verified race-free (tests/schedules.rs): while this
                // step runs nobody writes its sources or touches its destinations, and every
                // address lies inside a buffer its owner handed to this collective (lengths
                // agreed in the announce).
                let step = Reduction {
                    dtype: ours.call.dtype,
                    dsts: &dsts,
                    sources: &sources,
                    len: step.len,
                    scale: 1.0,
                };
                unsafe { self.device.reduce(&mut self.state, step) }
                    .map_err(|source| CommError::Device { me, source })?;
            }
            self.publish(hi | (2 + i as u64))?;
        }
        for &(p, k) in &sched.final_waits[me] {
            self.wait_for(p, hi | (1 + k as u64), &|| {
                format!("it to finish with this rank's buffers (collective #{seq})")
            })?;
        }
        let avg = matches!(
            ours.call.kind,
            Kind::AllReduce(_, ReduceOp::Avg) | Kind::ReduceScatter(ReduceOp::Avg)
        );
        if avg && ours.call.count > 0 && n > 1 {
            // Every peer is done with our output (drained): scale it where it lies.
            let out = bases[me][1];
            // SAFETY: our own output, `count` elements, no longer read by anyone.
            let average = Reduction {
                dtype: ours.call.dtype,
                dsts: &[out],
                sources: &[out],
                len: ours.call.count,
                scale: 1.0 / n as f32,
            };
            unsafe { self.device.reduce(&mut self.state, average) }
                .map_err(|source| CommError::Device { me, source })?;
        }
        Ok(voted)
    }
}
