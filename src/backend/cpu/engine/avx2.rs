//! The AVX2 engine: 8 lanes of f32 in a ymm register, fused multiply-adds (FMA3). Its 16
//! registers hold a tile of 3 x 3 accumulators, the 3 vectors of one operand and a
//! broadcast of the other, with room for the compiler (at 4 x 3, 16 exactly, the forward
//! spilled an accumulator every tap).

/// AVX2 with FMA (and F16C for the conversions compiled with it).
pub(in crate::backend::cpu) struct Avx2;

super::simd_engine!(Avx2: Avx2, std::arch::x86_64, "avx2,fma,f16c", avx2, __m256, 8 lanes,
    tile 3 x 3, gemm 5 x 2, dot 2 x 5,
    _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps,
    _mm256_add_ps, sum_256);

/// The lane sum of [`super::Engine::sum`]'s tree: lanes l and l + 4, then l and l + 2,
/// then the last two.
///
/// # Safety
/// Inside [`Avx2::run`](super::Engine::run) (AVX enabled).
#[inline(always)]
pub(super) unsafe fn sum_256(v: __m256) -> f32 {
    // SAFETY: the caller's: AVX is enabled.
    unsafe {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
    }
}
