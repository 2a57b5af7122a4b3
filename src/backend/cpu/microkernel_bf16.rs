//! [`microkernel`](super::microkernel)'s GEMM on bf16 operands with AVX512-BF16's
//! `vdpbf16ps`: two steps of k per instruction.
//!
//! `C (M x N) = A (M x K) · B (K x N)`, or `C += A·B`, with A and B given as bf16 values and
//! C in f32. `vdpbf16ps` multiplies 16 lanes of bf16 *pairs* and adds both products to each
//! f32 lane, so both operands are packed by pairs of consecutive steps of k:
//! - A into panels of [`MR`] rows, `[panel][pair][row]`, each 32-bit word a row's two values
//!   `A[i][2p]` (low half) and `A[i][2p + 1]` (high half);
//! - B into rows of pairs, `[pair][column]`, each word `B[2p][j]` and `B[2p + 1][j]`, the
//!   rows padded with zeros to whole vectors of 16.
//!
//! For an odd K the last pair's high halves are zero in both, so the missing product is
//! exactly 0 · 0. The tile is the f32 one's: 10 rows x 32 columns, 20 accumulators; each pair
//! step loads two vectors of B and broadcasts ten words of A into 20 `vdpbf16ps`, the work
//! of 40 FMA steps of the f32 tile. Products of bf16 values are exact in f32; `vdpbf16ps`
//! adds a lane's two products one after the other, rounding to nearest even, with subnormals
//! read and written as zero (its fixed DAZ/FTZ). The sum over k runs in order, so the result
//! is deterministic; it differs from the f32 tile's in the last bits. There is no portable
//! version: a CPU without AVX512-BF16 widens bf16 and runs the f32 tile (the callers choose,
//! through [`available`]).

use super::microkernel::MR;

/// Columns per register tile: two 16-lane vectors.
const NR: usize = 32;

/// Whether this CPU runs [`gemm_bf16`]: it needs what the window product needs.
pub(super) use super::window_gemm_bf16::available;

/// A word of two bf16 values: `lo` in the low half, `hi` in the high half.
fn word(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | u32::from(hi) << 16
}

/// A (`rows x depth` bf16) packed by pairs of k into panels of [`MR`] rows. The buffer is
/// kept between calls.
#[derive(Default)]
pub(super) struct PairPanels {
    data: Vec<u32>,
    rows: usize,
    pairs: usize,
}

impl PairPanels {
    /// Packs the `rows x depth` matrix whose element (i, k) is `at(i, k)` (a bf16 bit
    /// pattern).
    pub(super) fn pack(&mut self, rows: usize, depth: usize, at: impl Fn(usize, usize) -> u16) {
        let pairs = depth.div_ceil(2);
        self.rows = rows;
        self.pairs = pairs;
        self.data.clear();
        self.data.resize(rows.div_ceil(MR) * pairs * MR, 0);
        if pairs == 0 {
            return;
        }
        for (panel, packed) in self.data.chunks_exact_mut(pairs * MR).enumerate() {
            for i in 0..MR.min(rows - panel * MR) {
                let row = panel * MR + i;
                for p in 0..pairs {
                    let hi = if 2 * p + 1 < depth {
                        at(row, 2 * p + 1)
                    } else {
                        0
                    };
                    packed[p * MR + i] = word(at(row, 2 * p), hi);
                }
            }
        }
    }

    /// Packs the `rows x depth` bf16 matrix (bit patterns) whose element (i, k) is
    /// `src[i·rs + k·cs]`; rows with contiguous k (`cs == 1`) are read a pair at a time.
    ///
    /// # Panics
    /// If an element lies outside `src`.
    pub(super) fn pack_bits(
        &mut self,
        src: &[u16],
        rows: usize,
        depth: usize,
        (rs, cs): (usize, usize),
    ) {
        if rows > 0 && depth > 0 {
            assert!(
                (rows - 1) * rs + (depth - 1) * cs < src.len(),
                "A outside its slice"
            );
        }
        if cs != 1 {
            return self.pack(rows, depth, |i, k| src[i * rs + k * cs]);
        }
        let pairs = depth.div_ceil(2);
        self.rows = rows;
        self.pairs = pairs;
        self.data.clear();
        self.data.resize(rows.div_ceil(MR) * pairs * MR, 0);
        if pairs == 0 {
            return;
        }
        for (panel, packed) in self.data.chunks_exact_mut(pairs * MR).enumerate() {
            for i in 0..MR.min(rows - panel * MR) {
                let row = &src[(panel * MR + i) * rs..][..depth];
                for (p, two) in row.chunks(2).enumerate() {
                    packed[p * MR + i] = word(two[0], two.get(1).copied().unwrap_or(0));
                }
            }
        }
    }
}

/// B (`depth x cols` bf16) packed as rows of pairs of k, each row padded to whole vectors.
/// The buffer is kept between calls.
#[derive(Default)]
pub(super) struct PairRows {
    data: Vec<u32>,
    cols: usize,
    ld: usize,
    pairs: usize,
}

impl PairRows {
    /// Packs the `depth x cols` matrix whose element (k, j) is `at(k, j)` (a bf16 bit
    /// pattern).
    pub(super) fn pack(&mut self, depth: usize, cols: usize, at: impl Fn(usize, usize) -> u16) {
        self.reset(depth, cols);
        let (pairs, ld) = (self.pairs, self.ld);
        for p in 0..pairs {
            let row = &mut self.data[p * ld..p * ld + cols];
            for (j, w) in row.iter_mut().enumerate() {
                let hi = if 2 * p + 1 < depth {
                    at(2 * p + 1, j)
                } else {
                    0
                };
                *w = word(at(2 * p, j), hi);
            }
        }
    }

    /// Packs the `depth x cols` bf16 matrix (bit patterns) whose element (k, j) is
    /// `src[k·rs + j·cs]`; with contiguous rows (`cs == 1`) two rows are interleaved sixteen
    /// columns per step.
    ///
    /// # Panics
    /// If the CPU lacks AVX512-BF16 ([`available`]) or an element lies outside `src`.
    pub(super) fn pack_bits(
        &mut self,
        src: &[u16],
        depth: usize,
        cols: usize,
        (rs, cs): (usize, usize),
    ) {
        assert!(available(), "PairRows::pack_bits needs AVX512-BF16");
        if depth > 0 && cols > 0 {
            assert!(
                (depth - 1) * rs + (cols - 1) * cs < src.len(),
                "B outside its slice"
            );
        }
        if cs != 1 {
            return self.pack(depth, cols, |k, j| src[k * rs + j * cs]);
        }
        #[cfg(target_arch = "x86_64")]
        self.interleave(src, depth, cols, rs, avx512_bf16::pair_row_bits);
    }

    /// Packs the `depth x cols` f32 matrix `src` (rows at stride `ld`) rounded to bf16 (to
    /// nearest even, as `vcvtneps2bf16` does: subnormal inputs become zero, which the product
    /// would read as zero anyway, and a NaN stays a NaN), sixteen columns per step.
    ///
    /// # Panics
    /// If the CPU lacks AVX512-BF16 ([`available`]) or an element lies outside `src`.
    pub(super) fn pack_f32(&mut self, src: &[f32], depth: usize, cols: usize, ld: usize) {
        assert!(available(), "PairRows::pack_f32 needs AVX512-BF16");
        if depth > 0 && cols > 0 {
            assert!(
                cols <= ld && (depth - 1) * ld + cols <= src.len(),
                "B outside its slice"
            );
        }
        #[cfg(target_arch = "x86_64")]
        self.interleave(src, depth, cols, ld, avx512_bf16::pair_row);
    }

    /// The packed words, the words per row, the rows (pairs of k) and the columns: what
    /// `window_gemm_amx::gemm_amx` reads as its B.
    pub(super) fn words(&self) -> (&[u32], usize, usize, usize) {
        (&self.data, self.ld, self.pairs, self.cols)
    }

    /// Sizes the buffer for `depth x cols` (zeroed) and records the shape.
    fn reset(&mut self, depth: usize, cols: usize) {
        self.cols = cols;
        self.ld = cols.div_ceil(16) * 16;
        self.pairs = depth.div_ceil(2);
        self.data.clear();
        self.data.resize(self.pairs * self.ld, 0);
    }

    /// Packs `depth` contiguous rows of `cols` values at stride `rs`, each pair of rows
    /// interleaved into words by `pair_row` (one of `avx512_bf16`'s; the callers asserted
    /// AVX512-BF16 and the rows' bounds).
    #[cfg(target_arch = "x86_64")]
    fn interleave<S>(
        &mut self,
        src: &[S],
        depth: usize,
        cols: usize,
        rs: usize,
        pair_row: unsafe fn(&[S], Option<&[S]>, &mut [u32]),
    ) {
        self.reset(depth, cols);
        if cols == 0 {
            return;
        }
        for p in 0..self.pairs {
            let lo = &src[2 * p * rs..][..cols];
            let hi = (2 * p + 1 < depth).then(|| &src[(2 * p + 1) * rs..][..cols]);
            let row = &mut self.data[p * self.ld..(p + 1) * self.ld];
            // SAFETY: the caller asserted AVX512-BF16 (with AVX-512 F, VL, BW, DQ); lo and
            // hi hold `cols` values and `row` ⌈cols/16⌉·16 words.
            unsafe { pair_row(lo, hi, row) };
        }
    }
}

/// `C = A·B` (or `C += A·B` when `accumulate`), C's `a.rows` rows at stride `ldc`.
///
/// # Panics
/// If the CPU lacks AVX512-BF16 ([`available`]), A and B were packed with different depths,
/// or C is too short.
pub(super) fn gemm_bf16(a: &PairPanels, b: &PairRows, c: &mut [f32], ldc: usize, accumulate: bool) {
    assert!(available(), "gemm_bf16 needs AVX512-BF16");
    assert_eq!(a.pairs, b.pairs, "A and B have different depths");
    let (m, n) = (a.rows, b.cols);
    if m == 0 || n == 0 {
        return;
    }
    assert!(n <= ldc && c.len() >= (m - 1) * ldc + n, "C too short");
    if a.pairs == 0 {
        if !accumulate {
            c.chunks_mut(ldc).take(m).for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    // Column blocks outside, panels inside: each block of B is reused by every panel from
    // cache.
    for j0 in (0..n).step_by(NR) {
        let cols = NR.min(n - j0);
        for (p, panel) in a.data.chunks_exact(a.pairs * MR).enumerate() {
            let rows = MR.min(m - p * MR);
            let c = &mut c[p * MR * ldc + j0..];
            assert!(c.len() >= (rows - 1) * ldc + cols);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX512-BF16 (with AVX-512 F, VL, BW, DQ) asserted above; the panel holds
            // pairs x MR words; each row of B is padded to whole vectors of 16, so it holds
            // 16·⌈cols/16⌉ words from j0 (j0 a multiple of 32 below n); C holds `rows` rows
            // of `cols` from c (asserted).
            unsafe {
                let b = (&b.data[j0..], b.ld);
                let shape = (rows, cols);
                if cols <= 16 {
                    avx512_bf16::tile::<1>(panel, b, a.pairs, (c, ldc), shape, accumulate)
                } else {
                    avx512_bf16::tile::<2>(panel, b, a.pairs, (c, ldc), shape, accumulate)
                }
            };
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("AVX512-BF16 is x86-64 only: {panel:?} {rows} {cols}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512_bf16 {
    use std::arch::x86_64::*;

    use super::MR;
    use crate::backend::cpu::engine::avx512::lanes;

    /// `row[j]` = the bf16 pair (`lo[j]`, `hi[j]`), rounded to nearest even; zero past
    /// `lo.len()`, and a zero high half without `hi`.
    ///
    /// # Safety
    /// AVX-512 F, VL, BW, DQ and AVX512-BF16; `hi` as long as `lo`; `row` holds
    /// ⌈lo.len()/16⌉·16 words.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
    pub(super) unsafe fn pair_row(lo: &[f32], hi: Option<&[f32]>, row: &mut [u32]) {
        let n = lo.len();
        assert!(hi.is_none_or(|h| h.len() == n) && row.len() >= n.div_ceil(16) * 16);
        let half = |v: __m512| -> __m512i {
            // SAFETY: this function's target features are present (caller); the transmute
            // reinterprets 16 bf16 values as 16 u16 (same size, any bits).
            unsafe {
                _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(
                    _mm512_cvtneps_pbh(v),
                ))
            }
        };
        for j in (0..n).step_by(16) {
            let mask = lanes((n - j).min(16));
            // SAFETY: masked lanes stay below n in lo and hi; row holds 16 words from j.
            unsafe {
                let low = half(_mm512_maskz_loadu_ps(mask, lo.as_ptr().add(j)));
                let high = match hi {
                    Some(h) => {
                        _mm512_slli_epi32(half(_mm512_maskz_loadu_ps(mask, h.as_ptr().add(j))), 16)
                    }
                    None => _mm512_setzero_si512(),
                };
                _mm512_storeu_si512(row.as_mut_ptr().add(j).cast(), _mm512_or_si512(low, high));
            }
        }
    }

    /// `row[j]` = the pair (`lo[j]`, `hi[j]`) of bf16 bit patterns; zero past `lo.len()`,
    /// and a zero high half without `hi`.
    ///
    /// # Safety
    /// AVX-512 F, VL and BW; `hi` as long as `lo`; `row` holds ⌈lo.len()/16⌉·16 words.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw")]
    pub(super) unsafe fn pair_row_bits(lo: &[u16], hi: Option<&[u16]>, row: &mut [u32]) {
        let n = lo.len();
        assert!(hi.is_none_or(|h| h.len() == n) && row.len() >= n.div_ceil(16) * 16);
        for j in (0..n).step_by(16) {
            let mask = lanes((n - j).min(16));
            // SAFETY: masked lanes stay below n in lo and hi; row holds 16 words from j.
            unsafe {
                let low = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                    mask,
                    lo.as_ptr().add(j).cast(),
                ));
                let high = match hi {
                    Some(h) => _mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                            mask,
                            h.as_ptr().add(j).cast(),
                        )),
                        16,
                    ),
                    None => _mm512_setzero_si512(),
                };
                _mm512_storeu_si512(row.as_mut_ptr().add(j).cast(), _mm512_or_si512(low, high));
            }
        }
    }

    /// One tile: `C[i][j] (+)= Σ_p` the pair dot product of `panel[p·MR + i]` and
    /// `b[p·ld + j]`, for i < rows ≤ MR and j < cols ≤ 16·V.
    ///
    /// # Safety
    /// AVX-512 F, VL, BW, DQ and AVX512-BF16; `panel` holds `pairs·MR` words; B's `pairs`
    /// rows, `ld` words apart, each hold 16·V words from `b` on; C holds `rows` rows of
    /// `cols` at stride `ldc`.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
    pub(super) unsafe fn tile<const V: usize>(
        panel: &[u32],
        (b, ld): (&[u32], usize),
        pairs: usize,
        (c, ldc): (&mut [f32], usize),
        (rows, cols): (usize, usize),
        accumulate: bool,
    ) {
        let mut mask = [0 as __mmask16; V];
        for (v, m) in mask.iter_mut().enumerate() {
            *m = lanes(cols.saturating_sub(v * 16).min(16));
        }
        let zero = std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512());
        let mut acc = [[_mm512_setzero_ps(); V]; MR];
        let (a, bp) = (panel.as_ptr(), b.as_ptr());
        // SAFETY: pair p's row of B holds 16·V words from bp + p·ld and the panel MR words
        // from a + p·MR (caller); C's rows hold `cols` elements, the masks keep every access
        // below them. The transmutes reinterpret 512 bits of integers as 32 bf16 values
        // (same size, and every bit pattern is a bf16).
        unsafe {
            for p in 0..pairs {
                let bk = bp.add(p * ld);
                let mut bv = [zero; V];
                for (v, bv) in bv.iter_mut().enumerate() {
                    *bv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        bk.add(v * 16).cast(),
                    ));
                }
                let ak = a.add(p * MR);
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        *ak.add(i) as i32,
                    ));
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
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use rand::Rng;

    use super::super::product_check::{assert_product, poisoned, seeded};
    use super::*;

    /// Against a float64 product of the same bf16 values: rows and columns around the tile
    /// edges (1, 9, 10, 11, 16, 17, 32, 33, 50 and 500 x 97), odd and even depths (0, 1, 2,
    /// 49, 50, 128), overwrite and accumulate; C's padding poisoned. Fails (not skips) only
    /// where the CPU has AVX512-BF16; elsewhere it says it did not run.
    #[test]
    fn gemm_bf16_matches_float64() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512-BF16 (the f32 tile serves bf16 here)");
            return;
        }
        let mut rng = seeded(13);
        let bf = |v: f32| bf16::from_f32(v).to_bits();
        let value = |b: u16| f64::from(bf16::from_bits(b).to_f32());
        let cases = [
            (1, 1, 1),
            (10, 32, 2),
            (9, 17, 49),
            (11, 33, 50),
            (16, 16, 0),
            (50, 97, 128),
            (500, 97, 50),
            (20, 5408, 9),
        ];
        for (m, n, k) in cases {
            let a: Vec<u16> = (0..m * k).map(|_| bf(rng.gen_range(-1.0..1.0))).collect();
            let b: Vec<u16> = (0..k * n).map(|_| bf(rng.gen_range(-1.0..1.0))).collect();
            let (mut pa, mut pb) = (PairPanels::default(), PairRows::default());
            // A row-major, B column-major: the packers take any layout.
            pa.pack(m, k, |i, kk| a[i * k + kk]);
            pb.pack(k, n, |kk, j| b[j * k + kk]);
            let ldc = n + 3;
            let c0: Vec<f32> = (0..m * ldc).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for accumulate in [false, true] {
                let mut c = poisoned(&c0, n, ldc);
                gemm_bf16(&pa, &pb, &mut c, ldc, accumulate);
                let term =
                    |i: usize, j: usize, kk: usize| value(a[i * k + kk]) * value(b[j * k + kk]);
                let what = format!("{m} x {n} x {k}");
                assert_product(&c, &c0, (m, n, ldc), k, accumulate, term, &what);
            }
        }
    }

    /// The vectorized f32 packing rounds as the scalar conversion does (to nearest even, ties
    /// included), at widths around the vector edge and for odd and even depths.
    #[test]
    fn pack_f32_rounds_like_the_scalar_conversion() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        let mut rng = seeded(14);
        for (depth, cols) in [(1, 1), (2, 15), (3, 16), (5, 17), (50, 648)] {
            let ld = cols + 2;
            let mut src: Vec<f32> = (0..depth * ld).map(|_| rng.gen_range(-4.0..4.0)).collect();
            // Ties: exactly halfway between two bf16 values, both parities.
            src[0] = f32::from_bits(0x3f80_8000);
            if src.len() > 1 {
                src[1] = f32::from_bits(0x3f81_8000);
            }
            let (mut vector, mut scalar) = (PairRows::default(), PairRows::default());
            vector.pack_f32(&src, depth, cols, ld);
            scalar.pack(depth, cols, |k, j| {
                bf16::from_f32(src[k * ld + j]).to_bits()
            });
            assert_eq!(vector.data, scalar.data, "{depth} x {cols}");
        }
    }
}
