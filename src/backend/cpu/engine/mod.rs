//! The vector engines: one file per instruction set, each the same small [`Engine`] trait
//! (its vector width, its register tiles' shapes and a handful of vector operations), so the
//! products over them (`lanes`, and `microkernel`'s GEMM and dot-product tiles) are written
//! once.
//!
//! - [`avx512`]: 16 lanes in 32 registers, a lane tile of 5 x 5 accumulators;
//! - [`avx2`]: 8 lanes in 16 registers (AVX2 with FMA), a lane tile of 3 x 3;
//! - `neon` (aarch64): 4 lanes in 32 registers, fused, a lane tile of 5 x 5;
//! - [`portable`]: 4 lanes as plain arrays the compiler vectorizes for whatever the target
//!   has (SSE2 on baseline x86-64), a lane tile of 4 x 3, multiplies and adds not fused;
//! - [`vdpbf16ps`] (AVX512-BF16) and [`amx`] (AMX-BF16 tiles): the bf16 pair engines, whose
//!   operands are two bf16 values per 32-bit word: their tiles serve `pairs.rs`' products,
//!   outside the trait.
//!
//! Which engine serves the process is decided once ([`super::isa::Isa::engine`]); the tests
//! run every engine the CPU has in one process ([`on_each_engine`]). A product's summation
//! order is fixed by the shapes and the engine's lane count, never by the thread count; each
//! engine is deterministic, and engines of different widths round differently
//! (`docs/cpu-backend.md`).
//!
//! Adding an engine: a file implementing [`Engine`] (with `run` enabling its instruction set
//! for the code inlined into it), a variant of [`super::isa::EngineKind`] and its detection,
//! and arms in [`with_engine`], [`multiversion`] and `on_each_engine` (docs/cpu-backend.md).

#[cfg(target_arch = "x86_64")]
pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;
#[cfg(target_arch = "aarch64")]
pub(super) mod neon;
pub(super) mod portable;
#[cfg(target_arch = "x86_64")]
pub(super) mod vdpbf16ps;

use super::isa::EngineKind;

/// A vector instruction set as the lane products use it. Every method is `unsafe`: it may
/// only run inside [`Engine::run`], on a CPU that has the instruction set
/// ([`Engine::available`]); pointers must be valid for a whole vector.
pub(super) trait Engine: Send + Sync + 'static {
    /// Which engine this is (its name: [`EngineKind::name`]).
    const KIND: EngineKind;
    /// f32 lanes per vector: the images a group lays side by side.
    const LANES: usize;
    /// Register tile rows: output channels (forward, filter gradient) or taps (input
    /// gradient). Filters and output gradients are padded to a multiple of it.
    const R: usize;
    /// Register tile columns, at most: pixels (forward, input gradient) or taps (filter
    /// gradient). Ragged edges take a narrower tile.
    const V: usize;
    /// GEMM tile rows (`microkernel`'s, over panels of 10 rows: 10 or 5).
    const GEMM_ROWS: usize;
    /// GEMM tile columns, in vectors.
    const GEMM_VECTORS: usize;
    /// Dot-product tile rows of A (`microkernel::gemm_nt`'s).
    const DOT_ROWS: usize;
    /// Dot-product tile rows of B.
    const DOT_COLS: usize;
    /// Whether [`Engine::fmadd`] rounds once (a fused multiply-add) or twice (what the
    /// tests' bit-exact reference needs to know).
    #[cfg(test)]
    const FUSED: bool;
    /// One vector of [`Engine::LANES`] f32.
    type Vector: Copy;

    /// Whether this CPU has the instruction set (what it offers, whatever
    /// `NANODDP_CPU_ISA` chooses for the process).
    fn available() -> bool;
    /// Runs `f` with the instruction set enabled for the code inlined into it (the products
    /// are `#[inline(always)]`).
    ///
    /// # Safety
    /// [`Engine::available`].
    unsafe fn run<T>(f: impl FnOnce() -> T) -> T;
    /// `LANES` values from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::Vector;
    /// `v` to `p` (unaligned).
    unsafe fn store(p: *mut f32, v: Self::Vector);
    /// `v` in every lane.
    unsafe fn splat(v: f32) -> Self::Vector;
    /// `a · b + c` per lane, rounded once where [`Engine::FUSED`].
    unsafe fn fmadd(a: Self::Vector, b: Self::Vector, c: Self::Vector) -> Self::Vector;
    /// `a + b` per lane.
    unsafe fn add(a: Self::Vector, b: Self::Vector) -> Self::Vector;
    /// The sum of `v`'s lanes, always added as the same tree: lane l with lane l + LANES/2,
    /// then those sums with the ones a quarter apart, and so on.
    unsafe fn sum(v: Self::Vector) -> f32;
}

/// Writes a register tile's accumulators (its first rows: `acc` may be cut short) to memory:
/// `acc[r][v]` to `at(r, v)`, or with `add` added to what is there (memory's value first).
///
/// # Safety
/// Inside `E::run`; every `at(r, v)` valid for a vector.
#[inline(always)]
pub(super) unsafe fn store_tile<E: Engine, const V: usize>(
    acc: &[[E::Vector; V]],
    add: bool,
    at: impl Fn(usize, usize) -> *mut f32,
) {
    for (r, acc) in acc.iter().enumerate() {
        for (v, a) in acc.iter().enumerate() {
            let at = at(r, v);
            // SAFETY: the caller's.
            unsafe { E::store(at, if add { E::add(E::load(at), *a) } else { *a }) };
        }
    }
}

/// Implements [`Engine`] for `$name`, an instruction set of the `std::arch` module `$arch`
/// whose vector type `$vector` holds `$lanes` f32, given its intrinsics (or wrappers in
/// their shape) for an unaligned load and store, a broadcast, `a·b + c`
/// rounded once, `a + b` and the lane sum; `$features` enable it (on x86 the same as
/// [`multiversion!`]'s for that engine), `$has` is the [`super::isa::Isa`] flag that says
/// the CPU has them.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! simd_engine {
    ($name:ident: $kind:ident, $arch:path, $features:literal, $has:ident, $vector:ty,
     $lanes:literal lanes, tile $r:literal x $v:literal, gemm $gr:literal x $gv:literal,
     dot $dr:literal x $dc:literal, $load:ident, $store:ident, $splat:ident,
     $fmadd:ident, $add:ident, $sum:ident) => {
        use $arch::*;

        use super::Engine;
        use crate::backend::cpu::isa::EngineKind;

        /// Runs `f` with the engine's instruction set enabled for the code inlined into it.
        ///
        /// # Safety
        /// The CPU has the instruction set.
        #[target_feature(enable = $features)]
        unsafe fn run_enabled<T>(f: impl FnOnce() -> T) -> T {
            f()
        }

        impl Engine for $name {
            const KIND: EngineKind = EngineKind::$kind;
            const LANES: usize = $lanes;
            const R: usize = $r;
            const V: usize = $v;
            const GEMM_ROWS: usize = $gr;
            const GEMM_VECTORS: usize = $gv;
            const DOT_ROWS: usize = $dr;
            const DOT_COLS: usize = $dc;
            #[cfg(test)]
            const FUSED: bool = true;
            type Vector = $vector;

            fn available() -> bool {
                crate::backend::cpu::isa::cpu().$has
            }

            #[inline(always)]
            unsafe fn run<T>(f: impl FnOnce() -> T) -> T {
                // SAFETY: the caller's: the CPU has the instruction set.
                unsafe { run_enabled(f) }
            }

            #[inline(always)]
            unsafe fn load(p: *const f32) -> $vector {
                // SAFETY: the caller's: p is valid for a vector, inside `run`.
                unsafe { $load(p) }
            }

            #[inline(always)]
            unsafe fn store(p: *mut f32, v: $vector) {
                // SAFETY: the caller's: p is valid for a vector, inside `run`.
                unsafe { $store(p, v) }
            }

            #[inline(always)]
            unsafe fn splat(v: f32) -> $vector {
                // SAFETY: inside `run`.
                unsafe { $splat(v) }
            }

            #[inline(always)]
            unsafe fn fmadd(a: $vector, b: $vector, c: $vector) -> $vector {
                // SAFETY: inside `run` (which enables the fused multiply-add).
                unsafe { $fmadd(a, b, c) }
            }

            #[inline(always)]
            unsafe fn add(a: $vector, b: $vector) -> $vector {
                // SAFETY: inside `run`.
                unsafe { $add(a, b) }
            }

            #[inline(always)]
            unsafe fn sum(v: $vector) -> f32 {
                // SAFETY: inside `run`.
                unsafe { $sum(v) }
            }
        }
    };
}
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use simd_engine;

/// Runs `$body` with the type `$E` naming the engine the process computes with
/// ([`isa`]`().engine()`).
macro_rules! with_engine {
    ($E:ident => $body:expr) => {
        match $crate::backend::cpu::isa::isa().engine() {
            #[cfg(target_arch = "x86_64")]
            $crate::backend::cpu::isa::EngineKind::Avx512 => {
                type $E = $crate::backend::cpu::engine::avx512::Avx512;
                $body
            }
            #[cfg(target_arch = "x86_64")]
            $crate::backend::cpu::isa::EngineKind::Avx2 => {
                type $E = $crate::backend::cpu::engine::avx2::Avx2;
                $body
            }
            #[cfg(target_arch = "aarch64")]
            $crate::backend::cpu::isa::EngineKind::Neon => {
                type $E = $crate::backend::cpu::engine::neon::Neon;
                $body
            }
            _ => {
                type $E = $crate::backend::cpu::engine::portable::Portable;
                $body
            }
        }
    };
}
pub(super) use with_engine;

/// Runs `$f::<E>()` for every engine this CPU can run, naming each on stdout.
#[cfg(test)]
macro_rules! on_each_engine {
    ($f:ident) => {{
        use $crate::backend::cpu::engine::Engine as _;
        #[cfg(target_arch = "x86_64")]
        {
            use $crate::backend::cpu::engine::{avx2::Avx2, avx512::Avx512};
            if Avx512::available() {
                println!("{}: {}", stringify!($f), Avx512::KIND.name());
                $f::<Avx512>();
            }
            if Avx2::available() {
                println!("{}: {}", stringify!($f), Avx2::KIND.name());
                $f::<Avx2>();
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            use $crate::backend::cpu::engine::neon::Neon;
            if Neon::available() {
                println!("{}: {}", stringify!($f), Neon::KIND.name());
                $f::<Neon>();
            }
        }
        use $crate::backend::cpu::engine::portable::Portable;
        println!("{}: {}", stringify!($f), Portable::KIND.name());
        $f::<Portable>();
    }};
}
#[cfg(test)]
pub(super) use on_each_engine;

/// Defines a function as `$body` (an `#[inline(always)]` function of the same arguments)
/// compiled for each engine's instruction set, picked at run time by the process's engine
/// ([`super::isa::Isa::engine`]): the compiler vectorizes plain loops 16 or 8 lanes wide,
/// with fused multiply-adds only where the code asks for `mul_add` (so every engine gives
/// the same bits). Each version calls `$body` directly: a closure passed to [`Engine::run`]
/// is inlined only where the compiler judges it worth it, and a closure left as a call is
/// compiled for the baseline. The features are those of the engines' `run`.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident: $b:path),*>)?
        ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:ident) => {
        $(#[$m])*
        $vis fn $name $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq")]
                unsafe fn avx512 $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn avx2 $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                match $crate::backend::cpu::isa::isa().engine() {
                    // SAFETY: the process's engine was detected on this CPU.
                    $crate::backend::cpu::isa::EngineKind::Avx512 => {
                        return unsafe { avx512($($arg),*) }
                    }
                    // SAFETY: as above.
                    $crate::backend::cpu::isa::EngineKind::Avx2 => {
                        return unsafe { avx2($($arg),*) }
                    }
                    _ => {}
                }
            }
            // Elsewhere the body as compiled for the target, which on aarch64 has NEON.
            $body($($arg),*)
        }
    };
}
pub(super) use multiversion;
