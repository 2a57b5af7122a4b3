//! Which instruction set the CPU backend computes with: decided once per process, in one place.
//!
//! The backend is compiled for baseline x86-64 and picks its faster paths at run time, so one
//! binary runs everywhere. Every path must give results the tests accept, and a machine with
//! AVX-512 would otherwise never run the portable one that other machines take: set
//! `NANODDP_CPU_ISA=portable` to force it (the tests do, to check both paths on any machine;
//! so can anyone comparing the two). Likewise `NANODDP_CPU_ISA=avx512` keeps AVX-512 but not
//! its BF16 extension or AMX (the bf16 path of AVX-512 CPUs without them: Skylake and Ice
//! Lake servers), and `NANODDP_CPU_ISA=avx512bf16` takes the bf16 products through
//! AVX512-BF16 wherever the CPU has it, also where [`Isa::bf16_products`] would not (Intel's
//! cores: see there), and never through AMX ([`Isa::amx`]). `NANODDP_CPU_ISA=native` (or
//! unset) uses what the CPU has, as this module judges best.

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
    /// AVX512-BF16 (`vdpbf16ps`, with the AVX-512 set above) is there to run (Zen 4,
    /// Sapphire Rapids and later): its kernels' tests run where this is set.
    pub avx512_bf16: bool,
    /// The bf16 products (the convolutions' from 64 taps on: forward, input and filter
    /// gradients; the linear layers') take `vdpbf16ps`, two products per f32 lane and
    /// instruction; else bf16 is widened and takes the f32 tiles. Set on AVX512-BF16 CPUs
    /// from AMD (Zen 4: the bf16 step ran 1.3x the fp32 one) but not on Intel's, whose
    /// `vdpbf16ps` gives fewer products per cycle than two f32 FMAs: on a Sapphire Rapids
    /// the bf16 training step ran at 8,315 images/s through it and 12,076 widened (chapter
    /// recipe, 2 threads). A fixed rule, not a timing taken at start-up, so the same machine
    /// always computes the same bits.
    pub bf16_products: bool,
    /// AMX-BF16 tiles (`tdpbf16ps`, with AVX-512 and AVX512-BF16 for packing their
    /// operands), enabled for this process: the bf16 convolutions' products from 64 taps,
    /// forward, input and filter gradients (`window_gemm_amx`; Sapphire Rapids and later
    /// Xeons). Where set, `bf16_products` is not: the linear layers widen bf16.
    pub amx: bool,
}

impl Isa {
    /// The portable paths only (what `NANODDP_CPU_ISA=portable` selects).
    pub const PORTABLE: Isa = Isa {
        avx512: false,
        fma: false,
        avx512_bf16: false,
        bf16_products: false,
        amx: false,
    };

    /// What this CPU offers.
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx512 =
                has!("avx512f") && has!("avx512vl") && has!("avx512bw") && has!("avx512dq");
            let avx512_bf16 = avx512 && has!("avx512bf16");
            // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE; then Linux's permission.
            let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
            let amx = avx512_bf16
                && leaf7.edx >> 22 & 1 == 1
                && leaf7.edx >> 24 & 1 == 1
                && super::window_gemm_amx::enable();
            Isa {
                avx512,
                fma: has!("fma") && has!("avx2"),
                avx512_bf16,
                bf16_products: avx512_bf16 && !is_intel() && !amx,
                amx,
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
            (true, _) if self.amx => {
                "AVX-512 (F, VL, BW, DQ), AMX-BF16 tiles for bf16 convolutions (bf16 linear layers widened to f32)"
            }
            (true, _) if self.bf16_products => "AVX-512 (F, VL, BW, DQ), AVX512-BF16 for bf16",
            (true, _) if self.avx512_bf16 => {
                "AVX-512 (F, VL, BW, DQ), bf16 widened to f32 (AVX512-BF16 is slower on this CPU)"
            }
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
            bf16_products: false,
            amx: false,
            ..Isa::detect()
        }),
        Ok("avx512bf16") => {
            let isa = Isa::detect();
            Ok(Isa {
                bf16_products: isa.avx512_bf16,
                amx: false,
                ..isa
            })
        }
        Ok("native") | Ok("") | Err(std::env::VarError::NotPresent) => Ok(Isa::detect()),
        Ok(other) => Err(format!(
            "{ISA_ENV}={other}: expected `portable`, `avx512`, `avx512bf16` or `native`"
        )),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!(
            "{ISA_ENV}={v:?}: expected `portable`, `avx512`, `avx512bf16` or `native`"
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

/// Whether the CPU is Intel's (CPUID leaf 0's vendor string "GenuineIntel").
#[cfg(target_arch = "x86_64")]
fn is_intel() -> bool {
    let id = std::arch::x86_64::__cpuid(0);
    // The vendor string is EBX, EDX, ECX: "Genu", "ineI", "ntel" as little-endian words.
    (id.ebx, id.edx, id.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
}

/// The lanes below `n` of a 16-lane AVX-512 vector, as a write or load mask (n ≤ 16).
#[cfg(target_arch = "x86_64")]
pub(super) fn lanes(n: usize) -> std::arch::x86_64::__mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as std::arch::x86_64::__mmask16
}
