//! Ranks as MPI processes (feature `mpi`): nanoddp's own ring, tree, direct and one-shot
//! schedules run over MPI point-to-point messages ([`super::messages`] lowers them; the
//! reduction is done locally, in the same order and arithmetic as in process), and
//! [`MpiAlgorithm::Native`] calls the MPI library's own allreduce as the baseline.
//!
//! Guarantees, as in process: before every collective the ranks exchange a descriptor
//! (sequence number, count, type, operator, algorithm) and any disagreement is an error on
//! every rank naming the rank that differs; every wait polls with a deadline, so a rank that
//! died or never called gives a timeout error naming the peer instead of a hang; results are
//! bitwise identical on every rank. After an error the communicator refuses further work.
//!
//! Buffers are host slices: data on a GPU is staged through host memory by the caller (no
//! CUDA-aware MPI is assumed). MPI is initialized with `MPI_THREAD_SERIALIZED`: a
//! communicator may move between threads but is used by one at a time (`&mut self`).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::traits::Communicator;

use super::agreement::{AlgorithmCode, BadCode, Call, Kind as CallKind, WORDS};
use super::communicator::{CommConfig, CommError, ReduceOp};
use super::messages::{execute, lower, Program, Wire};
use super::patience::Patience;
use super::schedule::{all_reduce, Algorithm};
use crate::backend::Precision;

/// How an MPI allreduce is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MpiAlgorithm {
    /// One of nanoddp's schedules, as messages.
    Schedule(Algorithm),
    /// The MPI library's `MPI_Iallreduce` (f16 and bf16 are widened to f32 for it and rounded
    /// once).
    Native,
}

impl MpiAlgorithm {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            MpiAlgorithm::Schedule(a) => a.name(),
            MpiAlgorithm::Native => "mpi",
        }
    }
}

impl AlgorithmCode for MpiAlgorithm {
    fn code(self) -> u64 {
        match self {
            MpiAlgorithm::Schedule(a) => a.code(),
            MpiAlgorithm::Native => 99,
        }
    }
    fn from_code(code: u64) -> Option<Self> {
        match code {
            99 => Some(MpiAlgorithm::Native),
            code => Algorithm::from_code(code).map(MpiAlgorithm::Schedule),
        }
    }
    fn name(self) -> &'static str {
        MpiAlgorithm::name(self)
    }
}

/// MPI itself, initialized for this process (finalized when dropped: keep it alive as long
/// as any [`MpiComm`]).
pub struct Mpi {
    universe: mpi::environment::Universe,
}

impl Mpi {
    /// Initializes MPI (`MPI_THREAD_SERIALIZED`). Fails if MPI was initialized already or
    /// the library cannot give serialized threading.
    pub fn init() -> Result<Mpi, String> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or("MPI is already initialized in this process")?;
        if threading < mpi::Threading::Serialized {
            return Err(format!(
                "the MPI library offers only {threading:?} threading; nanoddp needs Serialized"
            ));
        }
        Ok(Mpi { universe })
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub fn rank(&self) -> usize {
        self.universe.world().rank() as usize
    }

    /// Processes in `MPI_COMM_WORLD`.
    pub fn size(&self) -> usize {
        self.universe.world().size() as usize
    }

    /// This process's rank among the processes on its own node, and how many there are
    /// (`MPI_Comm_split_type` with `MPI_COMM_TYPE_SHARED`): which GPUs a process takes on a
    /// multi-GPU node.
    pub fn node_slot(&self) -> (usize, usize) {
        let node = self.universe.world().split_shared(self.rank() as c_int);
        (node.rank() as usize, node.size() as usize)
    }

    /// A communicator over `MPI_COMM_WORLD`.
    pub fn world(&self, config: CommConfig) -> MpiComm {
        let world = self.universe.world();
        MpiComm {
            comm: world.as_raw(),
            me: world.rank() as usize,
            n: world.size() as usize,
            config,
            seq: 0,
            programs: HashMap::new(),
            aborted: None,
        }
    }
}

/// One process's handle on a group of MPI ranks.
pub struct MpiComm {
    comm: ffi::MPI_Comm,
    me: usize,
    n: usize,
    config: CommConfig,
    seq: u64,
    programs: HashMap<(Algorithm, usize, bool), Arc<Program>>,
    aborted: Option<(String, bool)>,
}

// SAFETY: the handle is an opaque MPI communicator; MPI runs in MPI_THREAD_SERIALIZED mode,
// which allows calls from any thread as long as they do not overlap, and every call goes
// through `&mut self`.
unsafe impl Send for MpiComm {}

const TAG_UB: u32 = 32767; // the least MPI_TAG_UB the standard allows

impl MpiComm {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Ranks.
    pub fn size(&self) -> usize {
        self.n
    }

    /// What `auto` picks for `bytes` (the in-process cost model).
    pub fn auto_algorithm(&self, bytes: usize) -> Algorithm {
        self.config.cost.choose(self.n, bytes)
    }

    /// Reduces `buf` across the ranks, in place. `None` picks a schedule by size.
    pub fn all_reduce<T: Precision>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        algorithm: Option<MpiAlgorithm>,
    ) -> Result<(), CommError> {
        self.checked(None, buf, op, algorithm)
    }

    /// Reduces `src` across the ranks into `dst` (same length), leaving `src` untouched.
    pub fn all_reduce_into<T: Precision>(
        &mut self,
        src: &[T],
        dst: &mut [T],
        op: ReduceOp,
        algorithm: Option<MpiAlgorithm>,
    ) -> Result<(), CommError> {
        if src.len() != dst.len() {
            return Err(CommError::Invalid {
                me: self.me,
                detail: format!(
                    "all_reduce_into: src has {} elements, dst {}",
                    src.len(),
                    dst.len()
                ),
            });
        }
        self.checked(Some(src), dst, op, algorithm)
    }

    fn checked<T: Precision>(
        &mut self,
        input: Option<&[T]>,
        buf: &mut [T],
        op: ReduceOp,
        algorithm: Option<MpiAlgorithm>,
    ) -> Result<(), CommError> {
        let me = self.me;
        if let Some((reason, timed_out)) = &self.aborted {
            return Err(CommError::Aborted {
                me,
                reason: reason.clone(),
                timed_out: *timed_out,
            });
        }
        let algo = algorithm.unwrap_or_else(|| {
            MpiAlgorithm::Schedule(self.auto_algorithm(std::mem::size_of_val(buf)))
        });
        let result = self.run(input, buf, op, algo);
        if let Err(e) = &result {
            self.aborted = Some((e.to_string(), e.is_timeout()));
        }
        result
    }

    fn run<T: Precision>(
        &mut self,
        input: Option<&[T]>,
        buf: &mut [T],
        op: ReduceOp,
        algo: MpiAlgorithm,
    ) -> Result<(), CommError> {
        self.seq += 1;
        let in_place = input.is_none();
        self.agree(Call {
            seq: self.seq,
            kind: CallKind::AllReduce(algo, op),
            dtype: T::DTYPE,
            count: buf.len(),
            in_place,
        })?;
        let scale = match op {
            ReduceOp::Sum => 1.0,
            ReduceOp::Avg => 1.0 / self.n as f32,
        };
        match algo {
            MpiAlgorithm::Native => self.native(input, buf, scale),
            MpiAlgorithm::Schedule(a) => {
                let slice = (self.config.slice_bytes / size_of::<T>()).max(1);
                let key = (a, buf.len(), in_place);
                let program = match self.programs.get(&key) {
                    Some(p) => p.clone(),
                    None => {
                        let p = lower(&all_reduce(a, self.n, buf.len(), slice, in_place), in_place)
                            .map_err(|detail| CommError::Invalid {
                                me: self.me,
                                detail,
                            })?;
                        let p = Arc::new(p);
                        self.programs.insert(key, p.clone());
                        p
                    }
                };
                let mut wire = MpiWire::new(self.comm, self.me, self.config.timeout);
                let result = execute(&program, self.me, input, buf, scale, &mut wire);
                wire.abandon_if(result.is_err());
                result
            }
        }
    }

    /// Every rank contributes its `call`; all must be equal (else an error on every rank).
    fn agree(&mut self, call: Call<MpiAlgorithm>) -> Result<(), CommError> {
        let desc = call.encode();
        let mine: Vec<u8> = bytemuck::cast_slice(&desc).to_vec();
        let mut all = vec![0u8; mine.len() * self.n];
        let mut req = null_request();
        // SAFETY: both buffers outlive the request (completed or leaked below); counts match
        // their lengths; the communicator is live.
        check(self.me, "MPI_Iallgather", unsafe {
            ffi::MPI_Iallgather(
                mine.as_ptr().cast(),
                mine.len() as c_int,
                ffi::RSMPI_UINT8_T,
                all.as_mut_ptr().cast(),
                mine.len() as c_int,
                ffi::RSMPI_UINT8_T,
                self.comm,
                &mut req,
            )
        })?;
        let (mine, all) = self.wait_collective(&mut req, (mine, all), || {
            format!("every rank to start collective #{}", self.seq)
        })?;
        drop(mine);
        let theirs: Vec<u64> = bytemuck::pod_collect_to_vec(&all);
        for (rank, d) in theirs.chunks(WORDS).enumerate() {
            if d != desc {
                let theirs = <[u64; WORDS]>::try_from(d)
                    .map_err(|_| BadCode {
                        field: "length",
                        code: d.len() as u64,
                    })
                    .and_then(|words| Call::<MpiAlgorithm>::decode(&words))
                    .map_or_else(|bad| bad.to_string(), |c| c.describe());
                return Err(CommError::Mismatch {
                    me: self.me,
                    rank,
                    ours: call.describe(),
                    theirs,
                });
            }
        }
        Ok(())
    }

    /// Waits for a non-blocking collective whose buffers are `buffers`, and hands them back.
    /// On timeout MPI may still write into them (a collective cannot be cancelled), so they
    /// are leaked, never freed.
    fn wait_collective<B>(
        &self,
        req: &mut ffi::MPI_Request,
        buffers: B,
        what: impl FnOnce() -> String,
    ) -> Result<B, CommError> {
        if poll(
            req,
            self.me,
            &mut Patience::new(self.config.timeout),
            Kind::Collective,
        )?
        .is_some()
        {
            return Ok(buffers);
        }
        std::mem::forget(buffers);
        Err(CommError::TimeoutAll {
            me: self.me,
            what: what(),
            seconds: self.config.timeout.as_secs_f64(),
        })
    }

    fn native<T: Precision>(
        &mut self,
        input: Option<&[T]>,
        buf: &mut [T],
        scale: f32,
    ) -> Result<(), CommError> {
        if buf.is_empty() {
            return Ok(());
        }
        let send: Vec<f32> = input.unwrap_or(buf).iter().map(|v| v.to_f32()).collect();
        let mut recv = vec![0.0f32; buf.len()];
        let count = int_count(self.me, buf.len(), || format!("{} elements", buf.len()))?;
        let mut req = null_request();
        // SAFETY: both buffers hold `count` floats and outlive the request (completed, or
        // leaked on timeout below); the communicator is live.
        check(self.me, "MPI_Iallreduce", unsafe {
            ffi::MPI_Iallreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                count,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                self.comm,
                &mut req,
            )
        })?;
        let (send, recv) =
            self.wait_collective(&mut req, (send, recv), || "MPI_Iallreduce".to_string())?;
        drop(send);
        for (b, v) in buf.iter_mut().zip(&recv) {
            *b = T::from_f32(v * scale);
        }
        Ok(())
    }
}

/// A request handle for MPI to fill in.
fn null_request() -> ffi::MPI_Request {
    // SAFETY: reads a constant the MPI library initializes when it is loaded.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// `len` as MPI's element count (an int), or an error saying that `what` is too large.
fn int_count(me: usize, len: usize, what: impl FnOnce() -> String) -> Result<c_int, CommError> {
    c_int::try_from(len).map_err(|_| CommError::Invalid {
        me,
        detail: format!("{} is over MPI's int count", what()),
    })
}

fn check(me: usize, call: &str, code: c_int) -> Result<(), CommError> {
    if code == 0 {
        Ok(())
    } else {
        Err(CommError::Invalid {
            me,
            detail: format!("{call} failed with MPI error code {code}"),
        })
    }
}

/// What a request is, for what may be done with it on timeout.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Point-to-point: cancelled on timeout.
    PointToPoint,
    /// Collective: MPI cannot cancel these; left pending.
    Collective,
}

/// Tests `req` until it completes (`Some(status)`) or `patience` runs out (`None`: then it is
/// cancelled if it can be, and the caller must never free the request's buffers).
fn poll(
    req: &mut ffi::MPI_Request,
    me: usize,
    patience: &mut Patience,
    kind: Kind,
) -> Result<Option<ffi::MPI_Status>, CommError> {
    let mut spins = 0u32;
    loop {
        let mut flag: c_int = 0;
        // SAFETY: an all-zero MPI_Status is a valid out-parameter (plain C struct).
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: `req` is a live request from this process; flag and status are valid.
        check(me, "MPI_Test", unsafe {
            ffi::MPI_Test(req, &mut flag, &mut status)
        })?;
        if flag != 0 {
            return Ok(Some(status));
        }
        if patience.expired() {
            if kind == Kind::PointToPoint {
                // SAFETY: cancelling a pending point-to-point request is allowed; it stays
                // incomplete (its buffers are leaked by the caller).
                unsafe { ffi::MPI_Cancel(req) };
            }
            return Ok(None);
        }
        spins += 1;
        if spins > 64 {
            std::thread::yield_now();
        }
    }
}

/// An MPI call that starts a point-to-point transfer (`MPI_Isend`, `MPI_Irecv`: the same
/// parameters, but for the buffer pointer's type `P`), with its name for error messages.
struct PointToPoint<P> {
    name: &'static str,
    start: unsafe extern "C" fn(
        P,
        c_int,
        ffi::MPI_Datatype,
        c_int,
        c_int,
        ffi::MPI_Comm,
        *mut ffi::MPI_Request,
    ) -> c_int,
}

const ISEND: PointToPoint<*const c_void> = PointToPoint {
    name: "MPI_Isend",
    start: ffi::MPI_Isend,
};

const IRECV: PointToPoint<*mut c_void> = PointToPoint {
    name: "MPI_Irecv",
    start: ffi::MPI_Irecv,
};

/// The message programs' wire over MPI point-to-point (bytes, tags per sender).
struct MpiWire {
    comm: ffi::MPI_Comm,
    me: usize,
    timeout: Duration,
    sends: Vec<(ffi::MPI_Request, Vec<u8>, usize)>,
}

impl MpiWire {
    fn new(comm: ffi::MPI_Comm, me: usize, timeout: Duration) -> Self {
        MpiWire {
            comm,
            me,
            timeout,
            sends: Vec::new(),
        }
    }

    /// After an error, pending sends may still read their buffers: leak them.
    fn abandon_if(&mut self, failed: bool) {
        if failed {
            for s in self.sends.drain(..) {
                std::mem::forget(s.1);
            }
        }
    }

    /// Starts `call` ([`ISEND`] or [`IRECV`]) on the `len` bytes at `bytes` with `peer`, as
    /// message `tag`; returns its request.
    ///
    /// # Safety
    /// The `len` bytes at `bytes` must stay readable (a send) or writable (a receive), and not
    /// move, until the request completes; on a timeout they must be leaked, never freed.
    unsafe fn start<P>(
        &self,
        call: PointToPoint<P>,
        bytes: P,
        len: usize,
        peer: usize,
        tag: u32,
    ) -> Result<ffi::MPI_Request, CommError> {
        let count = int_count(self.me, len, || format!("a {len} byte message"))?;
        let mut req = null_request();
        // SAFETY: `bytes` holds `count` bytes for as long as the request runs (the caller's
        // contract); the communicator is live.
        check(self.me, call.name, unsafe {
            (call.start)(
                bytes,
                count,
                ffi::RSMPI_UINT8_T,
                peer as c_int,
                tag as c_int,
                self.comm,
                &mut req,
            )
        })?;
        Ok(req)
    }

    fn timed_out(&self, peer: usize, what: String) -> CommError {
        CommError::Timeout {
            me: self.me,
            peer,
            what,
            seconds: self.timeout.as_secs_f64(),
        }
    }
}

impl Wire for MpiWire {
    fn send(&mut self, to: usize, tag: u32, bytes: Vec<u8>) -> Result<(), CommError> {
        if tag > TAG_UB {
            return Err(CommError::Invalid {
                me: self.me,
                detail: format!(
                    "message {tag} to rank {to}: over MPI's tag limit; use a larger slice"
                ),
            });
        }
        // SAFETY: `bytes` moves into `self.sends` with the request and stays alive (its heap
        // buffer does not move) until the request completes in `finish`, or is leaked.
        let req = unsafe { self.start(ISEND, bytes.as_ptr().cast(), bytes.len(), to, tag)? };
        self.sends.push((req, bytes, to));
        Ok(())
    }

    fn recv(&mut self, from: usize, tag: u32, len: usize) -> Result<Vec<u8>, CommError> {
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` holds `len` bytes and outlives the request (completed below, or
        // leaked on timeout).
        let mut req = unsafe { self.start(IRECV, buf.as_mut_ptr().cast(), len, from, tag)? };
        match poll(
            &mut req,
            self.me,
            &mut Patience::new(self.timeout),
            Kind::PointToPoint,
        )? {
            Some(status) => {
                let mut got: c_int = 0;
                // SAFETY: `status` was filled by MPI_Test for this completed receive.
                unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut got) };
                if got as usize != len {
                    return Err(CommError::Invalid {
                        me: self.me,
                        detail: format!(
                            "message {tag} from rank {from} has {got} bytes, expected {len}"
                        ),
                    });
                }
                Ok(buf)
            }
            None => {
                std::mem::forget(buf);
                Err(self.timed_out(from, format!("message {tag} of this collective")))
            }
        }
    }

    fn finish(&mut self) -> Result<(), CommError> {
        let mut patience = Patience::new(self.timeout);
        while let Some((mut req, bytes, to)) = self.sends.pop() {
            if poll(&mut req, self.me, &mut patience, Kind::PointToPoint)?.is_none() {
                std::mem::forget(bytes);
                return Err(self.timed_out(to, "a peer to receive this rank's data".into()));
            }
        }
        Ok(())
    }
}
