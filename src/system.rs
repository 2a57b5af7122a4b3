//! What the host CPU is: core count, model, and the SIMD extensions the CPU paths can use.

/// A description of the host CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuInfo {
    /// Model name from `/proc/cpuinfo`, when readable.
    pub model: Option<String>,
    /// Hardware threads this process may use.
    pub threads: usize,
    /// SIMD extensions detected at run time, e.g. `avx2`, `fma`, `f16c`.
    pub simd: Vec<&'static str>,
}

/// Reads the host CPU's description. Never fails; unknown fields are left empty.
pub fn cpu_info() -> CpuInfo {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
    CpuInfo {
        model,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        simd: simd_features(),
    }
}

#[cfg(target_arch = "x86_64")]
fn simd_features() -> Vec<&'static str> {
    let mut found = Vec::new();
    macro_rules! probe {
        ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { found.push($f); } )* };
    }
    probe!(
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512bf16",
        "avx512fp16"
    );
    found
}

#[cfg(target_arch = "aarch64")]
fn simd_features() -> Vec<&'static str> {
    let mut found = Vec::new();
    macro_rules! probe {
        ($($f:tt),*) => { $( if std::arch::is_aarch64_feature_detected!($f) { found.push($f); } )* };
    }
    probe!("neon", "fp16", "sve", "sve2");
    found
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd_features() -> Vec<&'static str> {
    Vec::new()
}

/// Measured peak f32 throughput of this CPU: FMAs on independent registers, one thread per
/// core, nothing read from memory. The ceiling any f32 kernel here can approach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeakFlops {
    /// Vector width used, e.g. `"AVX-512 FMA"`.
    pub isa: &'static str,
    /// GFLOP/s on one thread.
    pub single_thread: f64,
    /// GFLOP/s with all threads busy.
    pub all_threads: f64,
    /// Threads used for `all_threads`.
    pub threads: usize,
}

/// Measures [`PeakFlops`] (about half a second of work).
pub fn measure_peak_flops() -> PeakFlops {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (isa, flops_per_iter, run): (&'static str, f64, fn(u64) -> f32) = peak_kernel();
    let iters = 20_000_000u64;
    let time = |n: usize| {
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n).map(|_| s.spawn(move || run(iters))).collect();
            let sink: f32 = handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum();
            std::hint::black_box(sink);
        });
        start.elapsed().as_secs_f64()
    };
    time(1); // warm up clocks
    let one = iters as f64 * flops_per_iter / time(1) / 1e9;
    let all = threads as f64 * iters as f64 * flops_per_iter / time(threads) / 1e9;
    PeakFlops {
        isa,
        single_thread: one,
        all_threads: all,
        threads,
    }
}

#[cfg(target_arch = "x86_64")]
fn peak_kernel() -> (&'static str, f64, fn(u64) -> f32) {
    use std::arch::x86_64::*;
    const ACC: usize = 12; // enough independent chains to cover FMA latency x 2 ports

    // The loop of every vector width: `ACC` chains of `iters` steps `x = x·A + B`, in the
    // vectors that `$splat` makes and `$fma` multiplies and adds. A macro, not a function:
    // it expands inside each `#[target_feature]` function, so the intrinsics inline there.
    macro_rules! fma_chains {
        ($splat:ident, $fma:ident, $iters:expr) => {{
            let mut acc = [$splat(0.0); ACC];
            let (a, b) = ($splat(FMA_A), $splat(FMA_B));
            for _ in 0..$iters {
                for r in acc.iter_mut() {
                    *r = $fma(*r, a, b);
                }
            }
            acc
        }};
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(iters: u64) -> f32 {
        let acc = fma_chains!(_mm512_set1_ps, _mm512_fmadd_ps, iters);
        acc.iter().map(|r| _mm512_reduce_add_ps(*r)).sum()
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(iters: u64) -> f32 {
        let acc = fma_chains!(_mm256_set1_ps, _mm256_fmadd_ps, iters);
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(
            out.as_mut_ptr(),
            acc.iter()
                .fold(_mm256_set1_ps(0.0), |s, r| _mm256_add_ps(s, *r)),
        );
        out.iter().sum()
    }

    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked on the line above).
        (("AVX-512 FMA"), (ACC * 16 * 2) as f64, |n| unsafe {
            avx512(n)
        })
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU supports AVX2 and FMA (checked on the line above).
        ("AVX2 FMA", (ACC * 8 * 2) as f64, |n| unsafe { avx2(n) })
    } else {
        ("scalar", 2.0, scalar_peak)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn peak_kernel() -> (&'static str, f64, fn(u64) -> f32) {
    ("scalar", 2.0, scalar_peak)
}

/// The peak loop's step `x = x·FMA_A + FMA_B`: it settles at 0.1, never overflowing or
/// going subnormal, whatever the number of steps.
const FMA_A: f32 = 0.999_999;
/// See [`FMA_A`].
const FMA_B: f32 = 1e-7;

#[allow(dead_code)]
fn scalar_peak(iters: u64) -> f32 {
    let mut x = 0.0f32;
    for _ in 0..iters {
        x = std::hint::black_box(x).mul_add(FMA_A, FMA_B);
    }
    x
}

/// Single-thread memory copy bandwidth in bytes/s, counted as bytes read + bytes written
/// (as `../shared/anchors/memcpy_bw.py` counts): the median of five copies of `bytes` bytes
/// into a destination that was touched first. Use a size well past the last-level cache
/// (256 MiB) for the DRAM figure.
pub fn copy_bandwidth(bytes: usize) -> f64 {
    let src = vec![1u8; bytes.max(1)];
    let mut dst = vec![0u8; bytes.max(1)];
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let start = std::time::Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    2.0 * bytes as f64 / times[2]
}

/// Memory the system can give a new allocation without swapping, in bytes: Linux's
/// `MemAvailable` (free memory plus the page cache and reclaimable slabs it can drop), or
/// `None` where it cannot be read.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
