//! The CUDA backend: NVIDIA GPUs through the driver API.
//!
//! Nothing here needs CUDA at build time. The driver (`libcuda.so`) is loaded when first
//! used; cudarc panics when it is missing, so every entry point checks
//! [`driver_present`] first and returns [`BackendError::NoCudaDriver`] instead.
//!
//! Kernel modules load lazily, once per device, in this order:
//! 1. the fatbin nvcc built into the crate (SASS for sm_80/sm_90, compute_75 PTX otherwise);
//! 2. NVRTC → cubin for the device's exact `sm_XY` (no driver PTX-version check);
//! 3. NVRTC → PTX for `compute_XY`, JIT-compiled by the driver.
//!
//! Each device gets one stream, and all of its work (copies and launches) is ordered on it.
//! That makes cudarc's per-buffer event tracking redundant, so it is turned off: kernels get
//! raw device addresses, exactly as CUDA C++ code would.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::launch::check_launch;
use super::nvrtc::{self, Output};
use super::ops::check;
use super::{BackendError, Device, DeviceBuffer, DeviceScalar, KernelArg, LaunchConfig, Memory};
use crate::kernels::{KernelModule, KernelSignature};

/// True when the CUDA driver library can be loaded. Never panics.
pub fn driver_present() -> bool {
    // SAFETY: only attempts to dlopen libcuda; calls nothing in it.
    unsafe { sys::is_culib_present() }
}

fn require_driver() -> Result<(), BackendError> {
    if driver_present() {
        Ok(())
    } else {
        Err(BackendError::NoCudaDriver)
    }
}

fn driver_err(
    during: impl Into<String>,
) -> impl FnOnce(cudarc::driver::DriverError) -> BackendError {
    let during = during.into();
    move |source| BackendError::Driver { during, source }
}

/// The driver's CUDA version, e.g. `(13, 0)`.
pub fn driver_version() -> Result<(i32, i32), BackendError> {
    require_driver()?;
    let mut v = 0i32;
    // SAFETY: the driver library is loaded (checked above); `v` is a valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(driver_err("reading the driver version"))?;
    Ok((v / 1000, (v % 1000) / 10))
}

/// Number of GPUs the driver sees. Errors (never panics) when there is no driver, and
/// returns [`BackendError::NoGpu`] when the driver works but sees no GPU.
pub fn device_count() -> Result<usize, BackendError> {
    require_driver()?;
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err(BackendError::NoGpu {
            reason: "device count is 0".into(),
        }),
        Err(e) => Err(BackendError::NoGpu {
            reason: e.to_string(),
        }),
    }
}

/// What a GPU is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal, as in `CUDA_VISIBLE_DEVICES` order.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Global memory, bytes.
    pub total_memory: usize,
}

/// How a kernel module came to be loaded on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleOrigin {
    /// From the fatbin nvcc built into the crate.
    Fatbin,
    /// Compiled at run time by NVRTC to SASS for this arch.
    NvrtcCubin(String),
    /// Compiled at run time by NVRTC to PTX for this virtual arch, then JIT-compiled.
    NvrtcPtx(String),
}

struct LoadedModule {
    module: Arc<CudaModule>,
    origin: ModuleOrigin,
}

/// One GPU: its context, its stream, and the kernel modules loaded on it.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: Mutex<HashMap<&'static str, LoadedModule>>,
    functions: Mutex<HashMap<(&'static str, &'static str), CudaFunction>>,
}

impl Clone for CudaDevice {
    /// Another handle on the same GPU, context and stream (it loads kernel modules again on
    /// first use: module handles are cached per handle).
    fn clone(&self) -> Self {
        CudaDevice {
            ctx: self.ctx.clone(),
            stream: self.stream.clone(),
            info: self.info.clone(),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(BackendError::NoSuchDevice { ordinal, count });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(driver_err(format!("opening GPU {ordinal}")))?;
        // SAFETY: called before any allocation on this context; we order all of a device's
        // work on its single stream, which is what the event tracking would otherwise enforce.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("creating a stream"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(driver_err("reading the device name"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(driver_err("reading the compute capability"))?,
            total_memory: ctx
                .total_mem()
                .map_err(driver_err("reading the memory size"))?,
        };
        Ok(CudaDevice {
            ctx,
            stream,
            info,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// Describes this GPU.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Describes every GPU the driver sees.
    pub fn all_infos() -> Result<Vec<DeviceInfo>, BackendError> {
        (0..device_count()?)
            .map(|i| Ok(CudaDevice::new(i)?.info))
            .collect()
    }

    /// Loads a kernel module now (normally it loads at its first launch) and says which
    /// variant loaded.
    pub fn load(&self, module: &'static KernelModule) -> Result<ModuleOrigin, BackendError> {
        let mut modules = self.modules.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(loaded) = modules.get(module.name) {
            return Ok(loaded.origin.clone());
        }
        let loaded = self.load_uncached(module)?;
        let origin = loaded.origin.clone();
        modules.insert(module.name, loaded);
        Ok(origin)
    }

    fn load_uncached(&self, module: &'static KernelModule) -> Result<LoadedModule, BackendError> {
        let cc = self.info.compute_capability;
        let mut attempts = Vec::new();
        if let Some(fatbin) = module.fatbin {
            match self.ctx.load_module(Ptx::from_binary(fatbin.to_vec())) {
                Ok(m) => {
                    return Ok(LoadedModule {
                        module: m,
                        origin: ModuleOrigin::Fatbin,
                    })
                }
                Err(e) => attempts.push(format!("prebuilt fatbin: {e}")),
            }
        } else {
            attempts.push("no prebuilt fatbin (built without nvcc)".to_string());
        }
        for (output, arch) in [
            (Output::Cubin, format!("sm_{}{}", cc.0, cc.1)),
            (Output::Ptx, format!("compute_{}{}", cc.0, cc.1)),
        ] {
            let image = match nvrtc::compile(module, cc, output) {
                Ok(image) => image,
                // Without NVRTC there is nothing more to try; say so plainly.
                Err(e @ BackendError::NoNvrtc { .. }) if module.fatbin.is_none() => return Err(e),
                Err(e) => {
                    attempts.push(format!("NVRTC {arch}: {e}"));
                    continue;
                }
            };
            match self.ctx.load_module(Ptx::from_binary(image)) {
                Ok(m) => {
                    let origin = match output {
                        Output::Cubin => ModuleOrigin::NvrtcCubin(arch),
                        Output::Ptx => ModuleOrigin::NvrtcPtx(arch),
                    };
                    return Ok(LoadedModule { module: m, origin });
                }
                Err(e) => attempts.push(format!("NVRTC {arch} image: {e}")),
            }
        }
        Err(BackendError::ModuleLoad {
            module: module.name.to_string(),
            device: format!(
                "GPU {} ({}, sm_{}{})",
                self.info.ordinal, self.info.name, cc.0, cc.1
            ),
            attempts: attempts.join("; "),
        })
    }

    fn function(&self, kernel: &'static KernelSignature) -> Result<CudaFunction, BackendError> {
        let key = (kernel.module, kernel.name);
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(f.clone());
        }
        let module =
            KernelModule::find(kernel.module).ok_or_else(|| BackendError::NoSuchKernel {
                module: kernel.module.to_string(),
                kernel: kernel.name.to_string(),
            })?;
        self.load(module)?;
        let f = {
            let modules = self.modules.lock().unwrap_or_else(PoisonError::into_inner);
            let loaded = modules
                .get(kernel.module)
                .ok_or_else(|| BackendError::NoSuchKernel {
                    module: kernel.module.to_string(),
                    kernel: kernel.name.to_string(),
                })?;
            loaded
                .module
                .load_function(kernel.name)
                .map_err(driver_err(format!("looking up kernel `{}`", kernel.name)))?
        };
        self.functions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, f.clone());
        Ok(f)
    }
}

/// A typed allocation on one GPU.
pub struct CudaBuffer<T> {
    slice: CudaSlice<T>,
}

impl<T: DeviceScalar> DeviceBuffer<T> for CudaBuffer<T> {
    fn len(&self) -> usize {
        self.slice.len()
    }

    fn device_addr(&self) -> u64 {
        // Event tracking is off (see the module docs), so the guard has nothing to record.
        let (ptr, _guard) = self.slice.device_ptr(self.slice.stream());
        ptr
    }
}

impl Memory for CudaDevice {
    type Buffer<T: DeviceScalar> = CudaBuffer<T>;

    fn alloc_zeros<T: DeviceScalar>(&self, len: usize) -> Result<CudaBuffer<T>, BackendError> {
        let slice = self
            .stream
            .alloc_zeros::<T>(len)
            .map_err(driver_err(format!(
                "allocating {len} elements on GPU {}",
                self.info.ordinal
            )))?;
        Ok(CudaBuffer { slice })
    }

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<CudaBuffer<T>, BackendError> {
        let slice = self.stream.clone_htod(host).map_err(driver_err(format!(
            "copying {} elements to GPU {}",
            host.len(),
            self.info.ordinal
        )))?;
        Ok(CudaBuffer { slice })
    }

    fn write<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut CudaBuffer<T>,
    ) -> Result<(), BackendError> {
        check::same_len("host-to-device copy", host.len(), buf.len())?;
        self.stream
            .memcpy_htod(host, &mut buf.slice)
            .map_err(driver_err("copying to the device"))
    }

    fn download<T: DeviceScalar>(&self, buf: &CudaBuffer<T>) -> Result<Vec<T>, BackendError> {
        self.stream
            .clone_dtoh(&buf.slice)
            .map_err(driver_err(format!(
                "copying {} elements from GPU {}",
                buf.len(),
                self.info.ordinal
            )))
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.stream
            .synchronize()
            .map_err(driver_err("synchronizing the stream"))
    }
}

impl Device for CudaDevice {
    fn enable_peer_access(&self, peer: &CudaDevice) -> Result<(), BackendError> {
        if self.info.ordinal == peer.info.ordinal {
            return Ok(());
        }
        let mut can = 0i32;
        // SAFETY: both devices come from live contexts; `can` is a valid out-pointer.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), peer.ctx.cu_device()) }
            .result()
            .map_err(driver_err("asking whether peer access is possible"))?;
        if can == 0 {
            return Err(BackendError::NoPeerAccess {
                from: self.info.ordinal,
                to: peer.info.ordinal,
            });
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        // SAFETY: enables access from the current (this device's) context to the peer's.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.ctx.cu_ctx(), 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            err => Err(BackendError::Driver {
                during: format!(
                    "enabling peer access from GPU {} to GPU {}",
                    self.info.ordinal, peer.info.ordinal
                ),
                source: cudarc::driver::DriverError(err),
            }),
        }
    }

    unsafe fn launch(
        &self,
        kernel: &'static KernelSignature,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        check_launch(kernel, &cfg, args)?;
        // Each rank drives its GPU from its own thread: make this device's context current.
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        let function = self.function(kernel)?;
        let mut builder = self.stream.launch_builder(&function);
        for arg in args {
            match arg {
                KernelArg::Ptr { addr: v, .. } | KernelArg::U64(v) => builder.arg(v),
                KernelArg::F32(v) => builder.arg(v),
                KernelArg::F64(v) => builder.arg(v),
                KernelArg::I32(v) => builder.arg(v),
                KernelArg::U32(v) => builder.arg(v),
                KernelArg::I64(v) => builder.arg(v),
            };
        }
        let config = cudarc::driver::LaunchConfig {
            grid_dim: cfg.grid,
            block_dim: cfg.block,
            shared_mem_bytes: cfg.shared_bytes,
        };
        // SAFETY: argument count and kinds match the kernel's declared parameters (checked
        // above); the caller guarantees pointers and bounds per `Device::launch`'s contract.
        unsafe { builder.launch(config) }
            .map_err(driver_err(format!("launching `{}`", kernel.name)))?;
        Ok(())
    }
}
