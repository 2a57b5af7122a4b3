//! Backends: where kernels run.
//!
//! Every backend implements [`Launch`]: it owns device buffers ([`DeviceBuffer`]) and runs
//! a kernel given its [`KernelSignature`] and the arguments in CUDA's `kernelParams` order.
//! The typed launchers generated from the `.cu` files (see [`crate::kernels`]) sit on top of
//! that one method, so a kernel's argument list is checked by the Rust compiler on every
//! backend at once.
//!
//! * [`cuda`]: NVIDIA GPUs through the driver API (cudarc), kernels from the embedded fatbin
//!   or compiled at run time by [`nvrtc`].
//!
//! The SIMT emulator (the same kernels on the CPU) and the native CPU backend come next.

pub mod cuda;
pub mod nvrtc;

mod error;
mod launch;

pub use error::BackendError;
pub use launch::{DeviceBuffer, DeviceScalar, KernelArg, Launch, LaunchConfig};
