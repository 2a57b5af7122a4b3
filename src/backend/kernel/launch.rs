//! How a kernel device runs a kernel: [`KernelDevice::launch`] with a [`LaunchConfig`] and
//! the arguments as [`KernelArg`]s, checked against the kernel's declaration
//! ([`check_launch`]) by every executor.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::backend::{BackendError, DeviceBuffer, DeviceScalar, Memory};
use crate::kernels::{KernelSignature, ParamKind, Scalar};

/// The grid cap [`LaunchConfig::flat`] applies now; see [`LaunchConfig::set_flat_max_blocks`].
static FLAT_MAX_BLOCKS_NOW: AtomicU32 = AtomicU32::new(LaunchConfig::FLAT_MAX_BLOCKS);

/// Grid and block shape of one launch, as in CUDA's `<<<grid, block, shared>>>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z (at most 1024 in all).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// Threads per block the flat (1-D) kernels use: a multiple of the warp size that keeps
    /// enough warps per SM in flight to hide DRAM latency.
    pub const FLAT_BLOCK: u32 = 256;
    /// Most blocks a flat launch asks for by default; grid-stride loops cover the rest. 65535
    /// blocks of 256 threads is far past the point where every SM of any current GPU is full.
    pub const FLAT_MAX_BLOCKS: u32 = 65_535;

    /// A 1-D launch over `n` elements for a kernel with a grid-stride loop: one thread per
    /// element up to the cap ([`FLAT_MAX_BLOCKS`](Self::FLAT_MAX_BLOCKS) blocks unless
    /// [`set_flat_max_blocks`](Self::set_flat_max_blocks) changed it), the loop covers the rest.
    pub fn flat(n: usize) -> Self {
        Self::flat_capped(n, Self::flat_max_blocks())
    }

    /// One block of one warp: for a kernel whose thread 0 does a little bookkeeping
    /// (`kernels/step.cu`); a warp, not one thread, since a GPU schedules no less.
    pub fn single() -> Self {
        LaunchConfig {
            grid: (1, 1, 1),
            block: (32, 1, 1),
            shared_bytes: 0,
        }
    }

    /// The most blocks [`flat`](Self::flat) asks for now.
    pub fn flat_max_blocks() -> u32 {
        FLAT_MAX_BLOCKS_NOW.load(Ordering::Relaxed)
    }

    /// Sets the most blocks [`flat`](Self::flat) asks for, for every launch of this process
    /// from now on, and returns the previous cap. `blocks` is clamped to `1..=2^31 - 1`
    /// (CUDA's grid limit in x).
    ///
    /// This exists for tests: no buffer in a test suite is big enough to need a second pass
    /// of a grid-stride loop under the real cap (65,535 blocks of 256 threads is 16.8 M
    /// elements), so a loop that strides wrongly would pass every test. With a cap of a few
    /// blocks every loop runs many passes. Any cap is correct, only slower, so test threads
    /// running in parallel may share one process-wide value.
    pub fn set_flat_max_blocks(blocks: u32) -> u32 {
        let blocks = blocks.clamp(1, i32::MAX as u32);
        FLAT_MAX_BLOCKS_NOW.swap(blocks, Ordering::Relaxed)
    }

    fn flat_capped(n: usize, max_blocks: u32) -> Self {
        let block = Self::FLAT_BLOCK;
        let blocks = n.div_ceil(block as usize).clamp(1, max_blocks as usize);
        LaunchConfig {
            grid: (blocks as u32, 1, 1),
            block: (block, 1, 1),
            shared_bytes: 0,
        }
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        u64::from(self.block.0) * u64::from(self.block.1) * u64::from(self.block.2)
    }

    /// Checks the limits every CUDA device since sm_30 shares; a backend may check more.
    pub fn validate(&self, kernel: &str) -> Result<(), BackendError> {
        let bad = |detail: String| BackendError::BadLaunch {
            kernel: kernel.to_string(),
            detail,
        };
        let (gx, gy, gz) = self.grid;
        let (bx, by, bz) = self.block;
        if gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 {
            return Err(bad(format!(
                "zero-sized grid {:?} or block {:?}",
                self.grid, self.block
            )));
        }
        if gx > i32::MAX as u32 || gy > 65_535 || gz > 65_535 {
            return Err(bad(format!(
                "grid {:?} exceeds (2^31-1, 65535, 65535)",
                self.grid
            )));
        }
        if bx > 1024 || by > 1024 || bz > 64 || self.threads_per_block() > 1024 {
            return Err(bad(format!(
                "block {:?} exceeds 1024 threads (or (1024, 1024, 64) per dimension)",
                self.block
            )));
        }
        Ok(())
    }
}

/// One kernel argument, in CUDA's by-value parameter encoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// A device address, with the element type and access it was taken with, so a launch
    /// can check it against the parameter (0 is null, accepted only by `*_or_null`).
    Ptr {
        /// The address.
        addr: u64,
        /// Element type of the buffer it points into.
        elem: Scalar,
        /// Taken from a `&mut` buffer: the kernel may write through it.
        mutable: bool,
    },
    /// `float`
    F32(f32),
    /// `double`
    F64(f64),
    /// `int`
    I32(i32),
    /// `unsigned int`
    U32(u32),
    /// `long long`
    I64(i64),
    /// `unsigned long long`
    U64(u64),
}

impl KernelArg {
    /// A buffer the kernel reads.
    pub fn buffer<T: DeviceScalar>(buf: &impl DeviceBuffer<T>) -> Self {
        KernelArg::Ptr {
            addr: buf.device_addr(),
            elem: T::SCALAR,
            mutable: false,
        }
    }

    /// A buffer the kernel may write.
    pub fn buffer_mut<T: DeviceScalar>(buf: &mut impl DeviceBuffer<T>) -> Self {
        KernelArg::Ptr {
            addr: buf.device_addr(),
            elem: T::SCALAR,
            mutable: true,
        }
    }

    /// An optional buffer the kernel reads; `None` is a null pointer.
    pub fn optional<T: DeviceScalar, B: DeviceBuffer<T>>(buf: Option<&B>) -> Self {
        KernelArg::Ptr {
            addr: buf.map_or(0, |b| b.device_addr()),
            elem: T::SCALAR,
            mutable: false,
        }
    }

    /// An optional buffer the kernel may write; `None` is a null pointer.
    pub fn optional_mut<T: DeviceScalar, B: DeviceBuffer<T>>(buf: Option<&mut B>) -> Self {
        KernelArg::Ptr {
            addr: buf.map_or(0, |b| b.device_addr()),
            elem: T::SCALAR,
            mutable: true,
        }
    }

    /// Whether this argument can be passed for parameter kind `kind` (nullability aside).
    pub fn fits(&self, kind: ParamKind) -> bool {
        match (*self, kind) {
            (KernelArg::Ptr { elem, .. }, ParamKind::ConstPtr(s)) => elem == s,
            (KernelArg::Ptr { elem, mutable, .. }, ParamKind::MutPtr(s)) => elem == s && mutable,
            (arg, kind) => matches!(
                (arg, kind),
                (KernelArg::F32(_), ParamKind::Value(Scalar::F32))
                    | (KernelArg::F64(_), ParamKind::Value(Scalar::F64))
                    | (KernelArg::I32(_), ParamKind::Value(Scalar::I32))
                    | (KernelArg::U32(_), ParamKind::Value(Scalar::U32))
                    | (KernelArg::I64(_), ParamKind::Value(Scalar::I64))
                    | (KernelArg::U64(_), ParamKind::Value(Scalar::U64))
            ),
        }
    }
}

/// Checks `args` against the kernel's declared parameters and `cfg` against CUDA's limits.
/// Backends call this before every launch; the typed launchers can never fail it, raw
/// [`KernelDevice::launch`] callers can.
pub(crate) fn check_launch(
    kernel: &KernelSignature,
    cfg: &LaunchConfig,
    args: &[KernelArg],
) -> Result<(), BackendError> {
    cfg.validate(kernel.name)?;
    if let Some(max) = kernel.max_threads {
        if cfg.threads_per_block() > u64::from(max) {
            return Err(BackendError::BadLaunch {
                kernel: kernel.name.to_string(),
                detail: format!(
                    "{} threads per block, but the kernel is compiled with __launch_bounds__({max})",
                    cfg.threads_per_block()
                ),
            });
        }
    }
    if args.len() != kernel.params.len() {
        return Err(BackendError::BadArguments {
            kernel: kernel.name.to_string(),
            detail: format!(
                "expected {} arguments, got {}",
                kernel.params.len(),
                args.len()
            ),
        });
    }
    for (i, (arg, param)) in args.iter().zip(kernel.params).enumerate() {
        if let KernelArg::Ptr { addr: 0, .. } = arg {
            if !param.name.ends_with("_or_null") {
                return Err(BackendError::BadArguments {
                    kernel: kernel.name.to_string(),
                    detail: format!("argument {i} (`{}`) may not be null", param.name),
                });
            }
        }
        if !arg.fits(param.kind) {
            return Err(BackendError::BadArguments {
                kernel: kernel.name.to_string(),
                detail: format!(
                    "argument {i} (`{}`) is declared {:?} but got {arg:?}",
                    param.name, param.kind
                ),
            });
        }
    }
    Ok(())
}

/// A device that launches kernels (the embedded ones, or a user's) on its [`Memory`]: the
/// CUDA backend and the SIMT emulator. Every [`Backend`](crate::backend::Backend) operation
/// comes with it, by launching `kernels/*.cu` (`kernel/ops.rs`).
pub trait KernelDevice: Memory {
    /// Lets kernels on this device dereference `peer`'s memory (CUDA peer access). Devices
    /// that share one address space (the SIMT emulator's) need nothing.
    fn enable_peer_access(&self, peer: &Self) -> Result<(), BackendError> {
        let _ = peer;
        Ok(())
    }

    /// How many times slower than the GPU it models this device runs its kernels: 1 on real
    /// hardware. Timeouts that wait for kernels (a collective waiting for a peer) scale by it.
    fn slowdown(&self) -> u32 {
        1
    }

    /// Makes `module`'s kernels ready to launch now rather than at their first launch (a GPU
    /// may JIT-compile a module for seconds: not something to do inside a timed collective).
    fn preload(&self, module: &'static crate::kernels::KernelModule) -> Result<(), BackendError> {
        let _ = module;
        Ok(())
    }

    /// Runs `kernel` with `args` in parameter order. Launches are asynchronous in the CUDA
    /// sense: ordered with this device's other work, finished by the next synchronizing call.
    ///
    /// # Safety
    /// Pointer arguments must be addresses of live buffers of this backend (or of a peer the
    /// backend lets kernels read), and the kernel must stay inside them given the scalar
    /// arguments. Prefer the typed launchers in [`crate::kernels`] and the safe operations
    /// built on them; both check everything but the kernel's own index bounds.
    unsafe fn launch(
        &self,
        kernel: &'static KernelSignature,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), BackendError>;

    /// This handle's [`Scratch`] area, as kernel arguments: its floats and its counters.
    fn scratch(&self) -> Result<[KernelArg; 2], BackendError>;
}

/// Floats of partial results in a [`Scratch`] area.
pub const SCRATCH_FLOATS: usize = 1 << 20;
/// Counters in a [`Scratch`] area, zero between launches.
pub const SCRATCH_COUNTERS: usize = 4096;

/// Device memory a handle's kernels share, one launch at a time (work on one queue is
/// ordered): [`SCRATCH_FLOATS`] floats for partial results (the split reductions of the
/// filter gradients in `kernels/conv.cu` and `kernels/conv_direct.cu` and of
/// `kernels/loss.cu`'s head, added back in a fixed order by `kernels/split_sum.cuh`), and
/// [`SCRATCH_COUNTERS`] ints that are zero between launches (a kernel that counts in them
/// resets them before it ends). Allocated the first time a kernel asks for it, which in
/// training is a step's first run, from the stream: never inside a graph capture.
pub struct Scratch<M: Memory> {
    area: Mutex<Option<ScratchArea<M>>>,
}

/// A [`Scratch`] area once made: the floats, the counters.
type ScratchArea<M> = (<M as Memory>::Buffer<f32>, <M as Memory>::Buffer<i32>);

impl<M: Memory> std::fmt::Debug for Scratch<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let made = self
            .area
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("Scratch").field("made", &made).finish()
    }
}

impl<M: Memory> Default for Scratch<M> {
    fn default() -> Self {
        Scratch {
            area: Mutex::new(None),
        }
    }
}

impl<M: Memory> Scratch<M> {
    /// The area on `dev` (made on the first call) as kernel arguments: `float*`, `int*`.
    pub fn args(&self, dev: &M) -> Result<[KernelArg; 2], BackendError> {
        let mut area = self.area.lock().unwrap_or_else(PoisonError::into_inner);
        if area.is_none() {
            *area = Some((
                dev.alloc_zeros::<f32>(SCRATCH_FLOATS)?,
                dev.alloc_zeros::<i32>(SCRATCH_COUNTERS)?,
            ));
        }
        let (floats, counters) = area.as_mut().expect("made above");
        Ok([
            KernelArg::buffer_mut(floats),
            KernelArg::buffer_mut(counters),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::elementwise::AXPY_F32;

    #[test]
    fn flat_launches_cover_every_element_or_stride_over_it() {
        // Through `flat_capped`: the process-wide cap is not touched here, since other unit
        // tests of this binary launch flat kernels at the same time.
        for cap in [1, 3, LaunchConfig::FLAT_MAX_BLOCKS] {
            for n in [
                0usize,
                1,
                255,
                256,
                257,
                3 * 256 + 1,
                65_535 * 256,
                65_535 * 256 + 1,
                1 << 33,
            ] {
                let cfg = LaunchConfig::flat_capped(n, cap);
                cfg.validate("flat").expect("flat shapes are valid");
                let threads = u64::from(cfg.grid.0) * cfg.threads_per_block();
                assert!(cfg.grid.0 <= cap, "cap={cap} n={n} cfg={cfg:?}");
                // Either one thread per element, or the capped grid the grid-stride loop covers.
                assert!(
                    threads >= n as u64 || cfg.grid.0 == cap,
                    "cap={cap} n={n} cfg={cfg:?}"
                );
                assert!(threads < n as u64 + 256 || n == 0 || cfg.grid.0 == cap);
            }
        }
        // No unit test of the library lowers the cap, so here it is the GPU default.
        assert_eq!(
            LaunchConfig::flat_max_blocks(),
            LaunchConfig::FLAT_MAX_BLOCKS
        );
        assert_eq!(
            LaunchConfig::flat(1 << 33).grid.0,
            LaunchConfig::FLAT_MAX_BLOCKS
        );
    }

    #[test]
    fn impossible_shapes_are_rejected() {
        let ok = LaunchConfig {
            grid: (1, 1, 1),
            block: (1024, 1, 1),
            shared_bytes: 0,
        };
        ok.validate("k").expect("1024 threads is legal");
        let block = |block| LaunchConfig { block, ..ok };
        let grid = |grid| LaunchConfig { grid, ..ok };
        for bad in [
            block((1025, 1, 1)),
            block((32, 32, 2)),
            block((0, 1, 1)),
            grid((1, 0, 1)),
            grid((1, 65_536, 1)),
        ] {
            assert!(
                matches!(bad.validate("k"), Err(BackendError::BadLaunch { .. })),
                "{bad:?}"
            );
        }
    }

    fn ptr(addr: u64, elem: Scalar, mutable: bool) -> KernelArg {
        KernelArg::Ptr {
            addr,
            elem,
            mutable,
        }
    }

    #[test]
    fn arguments_are_checked_against_the_declaration() {
        let cfg = LaunchConfig::flat(10);
        // axpy_f32(const float* x, float* y, float alpha, unsigned long long n)
        let good = [
            ptr(16, Scalar::F32, false),
            ptr(32, Scalar::F32, true),
            KernelArg::F32(2.0),
            KernelArg::U64(10),
        ];
        check_launch(&AXPY_F32, &cfg, &good).expect("matches");
        let short = &good[..3];
        let swapped = [
            ptr(16, Scalar::F32, false),
            ptr(32, Scalar::F32, true),
            KernelArg::U64(10),
            KernelArg::F32(2.0),
        ];
        let by_value = [
            KernelArg::F32(0.0),
            ptr(32, Scalar::F32, true),
            KernelArg::F32(2.0),
            KernelArg::U64(10),
        ];
        // y is written: a read-only pointer does not do; nor does a buffer of halves, or null.
        let read_only_y = [good[0], ptr(32, Scalar::F32, false), good[2], good[3]];
        let wrong_elem = [ptr(16, Scalar::F16, false), good[1], good[2], good[3]];
        let null_x = [ptr(0, Scalar::F32, false), good[1], good[2], good[3]];
        for bad in [
            short,
            &swapped[..],
            &by_value[..],
            &read_only_y[..],
            &wrong_elem[..],
            &null_x[..],
        ] {
            assert!(matches!(
                check_launch(&AXPY_F32, &cfg, bad),
                Err(BackendError::BadArguments { .. })
            ));
        }
    }
}
