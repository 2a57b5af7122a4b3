//! The CUDA backend on a machine without a driver: every entry point returns a typed error
//! (cudarc itself would panic). This test binary never loads the CPU stand-in for the
//! driver; the per-kernel test files do (or use the GPU when there is one), and
//! tests/cuda_standin.rs checks the stand-in's rules and the backend against them.

use nanoddp::backend::cuda::{self, CudaDevice};
use nanoddp::backend::BackendError;

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn without_a_driver_every_entry_point_errors_instead_of_panicking() {
    if cuda::driver_present() {
        eprintln!("skipped: a CUDA driver is present");
        return;
    }
    assert!(matches!(
        cuda::device_count(),
        Err(BackendError::NoCudaDriver)
    ));
    assert!(matches!(
        cuda::driver_version(),
        Err(BackendError::NoCudaDriver)
    ));
    assert!(matches!(
        CudaDevice::new(0),
        Err(BackendError::NoCudaDriver)
    ));
    assert!(matches!(
        CudaDevice::all_infos(),
        Err(BackendError::NoCudaDriver)
    ));
    let message = BackendError::NoCudaDriver.to_string();
    assert!(
        message.contains("libcuda.so") && message.contains("CPU"),
        "{message}"
    );
}
