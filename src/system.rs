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
/// (a copy of S bytes moves 2·S): the median of five copies of `bytes` bytes into one
/// destination (the first copy touches it). Use a size well past the last-level cache
/// (256 MiB) for the DRAM figure.
pub fn copy_bandwidth(bytes: usize) -> f64 {
    copy_rounds(bytes, 1, 0, 5)
}

/// Memory copy bandwidth of `threads` threads at once, in bytes/s counted as
/// [`copy_bandwidth`] counts it: `total` bytes split evenly between the threads, each copying
/// its share into its own destination, round after round, as a collective's ranks move the
/// same bytes iteration after iteration (the data stays in each thread's caches where it
/// fits): the median of nine rounds after two warm-up rounds.
pub fn parallel_copy_bandwidth(total: usize, threads: usize) -> f64 {
    copy_rounds(total, threads, 2, 9)
}

/// `total` bytes copied by `threads` threads, each its share into its own destination, in
/// `warm_up` untimed rounds and then `rounds` timed ones; the rounds start together at a
/// barrier and each takes its slowest thread's copy. Returns bytes/s (read + written) at the
/// median round.
fn copy_rounds(total: usize, threads: usize, warm_up: usize, rounds: usize) -> f64 {
    let threads = threads.max(1);
    let share = total.div_ceil(threads).max(1);
    let start = std::sync::Barrier::new(threads);
    let per_thread: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let copiers: Vec<_> = (0..threads)
            .map(|_| {
                let start = &start;
                scope.spawn(move || {
                    let (src, mut dst) = (vec![1u8; share], vec![0u8; share]);
                    (0..warm_up + rounds)
                        .map(|_| {
                            start.wait();
                            let t0 = std::time::Instant::now();
                            dst.copy_from_slice(&src);
                            std::hint::black_box(&mut dst);
                            t0.elapsed().as_secs_f64()
                        })
                        .collect()
                })
            })
            .collect();
        copiers
            .into_iter()
            .map(|c| c.join().unwrap_or_default())
            .collect()
    });
    let mut times: Vec<f64> = (warm_up..warm_up + rounds)
        .map(|r| {
            per_thread
                .iter()
                .map(|t| t.get(r).copied().unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max)
        })
        .collect();
    times.sort_by(f64::total_cmp);
    2.0 * (share * threads) as f64 / times[rounds / 2]
}

/// Memory the system can give a new allocation without swapping, in bytes: Linux's
/// `MemAvailable` (free memory plus the page cache and reclaimable slabs it can drop), or
/// `None` where it cannot be read. What this process may take can be less: see
/// [`memory_bound`].
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, "MemAvailable")
}

/// What bounds the memory this process can still allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryLimit {
    /// The system's free memory (`MemAvailable` of `/proc/meminfo`).
    Available,
    /// The process's soft address-space limit (`RLIMIT_AS`, `ulimit -v`), less the address
    /// space it maps already (`VmSize`).
    AddressSpace,
    /// A memory cgroup's limit less what the cgroup uses: the file that holds the limit
    /// (`memory.max`, or cgroup v1's `memory.limit_in_bytes`), of the process's cgroup or
    /// an ancestor.
    Cgroup(std::path::PathBuf),
}

/// The memory this process can still allocate, in bytes, and the limit that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBound {
    /// Bytes left under the tightest limit.
    pub bytes: u64,
    /// Which limit that is.
    pub limit: MemoryLimit,
}

impl std::fmt::Display for MemoryBound {
    /// A clause naming the limit and what it leaves, e.g. "the process's address-space limit
    /// (ulimit -v) leaves 1.9 GiB".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = self.bytes as f64 / f64::from(1u32 << 30);
        match &self.limit {
            MemoryLimit::Available => write!(f, "this machine has {gib:.1} GiB available"),
            MemoryLimit::AddressSpace => write!(
                f,
                "the process's address-space limit (ulimit -v) leaves {gib:.1} GiB"
            ),
            MemoryLimit::Cgroup(file) => write!(
                f,
                "the memory cgroup's limit ({}) leaves {gib:.1} GiB",
                file.display()
            ),
        }
    }
}

/// The memory this process can still allocate: the least of the system's free memory
/// ([`available_memory`]), what the soft `RLIMIT_AS` leaves of the address space, and what
/// the limits of the process's memory cgroup (v2 `memory.max`, or v1
/// `memory.limit_in_bytes`, of its cgroup and every ancestor) leave. `None` where none of
/// them can be read. Limits set to "unlimited" do not count.
///
/// The address-space figure counts reservations as well as memory in use: thread stacks
/// and malloc arenas are mapped whole, so a process under `ulimit -v` can fail an
/// allocation this figure allowed if it starts many threads first. Leave a margin.
pub fn memory_bound() -> Option<MemoryBound> {
    let available = available_memory().map(|bytes| MemoryBound {
        bytes,
        limit: MemoryLimit::Available,
    });
    let address_space = address_space_left().map(|bytes| MemoryBound {
        bytes,
        limit: MemoryLimit::AddressSpace,
    });
    [available, address_space, cgroup_left()]
        .into_iter()
        .flatten()
        .min_by_key(|b| b.bytes)
}

/// The value in bytes of a `Key:   N kB` line of `/proc/meminfo` or `/proc/self/status`.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| {
        l.strip_prefix(key)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft `RLIMIT_AS` less the address space mapped now (`VmSize`); `None` when unlimited.
#[cfg(target_os = "linux")]
fn address_space_left() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the `rlimit` it is given, a valid, owned value.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mapped = kib_field(&status, "VmSize").unwrap_or(0);
    Some(limit.rlim_cur.saturating_sub(mapped))
}

#[cfg(not(target_os = "linux"))]
fn address_space_left() -> Option<u64> {
    None
}

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The process's cgroup paths from `/proc/self/cgroup` text: the v2 one (the `0::/path`
/// line) and the v1 memory controller's (`N:...memory...:/path`), each if present.
fn cgroup_paths(text: &str) -> (Option<&str>, Option<&str>) {
    let mut v2 = None;
    let mut v1 = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path);
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    (v2, v1)
}

/// A cgroup memory figure: bytes, or `None` for no limit (v2 "max", v1's page-counter
/// maximum of about 2^63) or text that is not a number.
fn cgroup_value(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// The least that the limits of cgroup `path` (under `root`) and its ancestors leave:
/// `limit` less `usage` (file names) of each folder from the cgroup up to `root`, with the
/// limit file that gives it. `None` when no folder has a limit.
fn cgroup_room(
    root: &std::path::Path,
    path: &str,
    limit: &str,
    usage: &str,
) -> Option<(u64, std::path::PathBuf)> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let mut dir = root.join(path.trim_start_matches('/'));
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    loop {
        let file = dir.join(limit);
        if let Some(max) = read(file.clone()).as_deref().and_then(cgroup_value) {
            let used = read(dir.join(usage))
                .as_deref()
                .and_then(cgroup_value)
                .unwrap_or(0);
            let left = max.saturating_sub(used);
            if best.as_ref().is_none_or(|(b, _)| left < *b) {
                best = Some((left, file));
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    best
}

/// What the process's memory cgroup limits leave (v2, else v1), if any applies.
fn cgroup_left() -> Option<MemoryBound> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v2, v1) = cgroup_paths(&text);
    let root = std::path::Path::new(CGROUP_ROOT);
    let found = v2
        .and_then(|p| cgroup_room(root, p, "memory.max", "memory.current"))
        .or_else(|| {
            v1.and_then(|p| {
                cgroup_room(
                    &root.join("memory"),
                    p,
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                )
            })
        })?;
    Some(MemoryBound {
        bytes: found.0,
        limit: MemoryLimit::Cgroup(found.1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_bytes_by_their_exact_key() {
        let status = "VmPeak:\t  900 kB\nVmSize:\t    3892 kB\nVmSizeX:\t 1 kB\n";
        assert_eq!(kib_field(status, "VmSize"), Some(3892 * 1024));
        assert_eq!(kib_field(status, "VmPeak"), Some(900 * 1024));
        assert_eq!(kib_field(status, "VmRSS"), None);
        let meminfo = "MemTotal:       32000000 kB\nMemAvailable:   23811596 kB\n";
        assert_eq!(kib_field(meminfo, "MemAvailable"), Some(23_811_596 * 1024));
        assert_eq!(kib_field("MemAvailable: lots kB", "MemAvailable"), None);
    }

    #[test]
    fn cgroup_paths_are_found_for_v2_and_for_v1_memory() {
        let hybrid = "9:name=systemd:/\n5:devices:/\n4:memory:/process_api/a15b\n\
                      3:cpu,cpuacct:/x\n0::/user.slice/app-3.scope\n";
        assert_eq!(
            cgroup_paths(hybrid),
            (Some("/user.slice/app-3.scope"), Some("/process_api/a15b"))
        );
        assert_eq!(cgroup_paths("0::/\n"), (Some("/"), None));
        assert_eq!(
            cgroup_paths("7:cpuacct,memory:/docker/abc\n"),
            (None, Some("/docker/abc"))
        );
        // A path holding colons stays whole; `memory` must be a whole controller name.
        assert_eq!(
            cgroup_paths("0::/a:b\n4:memory_x:/y\n"),
            (Some("/a:b"), None)
        );
        assert_eq!(cgroup_paths("garbage\n"), (None, None));
    }

    #[test]
    fn cgroup_values_treat_max_and_the_v1_maximum_as_no_limit() {
        assert_eq!(cgroup_value("1073741824\n"), Some(1 << 30));
        assert_eq!(cgroup_value("max\n"), None);
        assert_eq!(cgroup_value("9223372036854771712\n"), None);
        assert_eq!(cgroup_value(""), None);
    }

    #[test]
    fn the_tightest_cgroup_limit_among_ancestors_binds() {
        let root = std::env::temp_dir().join(format!("nanoddp-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let leaf = root.join("a/b");
        std::fs::create_dir_all(&leaf).expect("temporary folder");
        let write = |p: std::path::PathBuf, t: &str| std::fs::write(p, t).expect("write");
        // The leaf has no limit, its parent 3 GiB with 1 GiB used, the root 8 GiB.
        write(leaf.join("memory.max"), "max\n");
        write(leaf.join("memory.current"), "5000\n");
        write(root.join("a/memory.max"), &format!("{}\n", 3u64 << 30));
        write(root.join("a/memory.current"), &format!("{}\n", 1u64 << 30));
        write(root.join("memory.max"), &format!("{}\n", 8u64 << 30));
        let found = cgroup_room(&root, "/a/b", "memory.max", "memory.current");
        assert_eq!(found, Some((2 << 30, root.join("a/memory.max"))));
        // Usage past the limit leaves nothing, not a wrapped-around figure.
        write(leaf.join("memory.max"), "4096\n");
        let found = cgroup_room(&root, "/a/b", "memory.max", "memory.current");
        assert_eq!(found, Some((0, leaf.join("memory.max"))));
        // No limit anywhere: nothing binds.
        assert_eq!(
            cgroup_room(
                &root,
                "/a/b",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes"
            ),
            None
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_bound_is_never_above_free_memory_and_names_its_limit() {
        let bound = memory_bound().expect("Linux reports free memory");
        if let Some(free) = available_memory() {
            assert!(bound.bytes <= free);
        }
        let text = bound.to_string();
        assert!(text.contains("GiB"), "{text}");
        let shown = MemoryBound {
            bytes: 2040 << 20,
            limit: MemoryLimit::AddressSpace,
        };
        assert_eq!(
            shown.to_string(),
            "the process's address-space limit (ulimit -v) leaves 2.0 GiB"
        );
    }
}
