//! The AVX-512 engine: 16 lanes of f32 in a zmm register, fused multiply-adds. Its 32
//! registers hold a tile of 5 x 5 accumulators, the 5 vectors of one operand and a
//! broadcast of the other.

use std::arch::x86_64::*;

use super::Engine;
use crate::backend::cpu::isa::EngineKind;

/// AVX-512 F, VL, BW and DQ.
pub(in crate::backend::cpu) struct Avx512;

/// Runs `f` with AVX-512 (F, VL, BW, DQ) enabled for the code inlined into it.
///
/// # Safety
/// The CPU has AVX-512 F, VL, BW and DQ.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq")]
unsafe fn run_avx512<T>(f: impl FnOnce() -> T) -> T {
    f()
}

impl Engine for Avx512 {
    const KIND: EngineKind = EngineKind::Avx512;
    const LANES: usize = 16;
    const R: usize = 5;
    const V: usize = 5;
    #[cfg(test)]
    const FUSED: bool = true;
    type Vector = __m512;

    fn available() -> bool {
        crate::backend::cpu::isa::cpu().avx512
    }

    #[inline(always)]
    unsafe fn run<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the caller's: the CPU has AVX-512 F, VL, BW and DQ.
        unsafe { run_avx512(f) }
    }

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: inside `run` (AVX-512 enabled).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the caller's: p is valid for 16 floats, inside `run`.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the caller's: p is valid for 16 floats, inside `run`.
        unsafe { _mm512_storeu_ps(p, v) }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        // SAFETY: inside `run`.
        unsafe { _mm512_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: inside `run` (AVX-512F has the fused multiply-add).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: inside `run`.
        unsafe { _mm512_add_ps(a, b) }
    }
}

/// The lanes below `n` of a 16-lane AVX-512 vector, as a write or load mask (n ≤ 16).
pub(in crate::backend::cpu) fn lanes(n: usize) -> __mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as __mmask16
}
