//! Collectives (the NCCL layer): allreduce and friends, hand-rolled. The training loop
//! ([`crate::train`], the DDP layer) sees them only through [`collective::Collective`].
//!
//! * [`schedule`]: the algorithms (ring, double binary tree, direct two-shot, one-shot) as
//!   pure data: per rank, steps that read peers' memory and write their own.
//! * [`tree`]: the double binary tree.
//! * [`happens_before`]: the vector clocks of a schedule's waits, shared by the verifier and
//!   the lowering to messages.
//! * [`verify`]: proves a schedule race-free under every interleaving its waits allow and
//!   computes what it leaves in every rank's output.
//! * [`transport`]: how a backend moves a step's data (CPU loops over peer memory, or the
//!   `collective.cu` kernel dereferencing peer pointers).
//! * [`agreement`]: the typed descriptor of a call that ranks agree on before a collective,
//!   compared in process and exchanged as wire words over MPI.
//! * [`communicator`]: ranks, the announce/execute/drain protocol, timeouts and aborts.
//! * [`collective`]: the [`Collective`](collective::Collective) trait a trainer's rank
//!   implements (sum a device buffer over all ranks), and its impl for an in-process rank.
//! * [`messages`]: the same schedules as message programs (sends, receives, local steps)
//!   for ranks that share no memory, e.g. MPI processes.
//! * `mpi` (feature `mpi`): the schedules over MPI point-to-point, and MPI's own allreduce.
//! * `hierarchical` (feature `mpi`): a [`Collective`](collective::Collective) over MPI
//!   processes, each with several local devices: in process first, then across processes.
//! * [`wait`]: how a rank waits for a peer's progress flag (spin, yield, doorbell), with
//!   abort, departure and timeout.
//! * [`patience`]: timeouts that leave out the time this process was stopped.
//! * [`cost`]: the α-β cost model `auto` uses to pick an algorithm.
//! * [`picture`]: a schedule drawn as SVG (`nanoddp schedule --svg`).
//! * [`rank_threads`]: every rank on a thread of its own
//!   ([`on_each_rank`](rank_threads::on_each_rank), whose example is the shortest
//!   allreduce): each rank of a collective waits for the others.
pub mod agreement;
pub mod collective;
pub mod communicator;
pub mod cost;
pub mod happens_before;
#[cfg(feature = "mpi")]
pub mod hierarchical;
pub mod messages;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod patience;
pub mod picture;
pub mod rank_threads;
pub mod schedule;
pub mod transport;
pub mod tree;
pub mod verify;
pub mod wait;
