//! The AVX2 engine: 8 lanes of f32 in a ymm register, fused multiply-adds (FMA3). Its 16
//! registers hold a tile of 3 x 3 accumulators, the 3 vectors of one operand and a
//! broadcast of the other, with room for the compiler (at 4 x 3, 16 exactly, the forward
//! spilled an accumulator every tap).

/// AVX2 with FMA (and F16C for the conversions compiled with it).
pub(in crate::backend::cpu) struct Avx2;

super::x86_engine!(Avx2: Avx2, "avx2,fma,f16c", avx2, __m256, 8 lanes, tile 3 x 3,
    _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps,
    _mm256_add_ps);
