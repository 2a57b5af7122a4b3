//! # nanoddp
//!
//! Data-parallel training from scratch: hand-written CUDA kernels compiled by the build
//! script (`build/`) from `kernels/`, collectives built by hand, and a LeNet trainer on top, with no ML
//! framework. The crate builds, runs and tests without any CUDA installed: the kernels' PTX
//! ships in `kernels/ptx/` for the driver to compile, nvcc (when found) builds them to
//! SASS and records their resource use, and without a GPU the CUDA paths run on a CPU
//! stand-in for the driver.
//!
//! ## Three ways to use it
//! * **As a backend you link**: open a device ([`backend::cuda::CudaDevice`],
//!   [`backend::simt::SimtDevice`] or [`backend::cpu::CpuDevice`]), allocate buffers, run the
//!   operations of [`backend::Backend`], or any kernel through its typed launcher in
//!   [`kernels`]. With `default-features = false` the library builds without the command
//!   line's dependencies (clap, indicatif, plotters: the `cli` feature).
//! * **As a test suite**: `cargo test` checks every kernel against float64 references.
//! * **As a text**: each kernel file opens with its launch shape and roofline; each module
//!   here explains one idea.
//!
//! ## A kernel on the CPU, no GPU needed
//!
//! ```
//! use nanoddp::backend::{simt::SimtDevice, Backend, Memory};
//!
//! let dev = SimtDevice::new(0);
//! let x = dev.upload(&[1.0f32, 2.0, 3.0])?;
//! let mut y = dev.upload(&[10.0f32; 3])?;
//! dev.axpy(2.0, &x, &mut y)?; // kernels/elementwise.cu under the SIMT emulator
//! assert_eq!(dev.download(&y)?, [12.0, 14.0, 16.0]);
//! # Ok::<(), nanoddp::backend::BackendError>(())
//! ```
//!
//! ## Map
//! * [`kernels`]: what the build script embedded (sources, fatbins, ptxas reports, signatures)
//!   and the typed launchers generated from the `.cu` declarations.
//! * [`backend`]: [`Backend`](backend::Backend) (the operations LeNet needs, each call checked
//!   once) over what each backend provides ([`BackendImpl`](backend::BackendImpl)), and
//!   [`Memory`](backend::Memory). Two families: [`backend::kernel`], the devices that launch
//!   `kernels/*.cu` ([`KernelDevice`](backend::KernelDevice): the CUDA backend, with
//!   run-time compilation by NVRTC, which also runs without a GPU on the CPU stand-in for
//!   the driver that `cargo build` puts in [`STANDIN_DIR`](backend::cuda::STANDIN_DIR), and
//!   the SIMT backend, which runs the same kernel sources on the CPU with
//!   compute-sanitizer-like checks), and [`backend::cpu`], the native CPU backend.
//! * [`comm`]: the NCCL layer: collectives (allreduce, reduce-scatter, all-gather, broadcast,
//!   barrier) as verified data, executed over peer memory with timeouts, or as messages over
//!   MPI; the [`Collective`](comm::collective::Collective) a trainer's rank sums through.
//! * [`data`]: IDX files, Fashion-MNIST discovery, epochs of sharded batches.
//! * [`dtype`]: the element types ([`DType`](dtype::DType)) everything is stored and
//!   moved in.
//! * [`model`]: LeNet (the chapter's), described once ([`LENET`](model::LENET)), forward and
//!   backward on any backend.
//! * [`system`]: the host CPU's description and its measured peak.
//! * [`train`]: the DDP layer: the data-parallel training loop, gradient buckets, loss
//!   scaling, recipes and their defaults, configuration, reports and checkpoints.

#![warn(missing_docs)]

pub mod backend;
pub mod comm;
pub mod data;
pub mod dtype;
pub mod kernels;
pub mod model;
pub mod system;
pub mod train;

/// The names most programs need, in one import: `use nanoddp::prelude::*;`.
///
/// ```
/// use nanoddp::prelude::*;
///
/// // Two emulated GPUs: upload, allreduce across them, download.
/// type Error = Box<dyn std::error::Error + Send + Sync>;
/// let ranks = communicator(vec![SimtDevice::new(0), SimtDevice::new(1)], CommConfig::default())?;
/// let sums = on_each_rank(ranks, |mut rank| -> Result<Vec<f32>, Error> {
///     let dev = rank.device().clone();
///     let mut x = dev.upload(&[rank.rank() as f32 + 1.0; 3])?;
///     rank.all_reduce(&mut x, ReduceOp::Sum, Some(Algorithm::Ring))?;
///     Ok(dev.download(&x)?)
/// })?
/// .into_iter()
/// .collect::<Result<Vec<_>, _>>()?;
/// assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]); // collective.cu under the emulator
/// # Ok::<(), Error>(())
/// ```
pub mod prelude {
    pub use crate::backend::cpu::CpuDevice;
    pub use crate::backend::cuda::CudaDevice;
    pub use crate::backend::simt::{LaneOrder, SimtDevice};
    pub use crate::backend::simt_module::SimtModule;
    pub use crate::backend::{
        Backend, BackendError, Conv2dShape, Epilogue, GemmShape, KernelArg, KernelDevice,
        LaunchConfig, Memory, Pool2dShape, SgdStep,
    };
    pub use crate::comm::communicator::{communicator, CommConfig, CommError, Rank, ReduceOp};
    pub use crate::comm::rank_threads::on_each_rank;
    pub use crate::comm::schedule::Algorithm;
    pub use crate::data::Dataset;
    pub use crate::dtype::DType;
    pub use crate::model::{Replica, ShardStats, PARAMS};
    pub use crate::train::{train, TrainConfig, TrainError};
}
