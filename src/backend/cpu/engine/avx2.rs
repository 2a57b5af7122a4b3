//! The AVX2 engine: 8 lanes of f32 in a ymm register, fused multiply-adds (FMA3). Its 16
//! registers hold a tile of 4 x 3 accumulators, the 3 vectors of one operand and a
//! broadcast of the other.

use std::arch::x86_64::*;

use super::Engine;
use crate::backend::cpu::isa::EngineKind;

/// AVX2 with FMA (and F16C for the conversions compiled with it).
pub(in crate::backend::cpu) struct Avx2;

/// Runs `f` with AVX2, FMA and F16C enabled for the code inlined into it.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<T>(f: impl FnOnce() -> T) -> T {
    f()
}

impl Engine for Avx2 {
    const KIND: EngineKind = EngineKind::Avx2;
    const LANES: usize = 8;
    const R: usize = 3;
    const V: usize = 3;
    #[cfg(test)]
    const FUSED: bool = true;
    type Vector = __m256;

    fn available() -> bool {
        crate::backend::cpu::isa::cpu().avx2
    }

    #[inline(always)]
    unsafe fn run<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the caller's: the CPU has AVX2, FMA and F16C.
        unsafe { run_avx2(f) }
    }

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: inside `run` (AVX2 enabled).
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the caller's: p is valid for 8 floats, inside `run`.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the caller's: p is valid for 8 floats, inside `run`.
        unsafe { _mm256_storeu_ps(p, v) }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        // SAFETY: inside `run`.
        unsafe { _mm256_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: inside `run` (FMA enabled).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: inside `run`.
        unsafe { _mm256_add_ps(a, b) }
    }
}
