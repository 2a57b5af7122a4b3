//! Backends: where kernels run.
//!
//! Every backend implements [`Device`]: it owns device buffers ([`DeviceBuffer`]) and runs
//! a kernel given its [`KernelSignature`] and the arguments in CUDA's `kernelParams` order.
//! The typed launchers generated from the `.cu` files (see [`crate::kernels`]) sit on top of
//! that one method, so a kernel's argument list is checked by the Rust compiler on every
//! backend at once.
//!
//! * [`cuda`]: NVIDIA GPUs through the driver API (cudarc), kernels from the embedded fatbin
//!   or compiled at run time by [`nvrtc`].
//! * [`simt`]: the same kernel sources compiled as host C++ and run on the CPU by the SIMT
//!   emulator, with compute-sanitizer-like checks. This is how kernels are tested here.

pub mod cuda;
pub mod nvrtc;
pub mod simt;

mod error;
mod launch;

pub use error::BackendError;
pub use launch::{Device, DeviceBuffer, DeviceScalar, KernelArg, LaunchConfig};
