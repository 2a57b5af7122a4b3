//! The window product on bf16 operands with AVX512-BF16's `vdpbf16ps`: two steps of k per
//! instruction.
//!
//! `C[o][r] = Σ_k W[k][o] · x[rows[r] + steps[k]]`, where x holds a group of images and
//! `rows`/`steps` are offsets into it: for the forward, r runs over output pixels (each
//! pixel's window offset) and k over the filter's taps, W is the filter transposed; for the
//! filter gradient, r runs over taps, k over output pixels, W is the output gradient
//! transposed. x and W hold bf16 values. `vdpbf16ps` multiplies 16 lanes of bf16 *pairs* and adds both products to
//! each f32 lane, so the steps of k are taken two at a time:
//! - a **pair** is two consecutive steps whose offsets are adjacent in memory
//!   (`steps[k + 1] = steps[k] + 1`: neighbouring taps of a filter row, neighbouring pixels
//!   of an output row), found by [`pairs`]. Both of its x values are one 32-bit load from the
//!   [`PairImage`], where element i holds x[i] and x[i + 1];
//! - a step with no partner (the fifth tap of a 5-wide filter row) is a **single**: its
//!   broadcast keeps x's low half and zeroes the high half, and W's high half is zero, so the
//!   missing product is exactly 0 · 0, whatever x[i + 1] holds (an inf there cannot leak in).
//!
//! W is packed as `[chunk of 64 columns][pair][64]` 32-bit words (the pair's two weights per
//! column), so one 512-bit load gives 16 columns' pairs. The tile is R values of r by V
//! vectors of 16 columns, 24 accumulators, each pair step one load of W per vector
//! and one broadcast per value of r into R·V `vdpbf16ps`: conv2's 5x5 filter is 15 pair steps
//! per input channel instead of 25 FMA steps.
//!
//! Products of bf16 values are exact in f32, and `vdpbf16ps` adds the two products of a lane
//! to it one after the other, rounding to nearest even, with bf16 and f32 subnormals read and
//! written as zero (its fixed DAZ/FTZ). Sums run over k in order in blocks of
//! [`PairWindows::block`] pairs, so the result is deterministic; it differs from the f32
//! products' in the last bits. There is no portable version: a CPU without AVX512-BF16 runs
//! the f32 products on the widened operands (`conv.rs` chooses). AMX (`window_gemm_amx`)
//! takes the same pairs.

use super::isa::isa;

/// Output channels per chunk of W: four 16-lane vectors.
const CHUNK: usize = 64;

/// The offsets of the R values of r from `r0` on; past the edge the last offset repeats
/// (always inside x), and [`store_tile`] drops those sums.
fn tile_bases<const R: usize>(rows: &[usize], r0: usize) -> [usize; R] {
    std::array::from_fn(|i| rows[(r0 + i).min(rows.len() - 1)])
}

/// Writes (or with `accumulate` adds) a tile's sums `out[i][o]` into `C[o][r0 + i]` for the
/// `width` columns of the chunk and the values of r below `n`.
fn store_tile<const R: usize>(
    out: &[[f32; CHUNK]; R],
    (r0, n): (usize, usize),
    width: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let count = R.min(n - r0);
    for (o, c_row) in c.chunks_mut(ldc).take(width).enumerate() {
        let c_row = &mut c_row[r0..r0 + count];
        for (dst, sums) in c_row.iter_mut().zip(out) {
            *dst = if accumulate { *dst + sums[o] } else { sums[o] };
        }
    }
}

/// How [`pairs`] groups the steps of k: `first` is the step's index and `offset` its offset;
/// `paired` says that step `first + 1`, at `offset + 1`, comes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pair {
    pub(super) first: usize,
    pub(super) offset: usize,
    pub(super) paired: bool,
}

/// Groups `steps` (offsets) into pairs of consecutive steps at adjacent offsets, in order; a
/// step whose successor is not adjacent stays single.
pub(super) fn pairs(steps: &[usize]) -> Vec<Pair> {
    let mut out = Vec::with_capacity(steps.len().div_ceil(2));
    let mut k = 0;
    while k < steps.len() {
        let paired = k + 1 < steps.len() && steps[k + 1] == steps[k] + 1;
        out.push(Pair {
            first: k,
            offset: steps[k],
            paired,
        });
        k += 1 + usize::from(paired);
    }
    out
}

/// x as overlapping pairs: element i is bf16 `x[i]` in its low half and `x[i + 1]` in its
/// high half (zero past the end). The buffer is kept between calls.
#[derive(Default)]
pub(super) struct PairImage {
    data: Vec<u32>,
}

impl PairImage {
    /// Builds the pairs of `x` (bf16 bit patterns), sixteen per step with AVX-512.
    pub(super) fn build(&mut self, x: &[u16]) -> &[u32] {
        self.data.clear();
        self.data.resize(x.len(), 0);
        #[cfg(target_arch = "x86_64")]
        if isa().avx512 {
            // SAFETY: AVX-512 F and BW were detected; data holds x.len() words.
            unsafe { avx512_bf16::pair_image(x, &mut self.data) };
            return &self.data;
        }
        for (i, w) in self.data.iter_mut().enumerate() {
            let hi = x.get(i + 1).copied().unwrap_or(0);
            *w = u32::from(x[i]) | u32::from(hi) << 16;
        }
        &self.data
    }
}

/// W (`steps x cols`) packed by pairs of steps: `[chunk of 64 columns][pair][64]`, each word
/// the pair's two bf16 weights of one column (the second zero for a single), zero-padded past
/// `cols`. The buffer is kept between calls.
#[derive(Default)]
pub(super) struct PackedPairs {
    data: Vec<u32>,
    cols: usize,
    pairs: usize,
}

impl PackedPairs {
    /// Packs `W[k][o] = src[o·ld + k]` (bf16 bit patterns; the transpose of a row-major
    /// `cols x depth` matrix) by `pairs`.
    ///
    /// # Panics
    /// If an element lies outside `src`.
    pub(super) fn pack_transposed(&mut self, src: &[u16], cols: usize, ld: usize, pairs: &[Pair]) {
        let depth = pairs
            .last()
            .map_or(0, |p| p.first + 1 + usize::from(p.paired));
        if cols > 0 && depth > 0 {
            assert!(
                depth <= ld && (cols - 1) * ld + depth <= src.len(),
                "W outside its slice"
            );
        }
        self.cols = cols;
        self.pairs = pairs.len();
        self.data.clear();
        self.data
            .resize(cols.div_ceil(CHUNK) * pairs.len() * CHUNK, 0);
        for (chunk, packed) in self.data.chunks_exact_mut(pairs.len() * CHUNK).enumerate() {
            for o in 0..CHUNK.min(cols - chunk * CHUNK) {
                let row = &src[(chunk * CHUNK + o) * ld..];
                for (p, pair) in pairs.iter().enumerate() {
                    let hi = if pair.paired { row[pair.first + 1] } else { 0 };
                    packed[p * CHUNK + o] = u32::from(row[pair.first]) | u32::from(hi) << 16;
                }
            }
        }
    }
}

/// The operand read from the pair image: step pair p of row r is
/// `src[rows[r] + pairs[p].offset]`.
pub(super) struct PairWindows<'a> {
    /// The images as pairs ([`PairImage`]).
    pub(super) src: &'a [u32],
    /// One offset per value of r.
    pub(super) rows: &'a [usize],
    /// The steps of k grouped by [`pairs`], as W was packed.
    pub(super) pairs: &'a [Pair],
    /// Pairs summed in the registers from zero before they join the running total
    /// (blocked summation, as the f32 tile's `Windows::block` counts steps).
    pub(super) block: usize,
}

/// Whether this CPU runs [`window_gemm_bf16`].
pub(super) fn available() -> bool {
    isa().avx512_bf16
}

/// `C[o][r] = Σ_k W[k][o] · X[r][k]` (or `+=` when `accumulate`) for `o < w.cols` and
/// `r < x.rows.len()`, C's rows at stride `ldc`.
///
/// # Panics
/// If the CPU lacks AVX512-BF16 ([`available`]), the pairs do not match W, an offset lies
/// outside `x.src`, or C is too short.
pub(super) fn window_gemm_bf16(
    x: &PairWindows,
    w: &PackedPairs,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(available(), "window_gemm_bf16 needs AVX512-BF16");
    let (n, cols) = (x.rows.len(), w.cols);
    assert_eq!(x.pairs.len(), w.pairs, "pairs do not match W's");
    if n == 0 || cols == 0 {
        return;
    }
    assert!(n <= ldc && c.len() >= (cols - 1) * ldc + n, "C too short");
    let farthest = x.pairs.iter().map(|p| p.offset).max();
    if let (Some(r), Some(s)) = (x.rows.iter().max(), farthest) {
        assert!(r + s < x.src.len(), "a window lies outside the images");
    }
    if x.pairs.is_empty() {
        if !accumulate {
            c.chunks_mut(ldc)
                .take(cols)
                .for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    for (chunk, packed) in w.data.chunks_exact(w.pairs * CHUNK).enumerate() {
        let width = CHUNK.min(cols - chunk * CHUNK);
        let c = &mut c[chunk * CHUNK * ldc..];
        match width.div_ceil(16) {
            1 => tiles::<1, 24>(x, packed, width, c, ldc, accumulate),
            2 => tiles::<2, 12>(x, packed, width, c, ldc, accumulate),
            3 => tiles::<3, 8>(x, packed, width, c, ldc, accumulate),
            _ => tiles::<4, 6>(x, packed, width, c, ldc, accumulate),
        }
    }
}

/// One chunk of W (`width` ≤ 64 columns, V vectors) against every value of r, R at a time.
fn tiles<const V: usize, const R: usize>(
    x: &PairWindows,
    packed: &[u32],
    width: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let mut out = [[0.0f32; CHUNK]; R];
    let block = x.block.max(1);
    for r0 in (0..x.rows.len()).step_by(R) {
        let bases = tile_bases::<R>(x.rows, r0);
        for (b, pairs) in x.pairs.chunks(block).enumerate() {
            let w = &packed[b * block * CHUNK..];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: window_gemm_bf16 asserted AVX512-BF16 (with AVX-512 F, VL, BW, DQ) and
            // every bases[i] + pairs[p].offset inside src; W holds a row of 64 per pair.
            unsafe {
                avx512_bf16::tile::<V, R>(x.src, &bases, pairs, w, &mut out, b > 0)
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("AVX512-BF16 is x86-64 only: {w:?} {pairs:?}");
        }
        store_tile(&out, (r0, x.rows.len()), width, c, ldc, accumulate);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512_bf16 {
    use std::arch::x86_64::*;

    use super::{Pair, CHUNK};
    use crate::backend::cpu::engine::avx512::lanes;

    /// `out[i][16·v ..]` = `acc[i][v]`, or `+=` when `accumulate`: a tile's registers into
    /// its running total.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn add_into<const V: usize, const R: usize>(
        out: &mut [[f32; CHUNK]; R],
        acc: &[[__m512; V]; R],
        accumulate: bool,
    ) {
        assert!(V * 16 <= CHUNK);
        for (out, acc) in out.iter_mut().zip(acc) {
            for (v, a) in acc.iter().enumerate() {
                // SAFETY: v·16 + 16 ≤ CHUNK (asserted): inside the row.
                unsafe {
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

    /// [`super::PairImage::build`]: word i is `x[i] | x[i + 1] << 16` (zero past the end).
    ///
    /// # Safety
    /// AVX-512 F and BW; `out` as long as `x`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn pair_image(x: &[u16], out: &mut [u32]) {
        assert_eq!(x.len(), out.len());
        let n = x.len();
        for i in (0..n).step_by(16) {
            let (here, next) = (lanes((n - i).min(16)), lanes((n - i - 1).min(16)));
            // SAFETY: the masks keep lanes below n for both loads and the store.
            unsafe {
                let lo =
                    _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(here, x.as_ptr().add(i).cast()));
                let hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                    next,
                    x.as_ptr().add(i + 1).cast(),
                ));
                let words = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
                _mm512_mask_storeu_epi32(out.as_mut_ptr().add(i).cast(), here, words);
            }
        }
    }

    /// `out[i][o] = Σ_p` the bf16 pair dot product of `w[p·64 + o]` and
    /// `src[bases[i] + pairs[p].offset]` (its high half zeroed for a single), for o < 16·V,
    /// from zero, then added to `out` when `accumulate`.
    ///
    /// # Safety
    /// AVX-512 F, VL, BW, DQ and AVX512-BF16; every `bases[i] + pairs[p].offset` inside
    /// `src`; `w` at least `pairs.len()·64` long.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
    pub(super) unsafe fn tile<const V: usize, const R: usize>(
        src: &[u32],
        bases: &[usize; R],
        pairs: &[Pair],
        w: &[u32],
        out: &mut [[f32; CHUNK]; R],
        accumulate: bool,
    ) {
        assert!(w.len() >= pairs.len() * CHUNK);
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let x = src.as_ptr();
        let wp = w.as_ptr();
        // SAFETY: bases[i] + pairs[p].offset lies inside src (caller), so every pointer
        // formed below and every word read is inside it; W rows are in bounds (asserted).
        // The transmutes reinterpret 512 bits of integers as 32 bf16 values (same size, and
        // every bit pattern is a bf16).
        unsafe {
            let mut rows = [x; R];
            for (p, &b) in rows.iter_mut().zip(bases) {
                *p = x.add(b);
            }
            for (p, pair) in pairs.iter().enumerate() {
                let wk = wp.add(p * CHUNK);
                let mut wv = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); V];
                for (v, wv) in wv.iter_mut().enumerate() {
                    *wv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        wk.add(v * 16).cast(),
                    ));
                }
                // One step of R broadcasts into R·V dot products, the broadcast word read
                // by `load` (a macro, so each branch below is straight-line code).
                macro_rules! step {
                    ($load:expr) => {
                        for (acc, r) in acc.iter_mut().zip(rows) {
                            let word = $load(r) as i32;
                            let b =
                                std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(word));
                            for (a, wv) in acc.iter_mut().zip(wv) {
                                *a = _mm512_dpbf16_ps(*a, b, wv);
                            }
                        }
                    };
                }
                // A pair's word is broadcast straight from memory; a single's goes through
                // a register to clear its high half.
                if pair.paired {
                    step!(|r: *const u32| *r.add(pair.offset));
                } else {
                    step!(|r: *const u32| *r.add(pair.offset) & 0xffff);
                }
            }
            add_into(out, &acc, accumulate);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::super::product_check::{check_pair_product, conv2_pixels, conv2_taps, seeded};
    use super::*;

    /// The pair image's word i is `x[i]` low and `x[i + 1]` high (zero past the end), for
    /// every length from 0 to 40 (ragged vectors) on random bit patterns.
    #[test]
    fn the_pair_image_pairs_each_element_with_the_next() {
        let mut rng = seeded(3);
        let mut image = PairImage::default();
        for n in 0..=40 {
            let x: Vec<u16> = (0..n).map(|_| rng.gen()).collect();
            let want: Vec<u32> = (0..n)
                .map(|i| u32::from(x[i]) | u32::from(x.get(i + 1).copied().unwrap_or(0)) << 16)
                .collect();
            assert_eq!(image.build(&x), want, "length {n}");
        }
    }

    /// Steps at adjacent offsets pair up, in order; the rest stay single.
    #[test]
    fn steps_pair_where_their_offsets_are_adjacent() {
        let group = |steps: &[usize]| -> Vec<(usize, usize, bool)> {
            pairs(steps)
                .iter()
                .map(|p| (p.first, p.offset, p.paired))
                .collect()
        };
        // A 5-wide filter row, then the next row 13 further on.
        let taps = [0, 1, 2, 3, 4, 13, 14, 15, 16, 17];
        assert_eq!(
            group(&taps),
            [
                (0, 0, true),
                (2, 2, true),
                (4, 4, false),
                (5, 13, true),
                (7, 15, true),
                (9, 17, false)
            ]
        );
        assert_eq!(group(&[7]), [(0, 7, false)]);
        assert!(pairs(&[]).is_empty());
        assert_eq!(group(&[3, 2, 3]), [(0, 3, false), (1, 2, true)]);
    }

    /// Against a float64 product of the same bf16 values, for offsets shaped like conv2's
    /// forward (5-wide filter rows: pairs and singles) and filter gradient (9-pixel output
    /// rows), channel counts covering every tile shape and ragged chunks, R not a multiple
    /// of the tile, overwrite and accumulate, blocks of 3 pairs and one block; C's padding
    /// poisoned; infinities placed right after every single's element must not leak in.
    /// Fails (not skips) only where the CPU has AVX512-BF16; elsewhere it says it did not run.
    #[test]
    fn window_gemm_bf16_matches_float64() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512-BF16 (the f32 tile serves bf16 here)");
            return;
        }
        let (taps, pixels) = (conv2_taps(50), conv2_pixels(97));
        let cases: Vec<(usize, &[usize], &[usize])> = vec![
            (50, &pixels, &taps),
            (20, &taps, &pixels),
            (1, &pixels[..7], &taps[..3]),
            (16, &taps[..1], &pixels),
            (64, &pixels[..25], &taps),
            (67, &pixels[..13], &taps[..9]),
            (130, &taps[..31], &pixels[..40]),
        ];
        check_pair_product(12, &cases, |windows, w, (cols, ld), c, ldc, accumulate| {
            let mut packed = PackedPairs::default();
            packed.pack_transposed(w, cols, ld, windows.pairs);
            window_gemm_bf16(windows, &packed, c, ldc, accumulate);
        });
    }
}
