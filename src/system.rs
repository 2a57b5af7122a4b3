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
