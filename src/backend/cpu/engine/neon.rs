//! The NEON engine (aarch64's Advanced SIMD): 4 lanes of f32 in a 128-bit register, fused
//! multiply-adds. Its 32 registers hold a tile of 5 x 5 accumulators, the 5 vectors of one
//! operand and a broadcast of the other, as AVX-512's do with 16 lanes.

/// aarch64's Advanced SIMD, which every aarch64 Linux CPU has.
pub(in crate::backend::cpu) struct Neon;

super::simd_engine!(Neon: Neon, std::arch::aarch64, "neon", neon, float32x4_t, 4 lanes,
    tile 5 x 5, gemm 10 x 2, dot 4 x 5,
    vld1q_f32, vst1q_f32, vdupq_n_f32, fmadd_q, vaddq_f32, sum_q);

/// `a·b + c`, rounded once (`vfmaq_f32` takes the addend first).
///
/// # Safety
/// Inside [`Neon::run`](super::Engine::run) (NEON enabled).
#[inline(always)]
unsafe fn fmadd_q(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
    // SAFETY: the caller's: NEON is enabled.
    unsafe { vfmaq_f32(c, a, b) }
}

/// The lane sum of [`super::Engine::sum`]'s tree: lanes l and l + 2, then the two sums.
///
/// # Safety
/// As [`fmadd_q`].
#[inline(always)]
unsafe fn sum_q(v: float32x4_t) -> f32 {
    // SAFETY: the caller's: NEON is enabled.
    unsafe {
        let s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
        vget_lane_f32::<0>(s) + vget_lane_f32::<1>(s)
    }
}
