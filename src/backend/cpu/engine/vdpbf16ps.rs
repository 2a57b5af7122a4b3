//! The AVX512-BF16 pair engine: `vdpbf16ps` multiplies 16 lanes of bf16 pairs and adds both
//! products to each f32 lane (Zen 4 and later, Sapphire Rapids and later). Its register
//! tiles for the bf16 pair products of `pairs.rs` (the window product and the GEMM), and the
//! vector moves that build their operands.

use std::arch::x86_64::*;

use super::avx512::lanes;
use crate::backend::cpu::microkernel::MR;
use crate::backend::cpu::pairs::{Pair, CHUNK};

/// 512 bits of integers as 32 bf16 values (same size, and every bit pattern is a bf16).
#[inline(always)]
fn as_bf16(v: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit plain-data vectors.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// The pair image (`pairs::PairImage`): word i is `x[i] | x[i + 1] << 16` (zero past the end).
///
/// # Safety
/// AVX-512 F and BW; `out` as long as `x`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(in crate::backend::cpu) unsafe fn pair_image(x: &[u16], out: &mut [u32]) {
    assert_eq!(x.len(), out.len());
    let n = x.len();
    for i in (0..n).step_by(16) {
        let (here, next) = (lanes((n - i).min(16)), lanes((n - i - 1).min(16)));
        // SAFETY: the masks keep lanes below n for both loads and the store.
        unsafe {
            let lo =
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(here, x.as_ptr().add(i).cast()));
            let hi =
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(next, x.as_ptr().add(i + 1).cast()));
            let words = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
            _mm512_mask_storeu_epi32(out.as_mut_ptr().add(i).cast(), here, words);
        }
    }
}

/// `row[j]` = the pair (`lo[j]`, `hi[j]`), each value's bf16 bits from 16 at a time by
/// `halves(mask, pointer)` (in the low halves of 16 words); zero past `lo.len()`, and a zero
/// high half without `hi`.
///
/// # Safety
/// Inside a function with what `halves` needs enabled; `hi` as long as `lo`; `row` holds
/// ⌈lo.len()/16⌉·16 words.
#[inline(always)]
unsafe fn pair_row<S>(
    lo: &[S],
    hi: Option<&[S]>,
    row: &mut [u32],
    halves: impl Fn(__mmask16, *const S) -> __m512i,
) {
    let n = lo.len();
    assert!(hi.is_none_or(|h| h.len() == n) && row.len() >= n.div_ceil(16) * 16);
    for j in (0..n).step_by(16) {
        let mask = lanes((n - j).min(16));
        // SAFETY: masked lanes stay below n in lo and hi; row holds 16 words from j.
        unsafe {
            let low = halves(mask, lo.as_ptr().add(j));
            let high = match hi {
                Some(h) => _mm512_slli_epi32(halves(mask, h.as_ptr().add(j)), 16),
                None => _mm512_setzero_si512(),
            };
            _mm512_storeu_si512(row.as_mut_ptr().add(j).cast(), _mm512_or_si512(low, high));
        }
    }
}

/// [`pair_row`] of f32 values rounded to bf16 (to nearest even, `vcvtneps2bf16`).
///
/// # Safety
/// AVX-512 F, VL, BW, DQ and AVX512-BF16; as [`pair_row`].
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
pub(in crate::backend::cpu) unsafe fn pair_row_f32(
    lo: &[f32],
    hi: Option<&[f32]>,
    row: &mut [u32],
) {
    // SAFETY: the caller's; the masked loads read lanes below the rows' ends, and the
    // transmute reinterprets 16 bf16 values as 16 u16 (same size, any bits).
    unsafe {
        pair_row(lo, hi, row, |mask, p| {
            let v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, p));
            _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(v))
        })
    }
}

/// [`pair_row`] of bf16 bit patterns.
///
/// # Safety
/// AVX-512 F, VL and BW; as [`pair_row`].
#[target_feature(enable = "avx512f,avx512vl,avx512bw")]
pub(in crate::backend::cpu) unsafe fn pair_row_bits(
    lo: &[u16],
    hi: Option<&[u16]>,
    row: &mut [u32],
) {
    // SAFETY: the caller's; the masked loads read lanes below the rows' ends.
    unsafe {
        pair_row(lo, hi, row, |mask, p| {
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p.cast()))
        })
    }
}

/// The window product's tile: `out[i][o] = Σ_p` the pair dot product of `w[p·64 + o]` and
/// `src[bases[i] + pairs[p].offset]` (its high half zeroed for a single), for o < 16·V,
/// from zero, then added to `out` when `accumulate`.
///
/// # Safety
/// AVX-512 F, VL, BW, DQ and AVX512-BF16; every `bases[i] + pairs[p].offset` inside
/// `src`; `w` at least `pairs.len()·64` long.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
pub(in crate::backend::cpu) unsafe fn window_tile<const V: usize, const R: usize>(
    src: &[u32],
    bases: &[usize; R],
    pairs: &[Pair],
    w: &[u32],
    out: &mut [[f32; CHUNK]; R],
    accumulate: bool,
) {
    assert!(w.len() >= pairs.len() * CHUNK && V * 16 <= CHUNK);
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    // SAFETY: bases[i] + pairs[p].offset lies inside src (caller), so every pointer formed
    // below and every word read is inside it; W rows are in bounds (asserted), and each
    // row of `out` holds 16·V ≤ CHUNK values (asserted).
    unsafe {
        let rows: [*const u32; R] = std::array::from_fn(|i| src.as_ptr().add(bases[i]));
        for (p, pair) in pairs.iter().enumerate() {
            let wk = w.as_ptr().add(p * CHUNK);
            let wv: [__m512bh; V] =
                std::array::from_fn(|v| as_bf16(_mm512_loadu_si512(wk.add(v * 16).cast())));
            // One step of R broadcasts into R·V dot products, the broadcast word read by
            // `load` (a macro, so each branch below is straight-line code).
            macro_rules! step {
                ($load:expr) => {
                    for (acc, r) in acc.iter_mut().zip(rows) {
                        let b = as_bf16(_mm512_set1_epi32($load(r) as i32));
                        for (a, wv) in acc.iter_mut().zip(wv) {
                            *a = _mm512_dpbf16_ps(*a, b, wv);
                        }
                    }
                };
            }
            // A pair's word is broadcast straight from memory; a single's goes through a
            // register to clear its high half.
            if pair.paired {
                step!(|r: *const u32| *r.add(pair.offset));
            } else {
                step!(|r: *const u32| *r.add(pair.offset) & 0xffff);
            }
        }
        for (out, acc) in out.iter_mut().zip(&acc) {
            for (v, a) in acc.iter().enumerate() {
                let at = out.as_mut_ptr().add(v * 16);
                let sum = if accumulate {
                    _mm512_add_ps(_mm512_loadu_ps(at), *a)
                } else {
                    *a
                };
                _mm512_storeu_ps(at, sum);
            }
        }
    }
}

/// The GEMM's tile: `C[i][j] (+)= Σ_p` the pair dot product of `panel[p·MR + i]` and
/// `b[p·ld + j]`, for i < rows ≤ MR and j < cols ≤ 16·V.
///
/// # Safety
/// AVX-512 F, VL, BW, DQ and AVX512-BF16; `panel` holds `pairs·MR` words; B's `pairs`
/// rows, `ld` words apart, each hold 16·V words from `b` on; C holds `rows` rows of
/// `cols` at stride `ldc`.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
pub(in crate::backend::cpu) unsafe fn gemm_tile<const V: usize>(
    panel: &[u32],
    (b, ld): (&[u32], usize),
    pairs: usize,
    (c, ldc): (&mut [f32], usize),
    (rows, cols): (usize, usize),
    accumulate: bool,
) {
    let mask: [__mmask16; V] = std::array::from_fn(|v| lanes(cols.saturating_sub(v * 16).min(16)));
    let mut acc = [[_mm512_setzero_ps(); V]; MR];
    let (a, bp) = (panel.as_ptr(), b.as_ptr());
    // SAFETY: pair p's row of B holds 16·V words from bp + p·ld and the panel MR words from
    // a + p·MR (caller); C's rows hold `cols` elements, the masks keep every access below
    // them.
    unsafe {
        for p in 0..pairs {
            let bk = bp.add(p * ld);
            let bv: [__m512bh; V] =
                std::array::from_fn(|v| as_bf16(_mm512_loadu_si512(bk.add(v * 16).cast())));
            let ak = a.add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = as_bf16(_mm512_set1_epi32(*ak.add(i) as i32));
                for (r, bv) in row.iter_mut().zip(bv) {
                    *r = _mm512_dpbf16_ps(*r, av, bv);
                }
            }
        }
        let cp = c.as_mut_ptr();
        for (i, row) in acc.iter().enumerate().take(rows) {
            for (v, r) in row.iter().enumerate() {
                let ci = cp.add(i * ldc).wrapping_add(v * 16);
                let mut r = *r;
                if accumulate {
                    r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask[v], ci));
                }
                _mm512_mask_storeu_ps(ci, mask[v], r);
            }
        }
    }
}
