//! The AVX-512 engine: 16 lanes of f32 in a zmm register, fused multiply-adds. Its 32
//! registers hold a tile of 5 x 5 accumulators, the 5 vectors of one operand and a
//! broadcast of the other.

/// AVX-512 F, VL, BW and DQ.
pub(in crate::backend::cpu) struct Avx512;

super::simd_engine!(Avx512: Avx512, std::arch::x86_64, "avx512f,avx512vl,avx512bw,avx512dq",
    avx512, __m512, 16 lanes, tile 5 x 5, gemm 10 x 2, dot 4 x 5,
    _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps,
    _mm512_add_ps, sum_512);

/// The lanes below `n` of a 16-lane AVX-512 vector, as a write or load mask (n ≤ 16).
pub(in crate::backend::cpu) fn lanes(n: usize) -> __mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as __mmask16
}

/// The lane sum of [`super::Engine::sum`]'s tree: lanes l and l + 8, then the AVX2 tree.
///
/// # Safety
/// Inside [`Avx512::run`](super::Engine::run) (AVX-512 F and DQ enabled).
#[inline(always)]
unsafe fn sum_512(v: __m512) -> f32 {
    // SAFETY: the caller's: AVX-512 F and DQ are enabled.
    unsafe {
        let s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
        super::avx2::sum_256(s8)
    }
}
