//! Backends: where the operations run.
//!
//! * [`Memory`]: typed buffers ([`DeviceBuffer`]) and copies, on every backend.
//! * [`Device`]: a [`Memory`] that runs the embedded kernels, given a [`KernelSignature`](crate::kernels::KernelSignature) and
//!   the arguments in CUDA's `kernelParams` order. The typed launchers generated from the
//!   `.cu` files (see [`crate::kernels`]) sit on top of that one method, so a kernel's
//!   argument list is checked by the Rust compiler on every kernel backend at once.
//! * [`Backend`]: the operations LeNet needs (GEMM, convolution, pooling, loss, optimizer).
//!   It checks every call's shapes and buffer lengths once, then calls the backend's
//!   [`BackendImpl`]: implemented once for every [`Device`] by launching kernels, and
//!   natively by [`cpu`]. A new backend implements [`Memory`] and [`BackendImpl`].
//!
//! * [`cuda`]: NVIDIA GPUs through the driver API (cudarc), kernels from the embedded fatbin
//!   or compiled at run time by [`nvrtc`].
//! * [`simt`]: the same kernel sources compiled as host C++ and run on the CPU by the SIMT
//!   emulator, with compute-sanitizer-like checks. This is how kernels are tested here.
//! * [`cpu`]: native Rust, the production path without a GPU.

pub mod cpu;
pub mod cuda;
pub mod nvrtc;
pub mod shapes;
pub mod simt;
pub mod simt_module;

mod backend_impl;
mod check;
mod error;
mod kernel_ops;
mod launch;
mod ops;
mod precision;

pub use backend_impl::BackendImpl;
pub use error::BackendError;
pub use launch::{Device, DeviceBuffer, DeviceScalar, Fence, KernelArg, LaunchConfig, Memory};
pub use ops::Backend;
pub use precision::{Precision, PrecisionOp};
pub use shapes::{Conv2dShape, Epilogue, GemmShape, Pool2dShape, SgdStep};
