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
//! unset) uses what the CPU has, as this module judges best. A level the CPU lacks, or a
//! name not listed here, is an error ([`requested`]), never quietly replaced by another.

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

/// Why `NANODDP_CPU_ISA` cannot be honoured: a name it does not know, or a level this CPU
/// lacks. Either way it names the variable and the values this CPU accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// Not one of the names.
    #[error("{ISA_ENV}={value}: expected {}", allowed(.cpu))]
    Unknown {
        /// The variable's value (lossily, if it is not Unicode).
        value: String,
        /// What this CPU offers.
        cpu: Isa,
    },
    /// A level this CPU cannot run.
    #[error("{ISA_ENV}={value}: this CPU lacks {lacks}; expected {}", allowed(.cpu))]
    Unsupported {
        /// The level asked for.
        value: String,
        /// The instructions it needs that the CPU does not have.
        lacks: &'static str,
        /// What this CPU offers.
        cpu: Isa,
    },
}

/// The values of `NANODDP_CPU_ISA` a CPU offering `cpu` accepts, as a phrase.
fn allowed(cpu: &Isa) -> String {
    let mut names = vec!["`portable`"];
    if cpu.avx512 {
        names.push("`avx512`");
    }
    if cpu.avx512_bf16 {
        names.push("`avx512bf16`");
    }
    let last = "`native` (the default)";
    format!("{} or {last}", names.join(", "))
}

/// What `NANODDP_CPU_ISA` asks for, or why it cannot be honoured (the command line refuses
/// such a value before any work; see [`isa`] for the library).
pub fn requested() -> Result<Isa, IsaError> {
    let value = match std::env::var(ISA_ENV) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => Some(v.to_string_lossy().into_owned()),
    };
    choose(value.as_deref(), Isa::detect)
}

/// The paths `value` (of `NANODDP_CPU_ISA`; `None`: unset) selects on a CPU that `detect`
/// describes (called only where needed: `portable` does not probe the CPU, nor ask Linux
/// for AMX).
fn choose(value: Option<&str>, detect: impl FnOnce() -> Isa) -> Result<Isa, IsaError> {
    if value == Some("portable") {
        return Ok(Isa::PORTABLE);
    }
    let cpu = detect();
    let unsupported = |lacks| IsaError::Unsupported {
        value: value.unwrap_or_default().to_string(),
        lacks,
        cpu,
    };
    match value {
        Some("avx512") if !cpu.avx512 => Err(unsupported("AVX-512 (F, VL, BW and DQ)")),
        Some("avx512") => Ok(Isa {
            avx512_bf16: false,
            bf16_products: false,
            amx: false,
            ..cpu
        }),
        Some("avx512bf16") if !cpu.avx512_bf16 => {
            Err(unsupported("AVX512-BF16 (with AVX-512 F, VL, BW and DQ)"))
        }
        Some("avx512bf16") => Ok(Isa {
            bf16_products: true,
            amx: false,
            ..cpu
        }),
        Some("native") | Some("") | None => Ok(cpu),
        Some(other) => Err(IsaError::Unknown {
            value: other.to_string(),
            cpu,
        }),
    }
}

/// The instruction sets in use, decided on first use: what the CPU has, unless
/// `NANODDP_CPU_ISA` chooses fewer. A value it does not know, or a level the CPU lacks, is
/// reported on stderr once and ignored (a library must not panic on its environment; the
/// command line refuses it through [`requested`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    const AVX512_ONLY: Isa = Isa {
        avx512: true,
        fma: true,
        avx512_bf16: false,
        bf16_products: false,
        amx: false,
    };

    #[test]
    fn a_level_the_cpu_lacks_is_refused_naming_what_it_offers() {
        let old = Isa {
            fma: true,
            ..Isa::PORTABLE
        };
        let err = choose(Some("avx512"), || old).expect_err("no AVX-512 here");
        assert!(matches!(err, IsaError::Unsupported { .. }));
        assert_eq!(
            err.to_string(),
            "NANODDP_CPU_ISA=avx512: this CPU lacks AVX-512 (F, VL, BW and DQ); expected \
             `portable` or `native` (the default)"
        );
        let err = choose(Some("avx512bf16"), || AVX512_ONLY).expect_err("no AVX512-BF16 here");
        let text = err.to_string();
        assert!(text.contains("lacks AVX512-BF16"), "{text}");
        assert!(
            text.contains("`avx512`") && !text.contains("`avx512bf16`"),
            "{text}"
        );
    }

    #[test]
    fn an_unknown_name_is_refused_and_known_ones_choose_their_paths() {
        let err = choose(Some("avx2"), || AVX512_ONLY).expect_err("not a level");
        assert_eq!(
            err.to_string(),
            "NANODDP_CPU_ISA=avx2: expected `portable`, `avx512` or `native` (the default)"
        );
        // `portable` needs nothing of the CPU: it is not probed (nor AMX requested).
        assert_eq!(
            choose(Some("portable"), || panic!("probed the CPU")),
            Ok(Isa::PORTABLE)
        );
        assert_eq!(choose(None, || AVX512_ONLY), Ok(AVX512_ONLY));
        assert_eq!(choose(Some("native"), || AVX512_ONLY), Ok(AVX512_ONLY));
        let full = Isa {
            avx512_bf16: true,
            amx: true,
            ..AVX512_ONLY
        };
        assert_eq!(choose(Some("avx512"), || full), Ok(AVX512_ONLY));
        let bf16 = choose(Some("avx512bf16"), || full).expect("the CPU has it");
        assert!(bf16.bf16_products && !bf16.amx);
    }
}
