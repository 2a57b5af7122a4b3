//! Which instruction set the CPU backend computes with: decided once per process, in one place.
//!
//! The backend is compiled for the target's baseline and picks its faster paths at run time,
//! so one binary runs everywhere. `NANODDP_CPU_ISA` forces any level the CPU can run
//! ([`LEVELS`]: `portable`, `avx2`, `avx512` without its BF16 extension or AMX, `avx512bf16`
//! through `vdpbf16ps` and never AMX, `neon` on aarch64; `native` or unset: what the CPU
//! has, as this module judges best), so anyone can compare the paths on one machine; a
//! level the CPU lacks, or an unknown name, is an error ([`requested`]), never quietly
//! replaced by another.

use std::sync::OnceLock;

/// The environment variable that can force the portable paths.
pub const ISA_ENV: &str = "NANODDP_CPU_ISA";

/// The instruction sets the backend's vector paths are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa {
    /// AVX-512 F, VL, BW and DQ: the register tiles, pooling, conversions.
    pub avx512: bool,
    /// AVX2 with FMA and F16C: the AVX2 engine (`engine::avx2`), and the plain loops and the
    /// optimizer step compiled 8 lanes wide with fused multiply-adds, where AVX-512 is not
    /// in use.
    pub avx2: bool,
    /// AVX512-BF16 (`vdpbf16ps`, with the AVX-512 set above) is there to run (Zen 4,
    /// Sapphire Rapids and later): its kernels' tests run where this is set.
    pub avx512_bf16: bool,
    /// The bf16 products (the convolutions' from 64 taps on: forward, input and filter
    /// gradients; the linear layers') take `vdpbf16ps`, two products per f32 lane and
    /// instruction; else bf16 is widened and takes the f32 tiles. Set on AVX512-BF16 CPUs
    /// from AMD but not on Intel's, whose `vdpbf16ps` gives fewer products per cycle than
    /// two f32 FMAs (docs/cpu-backend.md has the measurements). A fixed rule, not a timing
    /// taken at start-up, so the same machine always computes the same bits.
    pub bf16_products: bool,
    /// AMX-BF16 tiles (`tdpbf16ps`, with AVX-512 and AVX512-BF16 for packing their
    /// operands), enabled for this process: the bf16 convolutions' products from 64 taps,
    /// forward, input and filter gradients (`engine::amx`; Sapphire Rapids and later
    /// Xeons). Where set, `bf16_products` is not: the linear layers widen bf16.
    pub amx: bool,
    /// aarch64's Advanced SIMD (NEON): the NEON engine (`engine::neon`).
    pub neon: bool,
}

impl Isa {
    /// The portable paths only (what `NANODDP_CPU_ISA=portable` selects).
    pub const PORTABLE: Isa = Isa {
        avx512: false,
        avx2: false,
        avx512_bf16: false,
        bf16_products: false,
        amx: false,
        neon: false,
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
                && request_amx();
            Isa {
                avx512,
                avx2: has!("avx2") && has!("fma") && has!("f16c"),
                avx512_bf16,
                bf16_products: avx512_bf16 && !is_intel() && !amx,
                amx,
                neon: false,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            Isa {
                neon: std::arch::is_aarch64_feature_detected!("neon"),
                ..Isa::PORTABLE
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Isa::PORTABLE
        }
    }

    /// The vector engine the convolution products in f32 (and widened f16 and bf16) run on.
    pub fn engine(&self) -> EngineKind {
        if self.avx512 {
            EngineKind::Avx512
        } else if self.avx2 {
            EngineKind::Avx2
        } else if self.neon {
            EngineKind::Neon
        } else {
            EngineKind::Portable
        }
    }
}

/// The vector engines the f32 convolution products run on (`engine`'s files), widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// 16 lanes of f32 in 32 registers (AVX-512 F, VL, BW, DQ).
    Avx512,
    /// 8 lanes of f32 in 16 registers (AVX2 with FMA).
    Avx2,
    /// 4 lanes of f32 in 32 registers (aarch64's NEON, fused multiply-adds).
    Neon,
    /// 4 lanes as plain arrays the compiler vectorizes for the target's baseline.
    Portable,
}

impl EngineKind {
    /// The engine's name, with its vector width.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Avx512 => "AVX-512 engine (16 lanes)",
            EngineKind::Avx2 => "AVX2+FMA engine (8 lanes)",
            EngineKind::Neon => "NEON engine (4 lanes)",
            EngineKind::Portable => "portable engine (4 lanes)",
        }
    }
}

impl Isa {
    /// Which code serves each operation, as `nanoddp info` prints it: (operation, what runs
    /// it).
    pub fn plan(&self) -> Vec<(&'static str, String)> {
        let engine = self.engine().name();
        let bf16 = if self.amx {
            "AMX-BF16 tiles (tdpbf16ps), bf16 pairs".to_string()
        } else if self.bf16_products {
            "AVX512-BF16 (vdpbf16ps), bf16 pairs".to_string()
        } else {
            format!("widened to f32, the {engine}")
        };
        let linear_bf16 = if self.bf16_products {
            "AVX512-BF16 (vdpbf16ps), bf16 pairs"
        } else {
            "widened to f32, matrixmultiply"
        };
        let convert = match self.engine() {
            EngineKind::Avx512 | EngineKind::Avx2 => {
                "F16C and AVX2, the forward's bias and ReLU fused"
            }
            _ => "the half crate (f16), a plain loop (bf16)",
        };
        vec![
            (
                "convolutions from 64 taps (conv2), f32 and f16",
                format!("images in the lanes, the {engine}"),
            ),
            ("convolutions from 64 taps (conv2), bf16", bf16),
            (
                "convolutions under 64 taps (conv1)",
                format!("im2col, then the GEMM and dot-product tiles on the {engine}"),
            ),
            (
                "linear layers, f32 and f16",
                "matrixmultiply (its own choice of AVX-512, AVX2 or SSE; NEON on aarch64)"
                    .to_string(),
            ),
            ("linear layers, bf16", linear_bf16.to_string()),
            ("f16 and bf16 conversions", convert.to_string()),
            (
                "pools, bias and ReLU, SGD step",
                if self.avx512 {
                    "plain loops compiled for AVX-512; LeNet's 2x2 pools in AVX-512 registers"
                        .to_string()
                } else {
                    format!("plain loops compiled for the {engine}")
                },
            ),
        ]
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
    /// The threads of a device computing with its own level could not be started.
    #[error("could not start the CPU backend's threads: {reason}")]
    Threads {
        /// The thread pool's explanation.
        reason: String,
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

/// The levels `NANODDP_CPU_ISA` names, lowest first (besides `native`, the default: what
/// the CPU has).
pub const LEVELS: [&str; 5] = ["portable", "neon", "avx2", "avx512", "avx512bf16"];

/// The values of `NANODDP_CPU_ISA` a CPU offering `cpu` accepts, as a phrase.
fn allowed(cpu: &Isa) -> String {
    let ok = |name: &&str| choose(Some(*name), || *cpu).is_ok();
    let quoted = LEVELS.into_iter().filter(ok).map(|n| format!("`{n}`"));
    format!(
        "{} or `native` (the default)",
        quoted.collect::<Vec<_>>().join(", ")
    )
}

/// What `NANODDP_CPU_ISA` asks for, or why it cannot be honoured (the command line refuses
/// such a value before any work; see [`isa`] for the library).
pub fn requested() -> Result<Isa, IsaError> {
    let value = match std::env::var(ISA_ENV) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => Some(v.to_string_lossy().into_owned()),
    };
    choose(value.as_deref(), cpu)
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
        Some("neon") if !cpu.neon => Err(unsupported("NEON (aarch64's Advanced SIMD)")),
        Some("neon") => Ok(Isa {
            neon: true,
            ..Isa::PORTABLE
        }),
        Some("avx2") if !cpu.avx2 => Err(unsupported("AVX2 with FMA and F16C")),
        Some("avx2") => Ok(Isa {
            avx2: true,
            ..Isa::PORTABLE
        }),
        Some("avx512") if !cpu.avx512 => Err(unsupported("AVX-512 (F, VL, BW and DQ)")),
        Some("avx512") => Ok(Isa {
            avx512: true,
            avx2: cpu.avx2,
            ..Isa::PORTABLE
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

/// What this CPU offers, whatever `NANODDP_CPU_ISA` asks for (detected once): the engines the
/// tests can run here.
pub fn cpu() -> Isa {
    static CPU: OnceLock<Isa> = OnceLock::new();
    *CPU.get_or_init(Isa::detect)
}

/// The level `name` (a value of `NANODDP_CPU_ISA`) selects on this CPU, or why it cannot:
/// what [`CpuDevice::with_level`](super::CpuDevice::with_level) computes with.
pub fn level(name: &str) -> Result<Isa, IsaError> {
    choose(Some(name), cpu)
}

/// Every level this CPU can run, by name, each set of paths once (lowest first): the
/// engines a test runs on.
pub fn levels() -> Vec<(&'static str, Isa)> {
    let mut out: Vec<(&'static str, Isa)> = Vec::new();
    for name in LEVELS.into_iter().chain(["native"]) {
        if let Ok(isa) = level(name) {
            if out.iter().all(|(_, seen)| *seen != isa) {
                out.push((name, isa));
            }
        }
    }
    out
}

thread_local! {
    /// The paths of the [`CpuDevice`](super::CpuDevice) whose threads these are, where it
    /// chose its own ([`CpuDevice::with_level`](super::CpuDevice::with_level)).
    static THREAD_ISA: std::cell::Cell<Option<Isa>> = const { std::cell::Cell::new(None) };
}

/// Makes this thread compute with `isa` (`None`: the process's choice, [`isa`]).
pub(super) fn set_thread_isa(isa: Option<Isa>) {
    THREAD_ISA.with(|t| t.set(isa));
}

/// The instruction sets in use: the process's, decided on first use (what the CPU has,
/// unless `NANODDP_CPU_ISA` chooses fewer), or on the threads of a
/// [`CpuDevice::with_level`](super::CpuDevice::with_level) that device's. A value of the
/// variable it does not know, or a level the CPU lacks, is reported on stderr once and
/// ignored (a library must not panic on its environment; the command line refuses it
/// through [`requested`]).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    THREAD_ISA.with(|t| t.get()).unwrap_or_else(|| {
        *ISA.get_or_init(|| {
            requested().unwrap_or_else(|why| {
                eprintln!("nanoddp: ignoring {why}");
                cpu()
            })
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

/// Asks Linux for the right to use AMX's tile data in this process (`arch_prctl(
/// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): true where it was granted. Without it the
/// first tile instruction kills the process. Called once, by [`Isa::detect`], and only
/// where CPUID reports AMX-TILE and AMX-BF16.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_amx() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted
    // extended state; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// AMX is enabled only on Linux (the permission request above).
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_amx() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVX512_ONLY: Isa = Isa {
        avx512: true,
        avx2: true,
        avx512_bf16: false,
        bf16_products: false,
        amx: false,
        neon: false,
    };

    #[test]
    fn a_level_the_cpu_lacks_is_refused_naming_what_it_offers() {
        let old = Isa {
            avx2: true,
            ..Isa::PORTABLE
        };
        let err = choose(Some("avx512"), || old).expect_err("no AVX-512 here");
        assert!(matches!(err, IsaError::Unsupported { .. }));
        assert_eq!(
            err.to_string(),
            "NANODDP_CPU_ISA=avx512: this CPU lacks AVX-512 (F, VL, BW and DQ); expected \
             `portable`, `avx2` or `native` (the default)"
        );
        let err = choose(Some("avx2"), || Isa::PORTABLE).expect_err("no AVX2 here");
        assert!(
            err.to_string().contains("lacks AVX2 with FMA and F16C"),
            "{err}"
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
        let err = choose(Some("avx3"), || AVX512_ONLY).expect_err("not a level");
        assert_eq!(
            err.to_string(),
            "NANODDP_CPU_ISA=avx3: expected `portable`, `avx2`, `avx512` or `native` (the default)"
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
        let avx2 = choose(Some("avx2"), || full).expect("the CPU has it");
        assert_eq!(avx2.engine(), EngineKind::Avx2);
        assert!(!avx2.avx512 && !avx2.amx && !avx2.bf16_products && !avx2.avx512_bf16);
    }
}
