//! The kernel family: devices that run `kernels/*.cu` ([`KernelDevice`]), and through them
//! every [`Backend`](super::Backend) operation.
//!
//! * [`launch`](KernelDevice::launch): a [`LaunchConfig`] and [`KernelArg`]s in CUDA's
//!   `kernelParams` order, checked against the kernel's declaration on every executor.
//! * `ops.rs`: [`BackendImpl`](super::BackendImpl) for every [`KernelDevice`]: each
//!   operation's launch shape and kernel.
//! * [`cuda`]: NVIDIA GPUs through the driver API (cudarc), kernels from the embedded fatbin
//!   or compiled at run time by [`nvrtc`]; on a machine without a GPU, the CPU stand-in for
//!   the driver.
//! * [`profile`]: what each launch did, counted by the stand-in's PTX executor, and what it
//!   means on an H100 (occupancy, waves, roofline, an estimated time).
//! * [`simt`]: the same kernel sources compiled as host C++ and run on the CPU by the SIMT
//!   emulator, with compute-sanitizer-like checks; [`simt_module`] loads a user's `.cu` file
//!   into it.

pub mod cuda;
pub mod nvrtc;
pub mod profile;
pub mod simt;
pub mod simt_module;

mod launch;
mod ops;

pub use launch::{
    KernelArg, KernelDevice, LaunchConfig, Scratch, SCRATCH_COUNTERS, SCRATCH_FLOATS,
};
