//! The SIMT backend: the literal `kernels/*.cu` compiled as host C++ and run on the CPU by
//! the emulator in `kernels/simt_host.cpp`, with CUDA's execution model and the checks a
//! GPU developer gets from compute-sanitizer.
//!
//! * Each CUDA thread is a fiber, each block runs on one worker OS thread, blocks spread over
//!   workers. `__syncthreads` is a counting barrier; warp intrinsics are rendezvous of the
//!   lanes in their mask.
//! * Divergent barriers, masks naming exited lanes, lanes disagreeing on a mask, deadlocks,
//!   accesses past the end of an allocation and fiber stack overflows come back as
//!   [`BackendError::Emulator`] naming the kernel, block, thread and (where known) the
//!   source line: never a hang.
//! * Lane order is a launch option ([`LaneOrder`]); shared memory is poisoned (0xFF bytes,
//!   NaN as float) at the start of every block, so a missing barrier or an unwritten shared
//!   element changes the output. [`same_under_lane_orders`] turns that into a test.
//! * A launch that never finishes (an endless loop, a spin-wait on memory nothing writes) is
//!   stopped by a watchdog at its time limit ([`SimtConfig::launch_timeout`], by default
//!   [`LAUNCH_TIMEOUT_ENV`] or [`DEFAULT_LAUNCH_TIMEOUT`]) and fails with
//!   [`EmulatorFault::Timeout`], saying where each running block's threads were; the device
//!   stays usable.
//!
//! Any number of emulated devices can exist; their memory is host memory, so a kernel can
//! read another emulated device's buffer through its address, as CUDA peer access allows.
//! Launches are synchronous: a launch returns when the grid has finished.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::Duration;

use thiserror::Error;

use super::launch::check_launch;
use super::{KernelArg, KernelDevice, LaunchConfig, Scratch};
use crate::backend::error::c_text;
use crate::backend::{BackendError, DeviceBuffer, DeviceScalar, Memory};
use crate::kernels::{simt_entries, KernelSignature};

/// The order in which a block's threads start, and are resumed after each barrier or warp
/// rendezvous. Correct kernels give bitwise identical results under every order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LaneOrder {
    /// Thread 0 first.
    #[default]
    Forward,
    /// The last thread first.
    Reverse,
    /// A permutation drawn from this seed, fresh for each block and each wake-up.
    Random(u64),
}

/// How a SIMT device runs launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimtConfig {
    /// Lane order within blocks.
    pub lane_order: LaneOrder,
    /// Worker OS threads per launch; 0 means one per available core.
    pub workers: u32,
    /// Wall-clock limit of one launch; past it the launch stops and fails with
    /// [`EmulatorFault::Timeout`]. `None`: [`LAUNCH_TIMEOUT_ENV`] if set, else
    /// [`DEFAULT_LAUNCH_TIMEOUT`]. `Some(Duration::ZERO)`: no limit.
    pub launch_timeout: Option<Duration>,
}

/// The environment variable that sets the launch time limit when
/// [`SimtConfig::launch_timeout`] is `None`: seconds (a decimal number, such as `2.5`), `0`
/// for no limit.
pub const LAUNCH_TIMEOUT_ENV: &str = "NANODDP_KERNEL_TIMEOUT_S";

/// The launch time limit when neither the configuration nor the environment sets one: far
/// beyond what a kernel of this crate needs on a CPU, yet short enough that a hung kernel
/// fails with a report instead of at a CI job's own limit.
pub const DEFAULT_LAUNCH_TIMEOUT: Duration = Duration::from_secs(300);

/// Reads a value of [`LAUNCH_TIMEOUT_ENV`]: `None` (unset) gives [`DEFAULT_LAUNCH_TIMEOUT`],
/// `"0"` no limit (`Ok(None)`), a number of seconds that limit. A limit too large to
/// represent is no limit. Anything else (negative, not a number) is an error naming the
/// variable, so that a typo does not go unnoticed.
pub fn launch_timeout_from_env_value(value: Option<&str>) -> Result<Option<Duration>, String> {
    let Some(text) = value else {
        return Ok(Some(DEFAULT_LAUNCH_TIMEOUT));
    };
    let bad = || {
        format!(
            "{LAUNCH_TIMEOUT_ENV}={text:?} is not a time limit: give seconds, such as 2.5, or 0 for none"
        )
    };
    let seconds: f64 = text.trim().parse().map_err(|_| bad())?;
    if seconds.is_nan() || seconds < 0.0 {
        return Err(bad());
    }
    if seconds == 0.0 {
        return Ok(None);
    }
    Ok(Duration::try_from_secs_f64(seconds).ok())
}

impl SimtConfig {
    /// The time limit launches run under (`Ok(None)`: none): [`SimtConfig::launch_timeout`]
    /// if set, else [`LAUNCH_TIMEOUT_ENV`], else [`DEFAULT_LAUNCH_TIMEOUT`]. An unreadable
    /// environment value is an error (see [`launch_timeout_from_env_value`]).
    pub fn effective_launch_timeout(&self) -> Result<Option<Duration>, String> {
        match self.launch_timeout {
            Some(limit) if limit.is_zero() => Ok(None),
            Some(limit) => Ok(Some(limit)),
            None => {
                let value = std::env::var_os(LAUNCH_TIMEOUT_ENV);
                match value.as_deref().map(|v| v.to_str()) {
                    None => launch_timeout_from_env_value(None),
                    Some(Some(text)) => launch_timeout_from_env_value(Some(text)),
                    Some(None) => Err(format!(
                        "{LAUNCH_TIMEOUT_ENV} is not valid UTF-8: give seconds, such as 2.5, or 0 for none"
                    )),
                }
            }
        }
    }
}

/// What went wrong inside an emulated launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmulatorFault {
    /// `__syncthreads` not reached by every thread, or reached at different sites.
    BarrierDivergence,
    /// No thread could run while some were still waiting.
    Deadlock,
    /// A warp intrinsic used with an inconsistent mask, an exited lane, or a bad width.
    WarpMisuse,
    /// An access outside every device allocation, or past the end of one.
    MemoryFault,
    /// A thread overflowed its fiber stack.
    StackOverflow,
    /// A launch shape the emulator rejects.
    BadLaunch,
    /// The launch ran past its time limit ([`SimtConfig::launch_timeout`]): a thread that
    /// never finishes, such as an endless loop or a spin-wait on memory nothing writes.
    Timeout,
}

/// A kernel failure caught by the emulator.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("kernel `{kernel}`, block ({}, {}, {}){}{}: {fault:?}: {message}",
        block[0], block[1], block[2],
        thread.map(|t| format!(", thread ({}, {}, {})", t[0], t[1], t[2])).unwrap_or_default(),
        site.as_ref().map(|s| format!(" at {s}")).unwrap_or_default())]
pub struct EmulatorError {
    /// The kind of failure.
    pub fault: EmulatorFault,
    /// Kernel name.
    pub kernel: String,
    /// The failing block.
    pub block: [u32; 3],
    /// The failing thread, when one is to blame.
    pub thread: Option<[u32; 3]>,
    /// `file:line` of the barrier or intrinsic involved, when known.
    pub site: Option<String>,
    /// What happened, in words.
    pub message: String,
}

#[repr(C)]
struct LaunchDesc {
    entry: simt_entries::Entry,
    kernel: *const c_char,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_bytes: c_uint,
    params: *const *mut c_void,
    lane_order: c_int,
    seed: c_ulonglong,
    workers: c_uint,
    /// Milliseconds; 0: no limit. The last field, as in `simt_launch_desc`.
    timeout_ms: c_ulonglong,
}

#[repr(C)]
struct RawError {
    kind: c_int,
    has_thread: c_int,
    block: [c_uint; 3],
    thread: [c_uint; 3],
    line: c_int,
    file: [c_char; 160],
    message: [c_char; 512],
}

#[cfg(simt_emulator)]
extern "C" {
    fn simt_launch(desc: *const LaunchDesc, err: *mut RawError) -> c_int;
    fn simt_alloc(bytes: usize, align: usize) -> *mut c_void;
    fn simt_free(p: *mut c_void);
}

/// Whether this build has the emulator (`build/main.rs`: Linux on x86-64 and aarch64).
pub const EMULATOR_BUILT: bool = cfg!(simt_emulator);

// Without the emulator no buffer is ever allocated and no launch starts
// ([`BackendError::NoEmulator`] first), so these are never called: they stand in for the
// runtime's symbols so that the crate links.
#[cfg(not(simt_emulator))]
unsafe fn simt_launch(_: *const LaunchDesc, _: *mut RawError) -> c_int {
    unreachable!("no SIMT emulator in this build")
}
#[cfg(not(simt_emulator))]
unsafe fn simt_alloc(_: usize, _: usize) -> *mut c_void {
    std::ptr::null_mut()
}
#[cfg(not(simt_emulator))]
unsafe fn simt_free(_: *mut c_void) {}

/// One emulated GPU.
#[derive(Debug, Default)]
pub struct SimtDevice {
    ordinal: usize,
    config: Mutex<SimtConfig>,
    /// This handle's own (a clone gets another: handles may launch from several threads).
    scratch: Scratch<SimtDevice>,
}

impl Clone for SimtDevice {
    /// Another handle on the same emulated device (the same ordinal and configuration).
    fn clone(&self) -> Self {
        SimtDevice::with_config(self.ordinal, self.config())
    }
}

impl SimtDevice {
    /// Emulated device number `ordinal`, with the default configuration.
    pub fn new(ordinal: usize) -> Self {
        Self::with_config(ordinal, SimtConfig::default())
    }

    /// Emulated device number `ordinal` with `config`.
    pub fn with_config(ordinal: usize, config: SimtConfig) -> Self {
        SimtDevice {
            ordinal,
            config: Mutex::new(config),
            scratch: Scratch::default(),
        }
    }

    /// This device's number.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The configuration launches use now.
    pub fn config(&self) -> SimtConfig {
        *self.config.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the lane order of later launches.
    pub fn set_lane_order(&self, order: LaneOrder) {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lane_order = order;
    }
}

/// A typed allocation in emulated device memory (host memory whose end touches a guard
/// page, so the first element past the end faults).
pub struct SimtBuffer<T> {
    ptr: NonNull<T>,
    len: usize,
    _owns: PhantomData<T>,
}

// SAFETY: the buffer owns its allocation exclusively, like a Box<[T]>; T is plain data.
unsafe impl<T: DeviceScalar> Send for SimtBuffer<T> {}
// SAFETY: shared references only read, as with &[T].
unsafe impl<T: DeviceScalar> Sync for SimtBuffer<T> {}

impl<T: DeviceScalar> SimtBuffer<T> {
    fn zeroed(len: usize) -> Result<Self, BackendError> {
        if !EMULATOR_BUILT {
            return Err(BackendError::NoEmulator);
        }
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or(BackendError::OutOfMemory { bytes: usize::MAX })?;
        // SAFETY: FFI call; the emulator maps fresh zeroed pages (or returns null).
        let raw = unsafe { simt_alloc(bytes, align_of::<T>()) };
        let ptr = NonNull::new(raw.cast::<T>()).ok_or(BackendError::OutOfMemory { bytes })?;
        Ok(SimtBuffer {
            ptr,
            len,
            _owns: PhantomData,
        })
    }

    fn host(&self) -> &[T] {
        // SAFETY: ptr is a live, aligned allocation of len zero-initialized-or-written Ts,
        // owned by self; launches that write it need &mut self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn host_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `host`, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::fmt::Debug for SimtBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimtBuffer")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<T> Drop for SimtBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: ptr came from simt_alloc and is freed once.
        unsafe { simt_free(self.ptr.as_ptr().cast()) }
    }
}

impl<T: DeviceScalar> DeviceBuffer<T> for SimtBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn device_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
}

fn entry_for(kernel: &'static KernelSignature) -> Result<simt_entries::Entry, BackendError> {
    simt_entries::ENTRIES
        .iter()
        .find(|(sig, _)| {
            std::ptr::eq(*sig, kernel) || (sig.module == kernel.module && sig.name == kernel.name)
        })
        .map(|(_, entry)| *entry)
        .ok_or_else(|| BackendError::NoSuchKernel {
            module: kernel.module.to_string(),
            kernel: kernel.name.to_string(),
        })
}

impl Memory for SimtDevice {
    type Buffer<T: DeviceScalar> = SimtBuffer<T>;
    // A launch returns once the kernel has run: nothing to order.
    crate::no_marks!();

    fn alloc_zeros<T: DeviceScalar>(&self, len: usize) -> Result<SimtBuffer<T>, BackendError> {
        SimtBuffer::zeroed(len)
    }

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<SimtBuffer<T>, BackendError> {
        let mut buf = SimtBuffer::zeroed(host.len())?;
        buf.host_mut().copy_from_slice(host);
        Ok(buf)
    }

    fn copy_in<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut SimtBuffer<T>,
    ) -> Result<(), BackendError> {
        buf.host_mut().copy_from_slice(host);
        Ok(())
    }

    fn download<T: DeviceScalar>(&self, buf: &SimtBuffer<T>) -> Result<Vec<T>, BackendError> {
        Ok(buf.host().to_vec())
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// How many times slower than a GPU the emulator runs a kernel, roughly (a fiber per CUDA
/// thread on a few cores): what timeouts that wait for kernels are scaled by.
pub const SLOWDOWN: u32 = 50;

impl KernelDevice for SimtDevice {
    fn scratch(&self) -> Result<[KernelArg; 2], BackendError> {
        self.scratch.args(self)
    }

    fn slowdown(&self) -> u32 {
        SLOWDOWN
    }

    unsafe fn launch(
        &self,
        kernel: &'static KernelSignature,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        let entry = entry_for(kernel)?;
        // SAFETY: the entry point is the kernel's own (looked up by signature); the rest is
        // the caller's contract, passed on.
        unsafe { self.launch_entry(entry, kernel, cfg, args) }
    }
}

impl SimtDevice {
    /// Runs `entry`, the emulator entry point of `kernel`, after checking the launch.
    ///
    /// # Safety
    /// `entry` must unpack exactly `kernel`'s parameters; otherwise as [`KernelDevice::launch`].
    pub(crate) unsafe fn launch_entry(
        &self,
        entry: simt_entries::Entry,
        kernel: &KernelSignature,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        if !EMULATOR_BUILT {
            return Err(BackendError::NoEmulator);
        }
        check_launch(kernel, &cfg, args)?;
        // kernelParams: one pointer per argument, to that argument's value. Every argument
        // is at most 8 bytes; smaller ones sit in the low bytes (little-endian).
        let mut values: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                KernelArg::Ptr { addr: v, .. } | KernelArg::U64(v) => v,
                KernelArg::F32(v) => u64::from(v.to_bits()),
                KernelArg::F64(v) => v.to_bits(),
                KernelArg::I32(v) => u64::from(v as u32),
                KernelArg::U32(v) => u64::from(v),
                KernelArg::I64(v) => v as u64,
            })
            .collect();
        let params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        let name = std::ffi::CString::new(kernel.name).unwrap_or_default();
        let config = self.config();
        let timeout =
            config
                .effective_launch_timeout()
                .map_err(|detail| BackendError::BadLaunch {
                    kernel: kernel.name.to_string(),
                    detail,
                })?;
        // Rounded up to whole milliseconds (a limit never becomes 0, which means none); one
        // beyond u64 milliseconds is none in practice, and the emulator treats it so.
        let timeout_ms = timeout.map_or(0, |limit| {
            u64::try_from(limit.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        });
        let (lane_order, seed) = match config.lane_order {
            LaneOrder::Forward => (0, 0),
            LaneOrder::Reverse => (1, 0),
            LaneOrder::Random(seed) => (2, seed),
        };
        let desc = LaunchDesc {
            entry,
            kernel: name.as_ptr(),
            grid: [cfg.grid.0, cfg.grid.1, cfg.grid.2],
            block: [cfg.block.0, cfg.block.1, cfg.block.2],
            shared_bytes: cfg.shared_bytes,
            params: params.as_ptr(),
            lane_order,
            seed,
            workers: config.workers,
            timeout_ms,
        };
        let mut raw = RawError {
            kind: 0,
            has_thread: 0,
            block: [0; 3],
            thread: [0; 3],
            line: 0,
            file: [0; 160],
            message: [0; 512],
        };
        // SAFETY: desc and raw are valid for the call; params point at `values`, which
        // outlive it; the entry point matches the kernel and pointer arguments and bounds
        // are the caller's contract (this function's and `KernelDevice::launch`'s).
        let status = unsafe { simt_launch(&desc, &mut raw) };
        if status == 0 {
            return Ok(());
        }
        let fault = match raw.kind {
            1 => EmulatorFault::BarrierDivergence,
            2 => EmulatorFault::Deadlock,
            3 => EmulatorFault::WarpMisuse,
            4 => EmulatorFault::MemoryFault,
            5 => EmulatorFault::StackOverflow,
            7 => EmulatorFault::Timeout,
            _ => EmulatorFault::BadLaunch,
        };
        let file = c_text(&raw.file);
        let mut message = c_text(&raw.message);
        if fault == EmulatorFault::Timeout {
            message.push_str(&format!(
                " (if the kernel is only slow, raise SimtConfig::launch_timeout or {LAUNCH_TIMEOUT_ENV})"
            ));
        }
        Err(BackendError::Emulator(Box::new(EmulatorError {
            fault,
            kernel: kernel.name.to_string(),
            block: raw.block,
            thread: (raw.has_thread != 0).then_some(raw.thread),
            site: (!file.is_empty()).then(|| format!("{file}:{}", raw.line)),
            message,
        })))
    }
}

/// Two lane orders produced different bytes: a race (a missing barrier, or a read of
/// shared memory no thread wrote).
#[derive(Debug, Error)]
pub enum OrderDependence {
    /// The run itself failed.
    #[error(transparent)]
    Failed(#[from] BackendError),
    /// Outputs differ.
    #[error("output depends on the lane order: {first:?} and {second:?} differ at {mismatches} of {len} elements (first at index {index})")]
    Differs {
        /// One order.
        first: LaneOrder,
        /// The other.
        second: LaneOrder,
        /// How many elements differ.
        mismatches: usize,
        /// Output length.
        len: usize,
        /// First differing index.
        index: usize,
    },
}

/// Runs `run` on a fresh device per lane order in `orders` and returns the output if every
/// order produced the same bytes. Use at least two orders; forward and reverse expose most
/// missing barriers, a random order the rest.
pub fn same_under_lane_orders<T: bytemuck::Pod>(
    orders: &[LaneOrder],
    mut run: impl FnMut(&SimtDevice) -> Result<Vec<T>, BackendError>,
) -> Result<Vec<T>, OrderDependence> {
    let mut reference: Option<(LaneOrder, Vec<T>)> = None;
    for &order in orders {
        let dev = SimtDevice::with_config(
            0,
            SimtConfig {
                lane_order: order,
                workers: 0,
                ..Default::default()
            },
        );
        let out = run(&dev)?;
        match &reference {
            None => reference = Some((order, out)),
            Some((first, expected)) => {
                let a: &[u8] = bytemuck::cast_slice(expected);
                let b: &[u8] = bytemuck::cast_slice(&out);
                if a != b {
                    let size = size_of::<T>();
                    let differing: Vec<usize> = (0..expected.len().min(out.len()))
                        .filter(|&i| a[i * size..(i + 1) * size] != b[i * size..(i + 1) * size])
                        .collect();
                    return Err(OrderDependence::Differs {
                        first: *first,
                        second: order,
                        mismatches: differing.len() + expected.len().abs_diff(out.len()),
                        len: expected.len(),
                        index: differing
                            .first()
                            .copied()
                            .unwrap_or(expected.len().min(out.len())),
                    });
                }
            }
        }
    }
    Ok(reference.map(|(_, out)| out).unwrap_or_default())
}
