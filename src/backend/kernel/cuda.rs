//! The CUDA backend: NVIDIA GPUs through the driver API.
//!
//! Nothing here needs CUDA at build time. The driver (`libcuda.so`) is loaded when first
//! used; cudarc panics when it is missing, so every entry point checks
//! [`driver_present`] first and returns [`BackendError::NoCudaDriver`] instead. The driver
//! must support CUDA 13.0 (R580 or newer): that is what the kernels are built with.
//!
//! Kernel modules load once per GPU, shared by every handle on it, in this order:
//! 1. the fatbin nvcc built into the crate, when the build had nvcc (SASS for sm_80/sm_90,
//!    the shipped architectures' PTX otherwise);
//! 2. the PTX the repository ships (`kernels/ptx/`), the newest architecture the GPU takes,
//!    JIT-compiled by the driver: every build has it, so neither nvcc nor NVRTC is needed;
//! 3. NVRTC → cubin for the device's exact `sm_XY` (no driver PTX-version check: what an
//!    older driver that refuses the PTX ISA of CUDA 13.0 can still load);
//! 4. NVRTC → PTX for `compute_XY`, JIT-compiled by the driver.
//!
//! ## Queues
//! A [`CudaDevice`] handle owns a queue (a CUDA stream): its copies and launches run in order
//! on it. `clone()` gives another handle on the same queue; [`Memory::fork`] one with its own
//! queue, whose work runs concurrently with the first's (the trainer computes on one and
//! reduces gradients on another). Work on different queues is ordered only by the host:
//! [`Memory::synchronize`] or a [`Fence`] recorded on one queue and waited for
//! before the other uses the data. With that discipline cudarc's per-buffer event tracking
//! is redundant, so it is turned off: kernels get raw device addresses, as CUDA C++ does.
//!
//! ## Memory for peers
//! cudarc allocates from the device's memory pool (`cuMemAllocAsync`) on every GPU that has
//! pools (all since Volta's drivers; every A100 and H100). A peer may dereference pool memory
//! only after `cuMemPoolSetAccess`; `cuCtxEnablePeerAccess` covers `cuMemAlloc` memory alone.
//! [`KernelDevice::enable_peer_access`] grants both.
//!
//! ## Errors
//! A kernel's fault surfaces at the next call that waits for it. Errors from such calls name
//! the kernels queued since the last synchronization, and `CUDA_LAUNCH_BLOCKING=1` makes
//! every launch wait, pinning the fault to its launch. On the CPU stand-in for the driver
//! (`target/<profile>/cuda-standin`, see the README) the error also carries the stand-in's
//! diagnostic: which kernel touched which address, and why it may not.

use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DriverError, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::launch::check_launch;
use super::nvrtc::{self, Output};
use super::{KernelArg, KernelDevice, LaunchConfig, Scratch};
use crate::backend::{BackendError, DeviceBuffer, DeviceScalar, Fence, Graph, Memory, Staging};
use crate::kernels::{KernelModule, KernelSignature};

/// Where `cargo build` put the CPU stand-in for the CUDA driver (`libcuda.so.1`); point
/// `LD_LIBRARY_PATH` at it to run any CUDA path of this crate, or any cudarc program, on the
/// CPU.
pub const STANDIN_DIR: &str = env!("NANODDP_STANDIN_DIR");

/// The oldest driver the kernels run on: CUDA 13.0 (R580). nvcc 13.0's PTX is ISA 9.0 and its
/// cubins need a 13.x driver.
pub const MIN_DRIVER: (i32, i32) = (13, 0);

/// Dynamic shared memory a launch may use without raising the kernel's limit.
const DEFAULT_DYNAMIC_SHARED: u32 = 48 << 10;

/// Kernel names listed in an error about asynchronous work.
const IN_FLIGHT_NAMED: usize = 8;

/// True when the CUDA driver library can be loaded. Never panics.
pub fn driver_present() -> bool {
    // SAFETY: only attempts to dlopen libcuda; calls nothing in it.
    unsafe { sys::is_culib_present() }
}

fn require_driver() -> Result<(), BackendError> {
    if !driver_present() {
        return Err(BackendError::NoCudaDriver);
    }
    // The CPU stand-in would print a setting it refuses on stderr; nanoddp's own error says
    // it (BackendError::DriverRefused), once.
    static HOST_REPORTS: std::sync::Once = std::sync::Once::new();
    HOST_REPORTS.call_once(|| {
        // SAFETY: the driver library is loaded (checked above); the stand-in's export takes
        // nothing and returns nothing; the real driver has no such symbol.
        unsafe {
            if let Ok(f) =
                sys::culib().get::<unsafe extern "C" fn()>(b"nanoddpStandinHostReportsSettings\0")
            {
                f();
            }
        }
    });
    Ok(())
}

/// The CPU stand-in's explanation of an error, when the driver is the stand-in: GPU
/// `ordinal`'s sticky error if it has one, else the last error reported.
fn standin_diagnostic(ordinal: Option<usize>) -> Option<String> {
    // SAFETY: the driver library is loaded (only called after a driver call failed); the
    // stand-in's functions return a NUL-terminated string that stays valid until this
    // thread calls them again; the real driver has no such symbols.
    unsafe {
        let lib = sys::culib();
        let text = match ordinal {
            Some(o) => lib
                .get::<unsafe extern "C" fn(i32) -> *const c_char>(b"nanoddpStandinDeviceError\0")
                .ok()?(o as i32),
            None => lib
                .get::<unsafe extern "C" fn() -> *const c_char>(b"nanoddpStandinLastError\0")
                .ok()?(),
        };
        if text.is_null() {
            return None;
        }
        let text = CStr::from_ptr(text).to_string_lossy().into_owned();
        (!text.is_empty()).then_some(text)
    }
}

/// True when the loaded driver is nanoddp's CPU stand-in.
pub fn is_standin() -> bool {
    // SAFETY: as in `standin_diagnostic`; only looks the symbol up.
    driver_present()
        && unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn() -> *const c_char>(b"nanoddpStandinLastError\0")
                .is_ok()
        }
}

/// What runs kernels on the CPU stand-in: "SIMT emulator" (the kernels' C++ source) or "PTX
/// executor" (the PTX nvcc or NVRTC emitted; `NANODDP_STANDIN_EXEC=ptx`). `None` on a real
/// driver.
pub fn standin_executor() -> Option<String> {
    if !is_standin() {
        return None;
    }
    // SAFETY: the stand-in is loaded; its export returns a static NUL-terminated string.
    unsafe {
        let f = sys::culib()
            .get::<unsafe extern "C" fn() -> *const c_char>(b"nanoddpStandinExecutor\0")
            .ok()?;
        Some(CStr::from_ptr(f()).to_string_lossy().into_owned())
    }
}

/// Turns the stand-in's launch profile ([`profile`](super::profile)) on or off for GPU
/// `ordinal`'s later launches. Only the PTX executor counts: when the GPU has loaded no
/// module yet this chooses it for the GPU; after that the GPU must already run it
/// (`NANODDP_STANDIN_EXEC=ptx`). Call it before the [`CudaDevice`] that will launch, so that
/// its modules load under the PTX executor.
pub fn standin_profile(ordinal: usize, on: bool) -> Result<(), BackendError> {
    let refused = BackendError::Profile;
    if !is_standin() {
        return Err(refused(
            "only the CPU stand-in for the CUDA driver counts launches".into(),
        ));
    }
    // Starts the driver, or says why it refused.
    device_count()?;
    let gpu = i32::try_from(ordinal).map_err(|_| refused(format!("no GPU {ordinal}")))?;
    // SAFETY: the stand-in is loaded; its exports take plain values and a NUL-terminated
    // string that outlives the call.
    let code = unsafe {
        let lib = sys::culib();
        let choose = lib
            .get::<unsafe extern "C" fn(i32, *const c_char, i32) -> i32>(
                b"nanoddpStandinUseExecutor\0",
            )
            .map_err(|e| refused(e.to_string()))?;
        // Refused once the GPU loaded a module: then its executor must already be the PTX one.
        if on {
            choose(gpu, c"ptx".as_ptr(), 0);
        }
        let profile = lib
            .get::<unsafe extern "C" fn(i32, i32) -> i32>(b"nanoddpStandinProfile\0")
            .map_err(|e| refused(e.to_string()))?;
        profile(gpu, i32::from(on))
    };
    match code {
        0 => Ok(()),
        801 => Err(refused(format!(
            "GPU {ordinal} runs its kernels under the SIMT emulator, and only the PTX executor counts: \
             run with NANODDP_STANDIN_EXEC=ptx"
        ))),
        _ => Err(refused(format!("the stand-in has no GPU {ordinal}"))),
    }
}

/// The profiles of the launches the stand-in ran since the last call, oldest first (see
/// [`standin_profile`]).
pub fn standin_profile_take() -> Result<Vec<super::profile::LaunchProfile>, BackendError> {
    let refused = BackendError::Profile;
    if !is_standin() {
        return Err(refused(
            "only the CPU stand-in for the CUDA driver counts launches".into(),
        ));
    }
    type Take = unsafe extern "C" fn(*mut c_char, usize) -> std::ffi::c_long;
    // SAFETY: the stand-in's export: it writes at most `capacity` bytes into the buffer and
    // returns the length of what it holds.
    let text = unsafe {
        let take = sys::culib()
            .get::<Take>(b"nanoddpStandinProfileTake\0")
            .map_err(|e| refused(e.to_string()))?;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let need = take(buf.as_mut_ptr().cast(), buf.len());
            let need = usize::try_from(need).unwrap_or(0);
            if need < buf.len() {
                buf.truncate(need);
                break;
            }
            buf = vec![0; need + 4096];
        }
        String::from_utf8_lossy(&buf).into_owned()
    };
    text.lines()
        .map(|l| super::profile::LaunchProfile::parse(l).map_err(refused))
        .collect()
}

fn driver_err(during: impl Into<String>) -> impl FnOnce(DriverError) -> BackendError {
    driver_err_on(None, during)
}

/// As [`driver_err`], for an error of GPU `ordinal`.
fn driver_err_on(
    ordinal: Option<usize>,
    during: impl Into<String>,
) -> impl FnOnce(DriverError) -> BackendError {
    let during = during.into();
    move |source| {
        let during = match standin_diagnostic(ordinal) {
            Some(why) => format!("{during} [stand-in: {why}]"),
            None => during,
        };
        BackendError::Driver { during, source }
    }
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

/// Number of GPUs the driver sees. Errors (never panics) when there is no driver, returns
/// [`BackendError::NoGpu`] when the driver works but sees no GPU, and
/// [`BackendError::DriverRefused`] when the CPU stand-in refuses a setting of its
/// environment (naming the variable and what it accepts).
pub fn device_count() -> Result<usize, BackendError> {
    require_driver()?;
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err(BackendError::NoGpu {
            reason: "device count is 0".into(),
        }),
        // cuInit failed: the stand-in says why when a setting of its environment is bad (the
        // only cuInit failure it explains).
        Err(e) => Err(match standin_diagnostic(None) {
            Some(reason) if e.0 == sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
                BackendError::DriverRefused { reason }
            }
            _ => BackendError::NoGpu {
                reason: crate::backend::error::driver_said(&e),
            },
        }),
    }
}

/// Kernels that exist only from compute capability 8.0 on (bf16 wmma fragments).
const NEEDS_SM80: [&KernelSignature; 4] = [
    &crate::kernels::gemm::GEMM_BF16_WMMA_F32OUT,
    &crate::kernels::gemm::GEMM_BF16_WMMA_BF16OUT,
    &crate::kernels::gemm::GEMM_BF16_WMMA_SLICED_F32OUT,
    &crate::kernels::gemm::GEMM_BF16_WMMA_SLICED_BF16OUT,
];

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
    /// From the PTX the repository ships for this virtual arch (`compute_90`), JIT-compiled.
    ShippedPtx(String),
    /// Compiled at run time by NVRTC to SASS for this arch.
    NvrtcCubin(String),
    /// Compiled at run time by NVRTC to PTX for this virtual arch, then JIT-compiled.
    NvrtcPtx(String),
}

struct LoadedModule {
    module: Arc<CudaModule>,
    origin: ModuleOrigin,
}

/// What every handle on one GPU shares: the context and the loaded kernels (loading a
/// module can take seconds when it is JIT-compiled; it happens once per GPU, not per handle).
struct Gpu {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    modules: Mutex<HashMap<&'static str, LoadedModule>>,
    functions: Mutex<HashMap<(&'static str, &'static str), CudaFunction>>,
}

/// A handle's queue: its stream, and the kernels queued on it since it was last waited for
/// (named in errors, since a kernel's fault surfaces only at the next wait).
struct Queue {
    ordinal: usize,
    stream: Arc<CudaStream>,
    in_flight: Mutex<Vec<&'static str>>,
    /// Shared by the handles on this queue, whose work is ordered.
    scratch: Scratch<CudaDevice>,
}

impl Queue {
    fn new(ordinal: usize, stream: Arc<CudaStream>) -> Arc<Queue> {
        Arc::new(Queue {
            ordinal,
            stream,
            in_flight: Mutex::new(Vec::new()),
            scratch: Scratch::default(),
        })
    }

    fn launched(&self, kernel: &'static str) {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !in_flight.contains(&kernel) {
            in_flight.push(kernel);
        }
    }

    fn drained(&self) {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// An error from a call that waited for this queue: it may come from any kernel queued
    /// since the last wait, so name them. Called only once a call has failed.
    fn waited_err(&self, during: String, source: DriverError) -> BackendError {
        let in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let during = if in_flight.is_empty() {
            during
        } else {
            let mut names: Vec<String> = in_flight
                .iter()
                .take(IN_FLIGHT_NAMED)
                .map(|k| format!("`{k}`"))
                .collect();
            if in_flight.len() > IN_FLIGHT_NAMED {
                names.push(format!("{} more", in_flight.len() - IN_FLIGHT_NAMED));
            }
            format!(
                "{during} (the error may come from any kernel queued since the last wait: {}; \
                 CUDA_LAUNCH_BLOCKING=1 makes each launch wait, to pin it to one)",
                names.join(", ")
            )
        };
        driver_err_on(Some(self.ordinal), during)(source)
    }
}

/// A handle on one GPU: its context and kernels (shared with every other handle on the GPU)
/// and a queue of work (shared with its clones; see the module docs).
pub struct CudaDevice {
    gpu: Arc<Gpu>,
    queue: Arc<Queue>,
}

impl Clone for CudaDevice {
    /// Another handle on the same GPU and the same queue: work on either is ordered.
    fn clone(&self) -> Self {
        CudaDevice {
            gpu: self.gpu.clone(),
            queue: self.queue.clone(),
        }
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("info", &self.gpu.info)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`: a handle with its own queue. Handles opened on the same GPU share
    /// its context and loaded kernels.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(BackendError::NoSuchDevice { ordinal, count });
        }
        let found = driver_version()?;
        if found < MIN_DRIVER {
            return Err(BackendError::DriverTooOld {
                found,
                required: MIN_DRIVER,
            });
        }
        // One `Gpu` per ordinal while any handle on it lives: opening a GPU twice shares its
        // loaded modules.
        static OPEN: Mutex<Vec<(usize, std::sync::Weak<Gpu>)>> = Mutex::new(Vec::new());
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|(_, gpu)| gpu.strong_count() > 0);
        let gpu = match open
            .iter()
            .find(|(o, _)| *o == ordinal)
            .and_then(|(_, gpu)| gpu.upgrade())
        {
            Some(gpu) => gpu,
            None => {
                let ctx = CudaContext::new(ordinal)
                    .map_err(driver_err(format!("opening GPU {ordinal}")))?;
                // SAFETY: called before any allocation on this context; work is ordered per
                // queue and across queues by the host (module docs), which is what the
                // tracking would enforce.
                unsafe { ctx.disable_event_tracking() };
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
                let gpu = Arc::new(Gpu {
                    ctx,
                    info,
                    modules: Mutex::new(HashMap::new()),
                    functions: Mutex::new(HashMap::new()),
                });
                open.push((ordinal, Arc::downgrade(&gpu)));
                gpu
            }
        };
        CudaDevice::with_new_queue(gpu)
    }

    /// A handle on `gpu` with a queue of its own (a new stream).
    fn with_new_queue(gpu: Arc<Gpu>) -> Result<Self, BackendError> {
        gpu.ctx
            .bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        let stream = gpu
            .ctx
            .new_stream()
            .map_err(driver_err("creating a stream"))?;
        let queue = Queue::new(gpu.info.ordinal, stream);
        Ok(CudaDevice { gpu, queue })
    }

    /// Describes this GPU.
    pub fn info(&self) -> &DeviceInfo {
        &self.gpu.info
    }

    /// Describes every GPU the driver sees.
    pub fn all_infos() -> Result<Vec<DeviceInfo>, BackendError> {
        (0..device_count()?)
            .map(|i| Ok(CudaDevice::new(i)?.gpu.info.clone()))
            .collect()
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(driver_err("binding the context"))
    }

    /// Loads a kernel module now (normally it loads at its first launch) and says which
    /// variant loaded. Every handle on this GPU shares the loaded module.
    pub fn load(&self, module: &'static KernelModule) -> Result<ModuleOrigin, BackendError> {
        let mut modules = self
            .gpu
            .modules
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(loaded) = modules.get(module.name) {
            return Ok(loaded.origin.clone());
        }
        self.bind()?;
        let loaded = self.load_uncached(module)?;
        let origin = loaded.origin.clone();
        modules.insert(module.name, loaded);
        Ok(origin)
    }

    fn load_uncached(&self, module: &'static KernelModule) -> Result<LoadedModule, BackendError> {
        let info = &self.gpu.info;
        let cc = info.compute_capability;
        let mut attempts = Vec::new();
        if let Some(fatbin) = module.fatbin {
            match self.gpu.ctx.load_module(Ptx::from_binary(fatbin.to_vec())) {
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
        match module.ptx_for(cc) {
            Some(ptx) => match self.gpu.ctx.load_module(Ptx::from_src(ptx.text)) {
                Ok(m) => {
                    return Ok(LoadedModule {
                        module: m,
                        origin: ModuleOrigin::ShippedPtx(format!("compute_{}", ptx.arch)),
                    })
                }
                Err(e) => attempts.push(format!("shipped compute_{} PTX: {e}", ptx.arch)),
            },
            None => attempts.push("no shipped PTX this GPU can take".to_string()),
        }
        for (output, arch) in [
            (Output::Cubin, format!("sm_{}{}", cc.0, cc.1)),
            (Output::Ptx, format!("compute_{}{}", cc.0, cc.1)),
        ] {
            let image = match nvrtc::compile(module, cc, output) {
                Ok(image) => image,
                // With nothing else to try, say plainly what would help.
                Err(e @ BackendError::NoNvrtc { .. })
                    if module.fatbin.is_none() && module.ptx.is_empty() =>
                {
                    return Err(e)
                }
                Err(BackendError::NoNvrtc { .. }) => {
                    attempts.push("NVRTC (libnvrtc.so.13) not found".to_string());
                    break;
                }
                Err(e) => {
                    attempts.push(format!("NVRTC {arch}: {e}"));
                    continue;
                }
            };
            match self.gpu.ctx.load_module(Ptx::from_binary(image)) {
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
            device: format!("GPU {} ({}, sm_{}{})", info.ordinal, info.name, cc.0, cc.1),
            attempts: attempts.join("; "),
        })
    }

    fn function(&self, kernel: &'static KernelSignature) -> Result<CudaFunction, BackendError> {
        let key = (kernel.module, kernel.name);
        // Held through a miss: ranks sharing the GPU look each kernel up once between them.
        let mut functions = self
            .gpu
            .functions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = functions.get(&key) {
            return Ok(f.clone());
        }
        let module =
            KernelModule::find(kernel.module).ok_or_else(|| BackendError::NoSuchKernel {
                module: kernel.module.to_string(),
                kernel: kernel.name.to_string(),
            })?;
        self.load(module)?;
        let f = {
            let modules = self
                .gpu
                .modules
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
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
        functions.insert(key, f.clone());
        Ok(f)
    }

    /// Lets kernels on this GPU read and write `peer`'s pool memory (`cuMemAllocAsync`, what
    /// cudarc allocates wherever pools exist): granted on the peer's default pool.
    fn grant_pool_access(&self, peer: &CudaDevice) -> Result<(), BackendError> {
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the peer's device handle is valid; `pool` is a valid out-pointer.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, peer.gpu.ctx.cu_device()) }
            .result()
            .map_err(driver_err(format!(
                "finding GPU {}'s memory pool",
                peer.gpu.info.ordinal
            )))?;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.gpu.info.ordinal as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `pool` came from the driver above; one valid descriptor.
        unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }
            .result()
            .map_err(driver_err(format!(
                "granting GPU {} access to GPU {}'s memory pool",
                self.gpu.info.ordinal, peer.gpu.info.ordinal
            )))
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
    // Recorded on handles of the GPU that made it; any GPU's stream may wait for it.
    type Mark = CudaEvent;

    fn new_mark(&self) -> Result<CudaEvent, BackendError> {
        // Without timing: an event that only orders streams is the cheapest kind.
        self.gpu
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver_err("creating an event"))
    }

    fn record(&self, mark: &CudaEvent) -> Result<(), BackendError> {
        mark.record(&self.queue.stream)
            .map_err(driver_err("recording an event"))
    }

    fn wait_mark(&self, mark: &CudaEvent) -> Result<(), BackendError> {
        self.queue
            .stream
            .wait(mark)
            .map_err(driver_err("making a stream wait for an event"))
    }

    fn alloc_zeros<T: DeviceScalar>(&self, len: usize) -> Result<CudaBuffer<T>, BackendError> {
        let slice = self
            .queue
            .stream
            .alloc_zeros::<T>(len)
            .map_err(driver_err(format!(
                "allocating {len} elements on GPU {}",
                self.gpu.info.ordinal
            )))?;
        Ok(CudaBuffer { slice })
    }

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<CudaBuffer<T>, BackendError> {
        let slice = self
            .queue
            .stream
            .clone_htod(host)
            .map_err(driver_err(format!(
                "copying {} elements to GPU {}",
                host.len(),
                self.gpu.info.ordinal
            )))?;
        Ok(CudaBuffer { slice })
    }

    fn copy_in<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut CudaBuffer<T>,
    ) -> Result<(), BackendError> {
        self.queue
            .stream
            .memcpy_htod(host, &mut buf.slice)
            .map_err(driver_err("copying to the device"))
    }

    fn download<T: DeviceScalar>(&self, buf: &CudaBuffer<T>) -> Result<Vec<T>, BackendError> {
        let during = || {
            format!(
                "copying {} elements from GPU {}",
                buf.len(),
                self.gpu.info.ordinal
            )
        };
        let host = self
            .queue
            .stream
            .clone_dtoh(&buf.slice)
            .map_err(|e| self.queue.waited_err(during(), e))?;
        // An asynchronous copy into pageable memory may return before the data is there (no
        // driver promises otherwise): wait for it.
        self.synchronize()?;
        Ok(host)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.queue
            .stream
            .synchronize()
            .map_err(|e| self.queue.waited_err("synchronizing the stream".into(), e))?;
        self.queue.drained();
        Ok(())
    }

    fn fence(&self) -> Result<Fence, BackendError> {
        let event = self
            .queue
            .stream
            .record_event(None)
            .map_err(driver_err("recording an event"))?;
        let (queue, asked) = (self.queue.clone(), self.queue.clone());
        let event = Arc::new(event);
        let queried = event.clone();
        Ok(Fence::new(
            move || {
                event
                    .synchronize()
                    .map_err(|e| queue.waited_err("waiting for an event".into(), e))
            },
            move || {
                queried
                    .try_is_complete()
                    .map_err(|e| asked.waited_err("asking whether an event is done".into(), e))
            },
        ))
    }

    fn alloc_staging<T: DeviceScalar>(&self, len: usize) -> Result<Staging<T>, BackendError> {
        self.bind()?;
        let bytes = len.max(1) * std::mem::size_of::<T>();
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current (bind). Mapped: kernels store
        // into it (under unified addressing all of cuMemHostAlloc's memory is; the flag says
        // so where it is not).
        unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .result()
            .map_err(driver_err(format!(
                "allocating {bytes} bytes of page-locked host memory"
            )))?;
        let addr = ptr as usize;
        let release = move || {
            // SAFETY: allocated by cuMemHostAlloc above and freed once, here. A free that
            // fails leaves nothing to do at drop.
            let _ = unsafe { sys::cuMemFreeHost(addr as *mut std::ffi::c_void) };
        };
        let mut device_addr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is the mapped allocation above; a valid out-pointer.
        if let Err(e) =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_addr, ptr, 0) }.result()
        {
            release();
            return Err(driver_err("finding where the GPU sees page-locked memory")(
                e,
            ));
        }
        // SAFETY: the driver returned `bytes` of host memory, aligned for any type; zeroed
        // here so that every element is initialized.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        // SAFETY: `len` zeroed (valid) elements of T that live until `release`, which the
        // GPU sees at `device_addr`.
        Ok(unsafe { Staging::from_raw(ptr.cast::<T>(), len, device_addr, Box::new(release)) })
    }

    fn fork(&self) -> Result<Self, BackendError> {
        CudaDevice::with_new_queue(self.gpu.clone())
    }

    fn can_capture(&self) -> bool {
        true
    }

    fn begin_capture(&self) -> Result<(), BackendError> {
        self.bind()?;
        // Thread-local: each rank captures from its own thread, and what another thread
        // does meanwhile (its own launches, a synchronize) neither joins nor breaks this
        // capture.
        self.queue
            .stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_err("beginning a stream capture"))
    }

    fn end_capture(&self) -> Result<Graph, BackendError> {
        self.bind()?;
        let Some(graph) = self
            .queue
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| self.queue.waited_err("ending a stream capture".into(), e))?
        else {
            // Nothing was queued: a graph that does nothing.
            return Ok(Graph::new(|| Ok(())));
        };
        graph
            .upload()
            .map_err(driver_err("uploading a graph to the GPU"))?;
        let (queue, gpu) = (self.queue.clone(), self.gpu.clone());
        Ok(Graph::new(move || {
            gpu.ctx
                .bind_to_thread()
                .map_err(driver_err("binding the context"))?;
            graph
                .launch()
                .map_err(|e| queue.waited_err("launching a graph".into(), e))?;
            queue.launched("(graph)");
            Ok(())
        }))
    }
}

impl KernelDevice for CudaDevice {
    fn scratch(&self) -> Result<[KernelArg; 2], BackendError> {
        self.queue.scratch.args(self)
    }

    fn enable_peer_access(&self, peer: &CudaDevice) -> Result<(), BackendError> {
        let (me, them) = (self.gpu.info.ordinal, peer.gpu.info.ordinal);
        if me == them {
            return Ok(());
        }
        let mut can = 0i32;
        // SAFETY: both devices come from live contexts; `can` is a valid out-pointer.
        unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.gpu.ctx.cu_device(), peer.gpu.ctx.cu_device())
        }
        .result()
        .map_err(driver_err("asking whether peer access is possible"))?;
        if can == 0 {
            return Err(BackendError::NoPeerAccess { from: me, to: them });
        }
        self.bind()?;
        // SAFETY: enables access from the current (this device's) context to the peer's.
        match unsafe { sys::cuCtxEnablePeerAccess(peer.gpu.ctx.cu_ctx(), 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            }
            err => {
                return Err(driver_err(format!(
                    "enabling peer access from GPU {me} to GPU {them}"
                ))(DriverError(err)))
            }
        }
        // The context's peer access covers cuMemAlloc memory only; pool memory needs its own
        // grant (without it the first peer read is CUDA_ERROR_ILLEGAL_ADDRESS).
        self.grant_pool_access(peer)
    }

    fn slowdown(&self) -> u32 {
        // The CPU stand-in runs kernels under the SIMT emulator or, slower, its PTX executor.
        if is_standin() {
            super::simt::SLOWDOWN
        } else {
            1
        }
    }

    fn preload(&self, module: &'static KernelModule) -> Result<(), BackendError> {
        self.load(module).map(|_| ())
    }

    unsafe fn launch(
        &self,
        kernel: &'static KernelSignature,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        check_launch(kernel, &cfg, args)?;
        if self.gpu.info.compute_capability < (8, 0)
            && NEEDS_SM80.iter().any(|k| std::ptr::eq(*k, kernel))
        {
            // Their compute_75 PTX traps (kernels/gemm.cu): refuse before the context is lost.
            return Err(BackendError::Unsupported {
                op: "gemm",
                what: format!(
                    "bf16 tensor cores on {} (compute capability {}.{}; bf16 wmma needs 8.0)",
                    self.gpu.info.name,
                    self.gpu.info.compute_capability.0,
                    self.gpu.info.compute_capability.1
                ),
            });
        }
        // Each rank drives its GPU from its own thread: make this device's context current.
        self.bind()?;
        let function = self.function(kernel)?;
        if cfg.shared_bytes > DEFAULT_DYNAMIC_SHARED {
            // Above 48 KiB a kernel must opt in, or the launch fails.
            function
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    cfg.shared_bytes as i32,
                )
                .map_err(driver_err(format!(
                    "allowing `{}` {} bytes of dynamic shared memory",
                    kernel.name, cfg.shared_bytes
                )))?;
        }
        let mut builder = self.queue.stream.launch_builder(&function);
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
        // above); the caller guarantees pointers and bounds per `KernelDevice::launch`'s contract.
        unsafe { builder.launch(config) }.map_err(|e| {
            self.queue
                .waited_err(format!("launching `{}`", kernel.name), e)
        })?;
        self.queue.launched(kernel.name);
        Ok(())
    }
}
