//! Which instruction set the CPU backend computes with: decided once per process, in one place.
//!
//! The backend is compiled for baseline x86-64 and picks its faster paths at run time, so one
//! binary runs everywhere. Every path must give results the tests accept, and a machine with
//! AVX-512 would otherwise never run the portable one that other machines take: set
//! `NANODDP_CPU_ISA=portable` to force it (the tests do, to check both paths on any machine;
//! so can anyone comparing the two). Likewise `NANODDP_CPU_ISA=avx512` keeps AVX-512 but not
//! its BF16 extension, the bf16 path of AVX-512 CPUs without it (Zen 3's successors have it;
//! Skylake and Ice Lake servers do not). `NANODDP_CPU_ISA=native` (or unset) uses what the
//! CPU has.

use std::sync::OnceLock;

/// The environment variable that can force the portable paths.
pub const ISA_ENV: &str = "NANODDP_CPU_ISA";

/// The instruction sets the backend's vector paths are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa {
    /// AVX-512 F, VL, BW and DQ: the register tiles, pooling, conversions.
    pub avx512: bool,
    /// FMA (with AVX2's 256-bit registers): the optimizer step.
    pub fma: bool,
    /// AVX512-BF16 (`vdpbf16ps`, with the AVX-512 set above): the bf16 products, the
    /// convolutions' from 64 taps on (forward, input and filter gradients) and the linear
    /// layers' (Zen 4, Sapphire Rapids and later).
    pub avx512_bf16: bool,
}

impl Isa {
    /// The portable paths only (what `NANODDP_CPU_ISA=portable` selects).
    pub const PORTABLE: Isa = Isa {
        avx512: false,
        fma: false,
        avx512_bf16: false,
    };

    /// What this CPU offers.
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx512 =
                has!("avx512f") && has!("avx512vl") && has!("avx512bw") && has!("avx512dq");
            Isa {
                avx512,
                fma: has!("fma") && has!("avx2"),
                avx512_bf16: avx512 && has!("avx512bf16"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Isa::PORTABLE
        }
    }

    /// The paths in use, as `nanoddp info` names them.
    pub fn describe(&self) -> &'static str {
        match (self.avx512, self.fma) {
            (true, _) if self.avx512_bf16 => "AVX-512 (F, VL, BW, DQ), AVX512-BF16 for bf16",
            (true, _) => "AVX-512 (F, VL, BW, DQ)",
            (false, true) => "portable, FMA for the optimizer",
            (false, false) => "portable",
        }
    }
}

/// What `NANODDP_CPU_ISA` asks for, or why it cannot be honoured (the command line refuses
/// such a value before any work; see [`isa`] for the library).
pub fn requested() -> Result<Isa, String> {
    match std::env::var(ISA_ENV).as_deref() {
        Ok("portable") => Ok(Isa::PORTABLE),
        Ok("avx512") => Ok(Isa {
            avx512_bf16: false,
            ..Isa::detect()
        }),
        Ok("native") | Ok("") | Err(std::env::VarError::NotPresent) => Ok(Isa::detect()),
        Ok(other) => Err(format!(
            "{ISA_ENV}={other}: expected `portable`, `avx512` or `native`"
        )),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "{ISA_ENV}={v:?}: expected `portable`, `avx512` or `native`"
        )),
    }
}

/// The instruction sets in use, decided on first use: what the CPU has, unless
/// `NANODDP_CPU_ISA=portable`. A value it does not know is reported on stderr once and
/// ignored (a library must not panic on its environment).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        requested().unwrap_or_else(|why| {
            eprintln!("nanoddp: ignoring {why}");
            Isa::detect()
        })
    })
}

/// The lanes below `n` of a 16-lane AVX-512 vector, as a write or load mask (n ≤ 16).
#[cfg(target_arch = "x86_64")]
pub(super) fn lanes(n: usize) -> std::arch::x86_64::__mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as std::arch::x86_64::__mmask16
}
