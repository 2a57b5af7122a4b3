//! Shared test support: random inputs, tolerances, the per-backend instantiation macro, the
//! float64 reference (`reference.rs`), and running the binary (`cli.rs`).

#![allow(dead_code, unused_macros, unused_imports)]

#[cfg(feature = "cli")]
pub mod cli;
pub mod lenet64;
pub mod reference;

use half::f16;
use nanoddp::backend::{Backend, Conv2dShape, Pool2dShape, Precision};
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Uniform values in [-1, 1) rounded to the storage precision `T`.
pub fn random<T: Precision>(r: &mut impl Rng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| T::from_f32(r.gen_range(-1.0f32..1.0)))
        .collect()
}

pub fn wide<T: Precision>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// `|got - want| <= atol + rtol·mag`, with `mag` the reference's magnitude (`Σ|terms|`, or
/// `|want|` for a single term). NaN never passes, so poisoned outputs are caught.
#[derive(Debug, Clone, Copy)]
pub struct Tol {
    pub atol: f64,
    pub rtol: f64,
}

/// fp32 arithmetic: a few ulps of the sum's magnitude.
pub const F32: Tol = Tol {
    atol: 1e-6,
    rtol: 2e-6,
};
/// Long fp32 reductions (K up to ~10^4 terms).
pub const F32_LONG: Tol = Tol {
    atol: 1e-5,
    rtol: 2e-5,
};
/// Half storage of the result (one rounding to 11 bits) after f32 accumulation.
pub const F16: Tol = Tol {
    atol: 1e-4,
    rtol: 1.5e-3,
};
/// bfloat16 storage of the result (one rounding to 8 bits: at most 2^-9 = 1.95e-3 of its
/// magnitude) after f32 accumulation.
pub const BF16: Tol = Tol {
    atol: 1e-4,
    rtol: 4e-3,
};

pub fn assert_close<T: Precision>(what: &str, got: &[T], want: &[f64], mag: &[f64], tol: Tol) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut bad = Vec::new();
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32() as f64;
        let err = (g - w).abs();
        let bound = tol.atol + tol.rtol * mag[i].max(w.abs());
        if err.is_nan() || err > bound {
            bad.push((i, g, *w, bound));
        }
        if err.is_nan() || err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} of {} elements outside atol {} + rtol {}·|mag|; max error {:e} at {}; first (index, got, want, bound): {:?}",
        bad.len(),
        got.len(),
        tol.atol,
        tol.rtol,
        worst.0,
        worst.1,
        &bad[..bad.len().min(5)]
    );
}

/// Blocks a flat launch may use in the tests. Under the real cap (65,535 blocks) no test
/// buffer needs a second pass of a grid-stride loop, so a loop that strides wrongly would
/// pass; 3 blocks of 256 threads make every loop past 768 elements wrap many times, and an
/// odd count of more than one block makes a wrong start (one that ignores `blockIdx`) or a
/// wrong stride show.
pub const FLAT_MAX_BLOCKS: u32 = 3;

/// Lowers the process-wide flat-launch cap to [`FLAT_MAX_BLOCKS`]. Every test that launches
/// flat kernels calls it first: they all set the same value, so the order in which parallel
/// tests of one binary run changes nothing (and any cap gives correct results).
pub fn small_flat_grids() {
    nanoddp::backend::LaunchConfig::set_flat_max_blocks(FLAT_MAX_BLOCKS);
}

/// GPUs the CUDA stand-in shows the tests: enough for every collective test (up to 8 ranks).
pub const STANDIN_GPUS: &str = "8";

/// Makes the CUDA driver loadable: a real driver if the machine has one, else the CPU
/// stand-in `cargo build` put in `target/<profile>/cuda-standin` (loaded by its full path;
/// cudarc's later `dlopen("libcuda.so.1")` then finds it by its soname). Returns what runs.
pub fn cuda_driver() -> &'static str {
    static WHICH: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    WHICH.get_or_init(|| {
        // SAFETY: loading a shared library runs its initializers; both candidates are
        // CUDA drivers (the machine's, or the stand-in this crate built).
        unsafe {
            if libloading::Library::new("libcuda.so.1").is_ok() {
                return if nanoddp::backend::cuda::is_standin() {
                    "the CPU stand-in (LD_LIBRARY_PATH)"
                } else {
                    "a real GPU"
                };
            }
            if std::env::var_os("NANODDP_STANDIN_GPUS").is_none() {
                std::env::set_var("NANODDP_STANDIN_GPUS", STANDIN_GPUS);
            }
            let path = format!("{}/libcuda.so.1", nanoddp::backend::cuda::STANDIN_DIR);
            let lib = libloading::os::unix::Library::open(
                Some(&path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
            .unwrap_or_else(|e| {
                panic!("no CUDA driver, and the stand-in at {path} does not load: {e}")
            });
            std::mem::forget(lib); // stays loaded for the whole process, as a driver does
        }
        "the CPU stand-in"
    })
}

/// How many CUDA devices the tests have (the stand-in shows [`STANDIN_GPUS`]).
pub fn cuda_gpus() -> usize {
    let driver = cuda_driver();
    nanoddp::backend::cuda::device_count()
        .unwrap_or_else(|e| panic!("counting CUDA devices on {driver}: {e}"))
}

/// CUDA device `ordinal`: on the real driver, or on the stand-in (see [`cuda_driver`]).
/// A CUDA test never skips: if neither works, it fails, saying why.
pub fn cuda_device(ordinal: usize) -> nanoddp::backend::cuda::CudaDevice {
    let driver = cuda_driver();
    nanoddp::backend::cuda::CudaDevice::new(ordinal)
        .unwrap_or_else(|e| panic!("CUDA device {ordinal} on {driver}: {e}"))
}

/// Bytes of a result, for the lane-order comparison on the SIMT backend.
/// Asserts `got` is within `tol` of the float64 reference `want` (see [`assert_close`]) and
/// appends its bytes to `out`, which the tests compare across backends and lane orders.
pub fn check_and_record<T: Precision>(
    what: &str,
    got: &[T],
    want: &reference::Ref,
    tol: Tol,
    out: &mut Vec<u8>,
) {
    assert_close(what, got, &want.value, &want.mag, tol);
    out.extend(bytes(got));
}

/// A convolution's shape, written the way the tests' tables read: batch, input channels,
/// input (height, width), output channels, filter (height, width), stride, padding.
pub fn conv_shape(
    batch: usize,
    in_c: usize,
    (in_h, in_w): (usize, usize),
    out_c: usize,
    (k_h, k_w): (usize, usize),
    stride: usize,
    pad: usize,
) -> Conv2dShape {
    Conv2dShape {
        batch,
        in_c,
        in_h,
        in_w,
        out_c,
        k_h,
        k_w,
        stride,
        pad,
    }
}

/// A pooling's shape, written the way the tests' tables read: planes, input (height,
/// width), window (height, width), stride.
pub fn pool_shape(
    planes: usize,
    (in_h, in_w): (usize, usize),
    (k_h, k_w): (usize, usize),
    stride: usize,
) -> Pool2dShape {
    Pool2dShape {
        planes,
        in_h,
        in_w,
        k_h,
        k_w,
        stride,
    }
}

/// Downloads `buf` from `dev`, then [`check_and_record`]s it.
pub fn check_download<B: Backend, T: Precision>(
    dev: &B,
    buf: &B::Buffer<T>,
    what: &str,
    want: &reference::Ref,
    tol: Tol,
    out: &mut Vec<u8>,
) {
    let got = dev.download(buf).unwrap();
    check_and_record(what, &got, want, tol, out);
}

pub fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

pub fn half_bits(v: &[f16]) -> Vec<u8> {
    bytes(v)
}

/// Instantiates a test body `fn body<B: Backend>(dev: &B) -> Vec<u8>` (returning the bytes
/// of everything it computed) once per backend: the native CPU backend, at every level its
/// CPU runs (`isa::levels`: the portable, AVX2 and AVX-512 engines, the bf16 paths); the SIMT emulator
/// under forward and reverse lane order, which must also agree bit for bit; and the CUDA
/// backend, on a GPU when there is one and on the CPU stand-in for the driver otherwise
/// (never skipped: see [`cuda_device`]). The kernel instances run with
/// [`small_flat_grids`], so grid-stride loops take several passes.
macro_rules! per_backend {
    // Bodies whose results come from transcendental functions (expf, logf): libdevice's, whose
    // PTX the PTX executor runs, and the host's libm may differ in the last bit, so the CUDA
    // test checks them against float64 within their tolerances only, not bit for bit against
    // the SIMT executor.
    (approximate: $($body:ident),* $(,)?) => {
        $( crate::common::per_backend!(@one $body, false); )*
    };
    ($($body:ident),* $(,)?) => {
        $( crate::common::per_backend!(@one $body, true); )*
    };
    (@one $body:ident, $bit_for_bit:expr) => {
        mod $body {
            /// Every level of the CPU backend this CPU runs (each engine), in this process.
            #[test]
            fn cpu() {
                for (level, _) in nanoddp::backend::cpu::isa::levels() {
                    println!("CPU backend at level {level}");
                    let dev = nanoddp::backend::cpu::CpuDevice::with_level(level)
                        .expect("a level this CPU runs");
                    super::$body(&dev);
                }
            }

            #[test]
            #[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
            fn simt_forward_and_reverse_lane_order() {
                use nanoddp::backend::simt::{same_under_lane_orders, LaneOrder};
                crate::common::small_flat_grids();
                let _lean = crate::common::Lean::always();
                same_under_lane_orders(&[LaneOrder::Forward, LaneOrder::Reverse], |dev| Ok(super::$body(dev)))
                    .unwrap_or_else(|e| panic!("{e}"));
            }

            #[test]
            #[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
            fn cuda() {
                crate::common::small_flat_grids();
                let _lean = crate::common::Lean::on_the_ptx_executor();
                let got = super::$body(&crate::common::cuda_device(0));
                if $bit_for_bit {
                    crate::common::same_bits_as_the_simt_executor(stringify!($body), &got, super::$body);
                }
            }
        }
    };
}
pub(crate) use per_backend;

thread_local! {
    static LEAN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the CUDA driver is the stand-in and runs kernels on its PTX executor in this
/// process (`NANODDP_STANDIN_EXEC=ptx`).
pub fn on_the_ptx_executor() -> bool {
    static PTX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PTX.get_or_init(|| {
        cuda_driver(); // loads the stand-in where the machine has no driver
        nanoddp::backend::cuda::standin_executor().is_some_and(|e| e == "PTX executor")
    })
}

/// While alive, the kernel tests on this thread run their lean sizes (see [`sized`]). The
/// PTX executor interprets every instruction of the PTX nvcc emitted, tens of times slower
/// than the SIMT executor runs the same kernels; its pass exists to show that the code a GPU
/// receives computes, bit for bit, what the source computes under the emulator (and both
/// against float64), which every code path of a kernel shows at a small size as well as at a
/// large one. So a CUDA instance on the PTX executor shrinks batches and output channels (loop
/// counts and grid sizes), never what picks a kernel's branches: ragged tiles, strides,
/// padding, the chunks of input channels, every dtype, and the grid-stride wraps of
/// [`small_flat_grids`]. The SIMT executor, the CPU backend and a real GPU run every test at
/// full size; the SIMT pass that runs each test again under other lane orders runs it lean
/// ([`Lean::always`]).
pub struct Lean {
    was: bool,
}

impl Lean {
    /// Lean sizes on this thread when [`on_the_ptx_executor`], unchanged otherwise.
    pub fn on_the_ptx_executor() -> Lean {
        Lean::when(on_the_ptx_executor())
    }

    /// Lean sizes on this thread whatever runs the kernels: for the pass that runs each test
    /// under the SIMT emulator's other lane orders, whose point (a result that depends on the
    /// order a warp's lanes run in: a race, a missing barrier) shows inside each block at any
    /// batch. The `cuda` instance runs the same kernels at full size.
    pub fn always() -> Lean {
        Lean::when(true)
    }

    /// Lean sizes on this thread if `lean` (or already lean), until the guard drops.
    fn when(lean: bool) -> Lean {
        Lean {
            was: LEAN.with(|l| l.replace(l.get() || lean)),
        }
    }
}

impl Drop for Lean {
    fn drop(&mut self) {
        LEAN.with(|l| l.set(self.was));
    }
}

/// `full`, or `lean` while a [`Lean`] guard is alive on this thread: a count (a batch, output
/// channels) whose larger value adds work but no code path.
pub fn sized(full: usize, lean: usize) -> usize {
    if LEAN.with(|l| l.get()) {
        lean
    } else {
        full
    }
}

/// The stand-in's GPU that [`same_bits_as_the_simt_executor`] runs the SIMT executor on, when
/// the others run the PTX executor: the last one the tests are shown.
pub const SIMT_TWIN_GPU: usize = 7;

/// On the stand-in under `NANODDP_STANDIN_EXEC=ptx`, runs `body` again on a GPU that the
/// SIMT executor serves ([`SIMT_TWIN_GPU`]) and asserts that the bytes it recorded equal
/// `got`, the PTX executor's: the code nvcc emitted computes bit for bit what the kernels'
/// source computes under the emulator. Every recorded result qualifies: the kernels round
/// exactly and their transcendental functions (loss.cu's expf and logf) agree to the bit
/// between libdevice, whose code the PTX executor runs, and the host's libm on the inputs
/// the tests use — a difference there fails this too and would show which. Elsewhere (the
/// SIMT executor, a real GPU) there is nothing to compare, and it returns.
pub fn same_bits_as_the_simt_executor(
    what: &str,
    got: &[u8],
    body: impl FnOnce(&nanoddp::backend::cuda::CudaDevice) -> Vec<u8>,
) {
    let ptx = std::env::var("NANODDP_STANDIN_EXEC").is_ok_and(|v| v == "ptx");
    if !ptx || !nanoddp::backend::cuda::is_standin() {
        return;
    }
    static TWIN: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    TWIN.get_or_init(|| standin_use_executor(SIMT_TWIN_GPU, "simt", false));
    let want = body(&cuda_device(SIMT_TWIN_GPU));
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: result sizes differ between executors"
    );
    if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!(
            "{what}: the PTX executor's result differs from the SIMT executor's first at byte {i} \
             of {} ({:#04x} vs {:#04x})",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// Makes the stand-in run modules loaded on `gpu` from now on with `executor` ("simt" or
/// "ptx"; `reverse_lanes`: each block's threads last to first, PTX executor only).
pub fn standin_use_executor(gpu: usize, executor: &str, reverse_lanes: bool) {
    let name = std::ffi::CString::new(executor).expect("no NUL");
    cudarc::driver::result::init().expect("cuInit on the stand-in");
    // SAFETY: the stand-in is loaded (the caller checked is_standin); plain values and a
    // NUL-terminated string that outlives the call.
    let code = unsafe {
        let f = cudarc::driver::sys::culib()
            .get::<unsafe extern "C" fn(i32, *const std::ffi::c_char, i32) -> i32>(
                b"nanoddpStandinUseExecutor\0",
            )
            .expect("the stand-in exports nanoddpStandinUseExecutor");
        f(gpu as i32, name.as_ptr(), i32::from(reverse_lanes))
    };
    assert_eq!(
        code, 0,
        "nanoddpStandinUseExecutor({gpu}, {executor}, {reverse_lanes})"
    );
}

/// `selftest::bounded_iota` is compiled with `__launch_bounds__(64, 2)`: on `dev`, a block of
/// 128 threads must be refused before the kernel runs, with an error naming the kernel and
/// both numbers, and blocks of 64 must run.
pub fn launch_bounds_are_enforced<D: nanoddp::backend::KernelDevice>(dev: &D) {
    use nanoddp::backend::{BackendError, LaunchConfig};
    use nanoddp::kernels::selftest::{bounded_iota, BOUNDED_IOTA};
    assert_eq!(
        (BOUNDED_IOTA.max_threads, BOUNDED_IOTA.min_blocks),
        (Some(64), Some(2))
    );
    let blocks = |grid: u32, threads: u32| LaunchConfig {
        grid: (grid, 1, 1),
        block: (threads, 1, 1),
        shared_bytes: 0,
    };
    let mut out = dev.alloc_zeros::<u32>(256).unwrap();
    // SAFETY: 2 blocks of 128 threads over 256 elements, had it run.
    let refused = unsafe { bounded_iota(dev, blocks(2, 128), &mut out, 256) };
    match refused {
        Err(e @ BackendError::BadLaunch { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("bounded_iota") && text.contains("128") && text.contains("(64)"),
                "{text}"
            );
        }
        other => panic!("a 128-thread block of a 64-thread kernel launched: {other:?}"),
    }
    assert_eq!(dev.download(&out).unwrap(), vec![0; 256], "nothing ran");
    // SAFETY: 4 blocks of 64 threads over 256 elements.
    unsafe { bounded_iota(dev, blocks(4, 64), &mut out, 256) }.expect("within the bounds");
    assert_eq!(dev.download(&out).unwrap(), (0..256).collect::<Vec<u32>>());
}
