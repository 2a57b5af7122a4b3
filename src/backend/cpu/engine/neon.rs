//! The NEON engine (aarch64's Advanced SIMD): 4 lanes of f32 in a 128-bit register, fused
//! multiply-adds. Its 32 registers hold a tile of 5 x 5 accumulators, the 5 vectors of one
//! operand and a broadcast of the other, as AVX-512's do with 16 lanes.

use std::arch::aarch64::*;

use super::Engine;
use crate::backend::cpu::isa::EngineKind;

/// aarch64's Advanced SIMD, which every aarch64 Linux CPU has.
pub(in crate::backend::cpu) struct Neon;

/// Runs `f` with NEON enabled for the code inlined into it.
///
/// # Safety
/// The CPU has NEON.
#[target_feature(enable = "neon")]
unsafe fn run_enabled<T>(f: impl FnOnce() -> T) -> T {
    f()
}

impl Engine for Neon {
    const KIND: EngineKind = EngineKind::Neon;
    const LANES: usize = 4;
    const R: usize = 5;
    const V: usize = 5;
    const GEMM_ROWS: usize = 10;
    const GEMM_VECTORS: usize = 2;
    const DOT_ROWS: usize = 4;
    const DOT_COLS: usize = 5;
    #[cfg(test)]
    const FUSED: bool = true;
    type Vector = float32x4_t;

    fn available() -> bool {
        crate::backend::cpu::isa::cpu().neon
    }

    #[inline(always)]
    unsafe fn run<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the caller's: the CPU has NEON.
        unsafe { run_enabled(f) }
    }

    #[inline(always)]
    unsafe fn zero() -> float32x4_t {
        // SAFETY: inside `run`.
        unsafe { vdupq_n_f32(0.0) }
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> float32x4_t {
        // SAFETY: the caller's: p is valid for 4 floats, inside `run`.
        unsafe { vld1q_f32(p) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: float32x4_t) {
        // SAFETY: the caller's: p is valid for 4 floats, inside `run`.
        unsafe { vst1q_f32(p, v) }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> float32x4_t {
        // SAFETY: inside `run`.
        unsafe { vdupq_n_f32(v) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        // SAFETY: inside `run`. vfmaq_f32(c, a, b) is c + a·b, rounded once.
        unsafe { vfmaq_f32(c, a, b) }
    }

    #[inline(always)]
    unsafe fn add(a: float32x4_t, b: float32x4_t) -> float32x4_t {
        // SAFETY: inside `run`.
        unsafe { vaddq_f32(a, b) }
    }

    #[inline(always)]
    unsafe fn sum(v: float32x4_t) -> f32 {
        // SAFETY: inside `run`. Lanes l and l + 2, then the two sums: the trait's tree.
        unsafe {
            let s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
            vget_lane_f32::<0>(s) + vget_lane_f32::<1>(s)
        }
    }
}
