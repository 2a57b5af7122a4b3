//! The one error type every backend returns.

use thiserror::Error;

/// Why a backend operation failed. Messages say what to do next where there is a choice.
#[derive(Debug, Error)]
pub enum BackendError {
    /// `libcuda.so` could not be loaded.
    #[error(
        "no CUDA driver: libcuda.so (or libcuda.so.1) was not found on the library path; install \
         the NVIDIA driver, or run on the CPU"
    )]
    NoCudaDriver,
    /// The driver loaded but reports no usable GPU.
    #[error(
        "the CUDA driver sees no GPU ({reason}); `nvidia-smi` lists the GPUs the driver sees, \
         and CUDA_VISIBLE_DEVICES may hide them; without a GPU, run on the CPU (--backend cpu), \
         or the kernels under the SIMT emulator (--backend simt)"
    )]
    NoGpu {
        /// What the driver said.
        reason: String,
    },
    /// The driver refused to start and said why: nanoddp's CPU stand-in does so over a
    /// setting of its environment (`NANODDP_STANDIN_GPUS`, `NANODDP_STANDIN_EXEC`, ...) it
    /// does not accept, naming the variable and its allowed values.
    #[error("the CUDA driver refused to start: {reason}")]
    DriverRefused {
        /// The driver's explanation.
        reason: String,
    },
    /// A device ordinal past the last GPU.
    #[error("GPU {ordinal} does not exist: this machine has {count} GPU(s), numbered from 0")]
    NoSuchDevice {
        /// Ordinal asked for.
        ordinal: usize,
        /// GPUs present.
        count: usize,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed while {during}: {}", driver_said(source))]
    Driver {
        /// What we were doing.
        during: String,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// The driver is older than the CUDA release the kernels are built with.
    #[error(
        "the CUDA driver supports CUDA {}.{}, but nanoddp's kernels are built with CUDA {}.{} \
         (PTX ISA 9.0, cubins needing an R580 or newer driver): update the NVIDIA driver to \
         580 or newer, or run on the CPU (--backend cpu)",
        found.0, found.1, required.0, required.1
    )]
    DriverTooOld {
        /// The driver's CUDA version.
        found: (i32, i32),
        /// The oldest that works.
        required: (i32, i32),
    },
    /// Kernels must be compiled at run time but `libnvrtc.so` is missing.
    #[error(
        "kernel module `{module}` has no binary for this GPU and NVRTC (libnvrtc.so.13) was not \
         found to compile it; install the CUDA toolkit or `pip install nvidia-cuda-nvrtc` and put \
         its lib/ folder on LD_LIBRARY_PATH, or rebuild nanoddp with nvcc available"
    )]
    NoNvrtc {
        /// Module that needed compiling.
        module: String,
    },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC could not compile kernel module `{module}` for {arch}:\n{log}")]
    Compile {
        /// Module name.
        module: String,
        /// Target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// No variant of a module would load on the device.
    #[error("kernel module `{module}` did not load on {device}: {attempts}")]
    ModuleLoad {
        /// Module name.
        module: String,
        /// Device description.
        device: String,
        /// Every attempt and why it failed.
        attempts: String,
    },
    /// Two GPUs that cannot address each other's memory.
    #[error(
        "GPU {from} cannot access GPU {to}'s memory (no peer-to-peer path); the collectives need \
         peer access between every pair of devices in a communicator"
    )]
    NoPeerAccess {
        /// The accessing GPU.
        from: usize,
        /// The GPU whose memory it cannot reach.
        to: usize,
    },
    /// A kernel name no embedded module defines.
    #[error("kernel `{kernel}` is not defined in module `{module}`")]
    NoSuchKernel {
        /// Module name.
        module: String,
        /// Kernel name.
        kernel: String,
    },
    /// Arguments that do not match the kernel's declared parameters.
    #[error("kernel `{kernel}`: {detail}")]
    BadArguments {
        /// Kernel name.
        kernel: String,
        /// What does not match.
        detail: String,
    },
    /// A launch shape CUDA would reject.
    #[error("kernel `{kernel}`: invalid launch configuration: {detail}")]
    BadLaunch {
        /// Kernel name.
        kernel: String,
        /// What is wrong.
        detail: String,
    },
    /// The SIMT emulator caught a kernel misbehaving.
    #[error(transparent)]
    Emulator(Box<crate::backend::simt::EmulatorError>),
    /// This build has no SIMT emulator (and no CUDA stand-in): they are built for Linux on
    /// x86-64 and aarch64 only.
    #[error(
        "the SIMT emulator is not part of this build: its fiber switch and fault handling are \
         written for Linux on x86-64 and aarch64 (use the CPU backend here)"
    )]
    NoEmulator,
    /// A device allocation failed.
    #[error("cannot allocate {bytes} bytes of device memory")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },
    /// An operation asked of types it has no implementation for.
    #[error("{op}: not implemented for {what}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The types asked for.
        what: String,
    },
    /// The stand-in's launch profile cannot be had here (a real driver, a GPU under the SIMT
    /// emulator).
    #[error("launch profile: {0}")]
    Profile(String),
    /// A problem shape an operation cannot run.
    #[error("{op}: invalid shape: {detail}")]
    BadShape {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A buffer whose length does not match the operation's shape.
    #[error("{op}: buffer `{buffer}` holds {got} elements, the shape needs {expected}")]
    BufferSize {
        /// The operation.
        op: &'static str,
        /// Which argument.
        buffer: &'static str,
        /// Elements the shape implies.
        expected: usize,
        /// Elements it has.
        got: usize,
    },
    /// Host and device lengths that differ in a copy, or an operation on buffers of
    /// different lengths.
    #[error("{operation}: length mismatch ({left} vs {right} elements)")]
    LengthMismatch {
        /// What was attempted.
        operation: &'static str,
        /// One length.
        left: usize,
        /// The other.
        right: usize,
    },
}

/// The text of a NUL-terminated C character buffer that the C side filled in (an NVRTC log,
/// an emulator error), up to its first NUL; invalid UTF-8 is replaced.
pub(crate) fn c_text(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A driver error as its code's name and the driver's description of it:
/// `CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected`.
pub fn driver_said(e: &cudarc::driver::DriverError) -> String {
    // Asking the driver for the text needs it loaded; where it is not, the name alone.
    let text = crate::backend::cuda::driver_present()
        .then(|| e.error_string().ok())
        .flatten()
        .map(|s| s.to_string_lossy().into_owned());
    match text {
        Some(text) => format!("{:?}: {text}", e.0),
        None => format!("{:?}", e.0),
    }
}
