//! Backends: where the operations run. Two families implement them:
//!
//! ```text
//! Backend (ops.rs)            the operations LeNet needs; checks every call once
//!   └─ BackendImpl            what a backend provides, called with checked arguments
//!        ├─ kernel/           every KernelDevice, by launching kernels/*.cu
//!        │    ├─ cuda         NVIDIA GPUs (driver API; the CPU stand-in without one) + nvrtc
//!        │    └─ simt         the kernel sources on the CPU, with sanitizer-like checks
//!        └─ cpu/              native Rust, the production path without a GPU
//! ```
//!
//! * [`Memory`]: typed buffers ([`DeviceBuffer`]) and copies, on every backend.
//! * [`KernelDevice`]: a [`Memory`] that launches kernels, given a
//!   [`KernelSignature`](crate::kernels::KernelSignature) and the arguments in CUDA's
//!   `kernelParams` order. The typed launchers generated from the `.cu` files (see
//!   [`crate::kernels`]) sit on top of that one method, so a kernel's argument list is
//!   checked by the Rust compiler on every kernel backend at once.
//! * [`Backend`]: the operations LeNet needs (GEMM, convolution, pooling, loss, optimizer).
//!   It checks every call's shapes and buffer lengths once, then calls the backend's
//!   [`BackendImpl`] with the arguments as one [`op`] struct, [`Checked`](op::Checked). A new backend implements [`Memory`] and either [`KernelDevice`] (and
//!   gets every operation from the kernels) or [`BackendImpl`].
//! * [`Precision`]: the Rust types of the storage [`DType`](crate::dtype::DType)s.
//! * [`step`]: what a training step keeps in device memory so that the host neither feeds
//!   nor waits for it ([`StepScalars`], the statistics' layout, [`TensorTable`]); with
//!   [`Staging`] (page-locked host memory a queue copies into) and [`Graph`] (a queue's
//!   work captured once and replayed) in [`Memory`].
//!
//! The backends keep their short paths: [`cuda`], [`nvrtc`], [`simt`] and [`simt_module`]
//! are [`kernel`]'s modules.

pub mod cpu;
pub mod kernel;
pub mod shapes;

pub(crate) mod backend_impl;
mod check;
mod error;
mod memory;
pub mod op;
mod ops;
mod precision;
pub mod step;

pub use backend_impl::{BackendImpl, OpResult};
pub use error::BackendError;
pub use kernel::{cuda, nvrtc, profile, simt, simt_module};
pub use kernel::{KernelArg, KernelDevice, LaunchConfig};
pub use memory::{DeviceBuffer, DeviceScalar, Fence, Graph, Memory, Staging};
pub use ops::Backend;
pub use precision::{gemm_kernels, GemmKernels, Precision, PrecisionOp};
pub use shapes::{Conv2dShape, Epilogue, GemmShape, Pool2dShape, SgdStep};
pub use step::{StepScalars, TensorTable, RECORD, STATS};
