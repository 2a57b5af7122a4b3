//! Collectives: allreduce and friends, hand-rolled.
//!
//! * [`schedule`]: the algorithms (ring, double binary tree, direct two-shot, one-shot) as
//!   pure data: per rank, steps that read peers' memory and write their own.
//! * [`tree`]: the double binary tree.
//! * [`verify`]: proves a schedule race-free under every interleaving its waits allow and
//!   computes what it leaves in every rank's output.
//! * [`transport`]: how a backend moves a step's data (CPU loops over peer memory, or the
//!   `collective.cu` kernel dereferencing peer pointers).
//! * [`communicator`]: ranks, the announce/execute/drain protocol, timeouts and aborts.
//! * [`messages`]: the same schedules as message programs (sends, receives, local steps)
//!   for ranks that share no memory, e.g. MPI processes.
//! * `mpi` (feature `mpi`): the schedules over MPI point-to-point, and MPI's own allreduce.
//! * [`patience`]: timeouts that leave out the time this process was stopped.
//! * [`model`]: the α-β model `auto` uses to pick an algorithm.
//! * [`picture`]: a schedule drawn as SVG (`nanoddp schedule --svg`).
//!
//! ```
//! use nanoddp::backend::{cpu::CpuDevice, Memory};
//! use nanoddp::comm::communicator::{communicator, CommConfig, ReduceOp};
//!
//! let ranks = communicator(vec![CpuDevice::new(); 3], CommConfig::default())?;
//! let handles: Vec<_> = ranks
//!     .into_iter()
//!     .map(|mut rank| {
//!         std::thread::spawn(move || {
//!             let dev = *rank.device();
//!             let mut grads = dev.upload(&[rank.rank() as f32 + 1.0; 5]).unwrap();
//!             rank.all_reduce(&mut grads, ReduceOp::Sum, None).unwrap();
//!             dev.download(&grads).unwrap()
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap(), vec![6.0; 5]); // 1 + 2 + 3 on every rank
//! }
//! # Ok::<(), nanoddp::comm::communicator::CommError>(())
//! ```
pub mod communicator;
pub mod messages;
pub mod model;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod patience;
pub mod picture;
pub mod schedule;
pub mod transport;
pub mod tree;
pub mod verify;
