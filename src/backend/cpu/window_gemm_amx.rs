//! [`window_gemm_bf16`](super::window_gemm_bf16)'s product on AMX tiles (`tdpbf16ps`), where
//! the CPU has AMX-BF16 (Sapphire Rapids and later Xeons), and the plain product of the input
//! gradient ([`gemm_amx`]).
//!
//! `C[o][r] = Σ_p A[o][p] · X[r][p]` over pairs p of steps of k, with A's words packed by
//! [`PairRowsA::pack`] and X's read from the pair image through [`PairWindows`]: the same
//! pairs and singles as the `vdpbf16ps` product, the forward (o: output channels, r: output
//! pixels, p: pairs of taps) and the filter gradient (o: output channels, r: taps, p: pairs
//! of pixels) alike. [`gemm_amx`] takes B already packed as rows of pairs ([`PairRows`]):
//! the input gradient's `wᵀ · dy`, by pairs of output channels.
//!
//! One `tdpbf16ps` multiplies a tile of 16 rows x 16 pairs of A by 16 pairs x 16 columns of
//! B (32-bit words, a pair per word) into 16 x 16 f32 sums: 8,192 multiply-adds, 256 times a
//! `vdpbf16ps`'s. The kernel holds a 32 x 32 block of C in four tiles (tmm0-3), two tiles of A
//! (tmm4-5) and two of B (tmm6-7), so each step of 16 pairs loads four tiles for four
//! products. A is packed by the caller (the filter once per call, dy once per group of
//! images) in 32-row panels, the pairs padded to a multiple of 16 with zero words; X is
//! gathered per block of 32 values of r (`vpgatherdd`, 16 at a time) into a B panel of
//! `pairs x 32` words, which then serves every panel of A.
//!
//! Work: each of conv2's three products is 1.04 GFLOP per batch of 256 (50 x 500 x 81 per
//! image), 1.5x that with the padding (50 rows in 64, singles as half-empty pairs). About
//! twice the f32 tiles' speed (docs/cpu-backend.md has the figures); the tile loads wait on
//! the products before them (no spare tiles to alternate), far from AMX's nominal rate.
//!
//! Sums: a tile's lanes add their pairs in order, each product of two bf16 values exact in
//! f32 and each addition rounded to nearest even with subnormals flushed (AMX's fixed
//! DAZ/FTZ, as `vdpbf16ps`), accumulating over all pairs in order (no blocks: `PairWindows::
//! block` is the `vdpbf16ps` tile's). Deterministic; it differs from the other paths in the
//! last bits.
//!
//! The tile registers are per thread: each call loads its configuration (`ldtilecfg`) and
//! releases the tiles (`tilerelease`) before it returns, so nothing else sees them. Linux
//! must grant a process the right to use them once ([`enable`]); `isa::Isa::amx` is set only
//! where that succeeded.

use super::microkernel_bf16::PairRows;
use super::window_gemm_bf16::{Pair, PairWindows};

/// Rows (and columns) of C per block: two tiles of 16.
const BLOCK: usize = 32;
/// Pairs per tile step.
const STEP: usize = 16;

/// A (`rows x pairs` 32-bit words, two bf16 values each) in panels of [`BLOCK`] rows, each row
/// padded to whole steps of 16 pairs and the last panel to whole rows with zero words. The
/// buffer is kept between calls.
#[derive(Default)]
pub(super) struct PairRowsA {
    data: Vec<u32>,
    rows: usize,
    pairs: usize,
    /// Words per row: `pairs` rounded up to a multiple of [`STEP`].
    ld: usize,
}

impl PairRowsA {
    /// Packs `A[i][p]` = the pair `pairs[p]` of row i of `src` (bf16 bit patterns, row i
    /// at `i·ld`): `src[i·ld + first]` in the low half and, for a pair, `src[i·ld + first + 1]`
    /// in the high half (zero for a single).
    ///
    /// # Panics
    /// If an element lies outside `src`.
    pub(super) fn pack(&mut self, src: &[u16], rows: usize, ld: usize, pairs: &[Pair]) {
        let depth = pairs
            .last()
            .map_or(0, |p| p.first + 1 + usize::from(p.paired));
        if rows > 0 && depth > 0 {
            assert!(
                depth <= ld && (rows - 1) * ld + depth <= src.len(),
                "A outside its slice"
            );
        }
        self.pack_with(rows, pairs.len(), |i, p| {
            let (row, pair) = (&src[i * ld..], pairs[p]);
            let hi = if pair.paired { row[pair.first + 1] } else { 0 };
            u32::from(row[pair.first]) | u32::from(hi) << 16
        });
    }

    /// Packs `A[i][p] = word(i, p)` for `rows x pairs` words, each two bf16 values (the
    /// pair's first in the low half).
    pub(super) fn pack_with(
        &mut self,
        rows: usize,
        pairs: usize,
        word: impl Fn(usize, usize) -> u32,
    ) {
        self.rows = rows;
        self.pairs = pairs;
        self.ld = pairs.div_ceil(STEP) * STEP;
        self.data.clear();
        self.data.resize(rows.div_ceil(BLOCK) * BLOCK * self.ld, 0);
        if pairs == 0 {
            return;
        }
        for (i, packed) in self.data.chunks_exact_mut(self.ld).take(rows).enumerate() {
            for (p, w) in packed[..pairs].iter_mut().enumerate() {
                *w = word(i, p);
            }
        }
    }
}

/// `C[o][r] = Σ_p A[o][p] · X[r][p]` (or `+=` when `accumulate`) for `o < a.rows` and
/// `r < x.rows.len()`, C's rows at stride `ldc`, on AMX tiles.
///
/// # Panics
/// If AMX is not enabled (`isa().amx`), the pairs do not match A, an offset lies outside
/// `x.src` or beyond `i32`, or C is too short.
pub(super) fn window_gemm_amx(
    x: &PairWindows,
    a: &PairRowsA,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(
        super::isa::isa().amx,
        "window_gemm_amx needs AMX (isa().amx)"
    );
    let (n, m) = (x.rows.len(), a.rows);
    assert_eq!(x.pairs.len(), a.pairs, "pairs do not match A's");
    if n == 0 || m == 0 {
        return;
    }
    assert!(n <= ldc && c.len() >= (m - 1) * ldc + n, "C too short");
    let farthest = x.pairs.iter().map(|p| p.offset).max();
    if let (Some(r), Some(s)) = (x.rows.iter().max(), farthest) {
        assert!(r + s < x.src.len(), "a window lies outside the images");
        assert!(i32::try_from(*r).is_ok(), "an offset beyond i32");
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX is enabled for this process (asserted), with AVX-512 (which `Isa::amx`
    // requires); the bounds the gathers rely on were asserted above, and each panel is
    // filled for its own columns.
    unsafe {
        amx::product(
            a,
            n,
            |r0, b| amx::gather_panel(x, r0, b),
            c,
            ldc,
            accumulate,
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AMX is x86-64 only: {accumulate}");
}

/// `C = A·B` (or `C += A·B` when `accumulate`) on AMX tiles, B packed as rows of pairs
/// ([`PairRows`]: the input gradient's output gradient, by pairs of output channels), C's
/// `a.rows` rows at stride `ldc`.
///
/// # Panics
/// If AMX is not enabled (`isa().amx`), A and B were packed with different depths, or C is
/// too short.
pub(super) fn gemm_amx(a: &PairRowsA, b: &PairRows, c: &mut [f32], ldc: usize, accumulate: bool) {
    assert!(super::isa::isa().amx, "gemm_amx needs AMX (isa().amx)");
    let (words, ld, pairs, n) = b.words();
    assert_eq!(a.pairs, pairs, "A and B have different depths");
    let m = a.rows;
    if n == 0 || m == 0 {
        return;
    }
    assert!(n <= ldc && c.len() >= (m - 1) * ldc + n, "C too short");
    // B's panel for columns r0..r0 + 32: its rows copied, zero past the last column.
    let copy = |r0: usize, panel: &mut [u32]| {
        let width = BLOCK.min(n - r0);
        for (p, dst) in panel.chunks_exact_mut(BLOCK).take(pairs).enumerate() {
            dst[..width].copy_from_slice(&words[p * ld + r0..][..width]);
            dst[width..].fill(0);
        }
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX is enabled for this process (asserted), with AVX-512.
    unsafe {
        amx::product(a, n, copy, c, ldc, accumulate)
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AMX is x86-64 only: {accumulate} {copy:?}");
}

#[cfg(target_arch = "x86_64")]
mod amx {
    use std::arch::asm;
    use std::arch::x86_64::*;

    use super::{PairRowsA, PairWindows, BLOCK, STEP};
    use crate::backend::cpu::engine::avx512::lanes;

    /// The tile configuration (palette 1): all eight tiles 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        bytes_per_row: [u16; 16],
        rows: [u8; 16],
        reserved_end: [u8; 16],
    }

    const CONFIG: TileConfig = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
        reserved_end: [0; 16],
    };

    /// Gathers the B panel for values `r0..r0 + 32` of r: `b[p·32 + j] = X[r0 + j][p]`
    /// (zero past the last r; a single's high half zero).
    ///
    /// # Safety
    /// AVX-512F; every `rows[r] + pairs[p].offset` inside `x.src` and below 2³¹; `b` at
    /// least `pairs·32` words.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gather_panel(x: &PairWindows, r0: usize, b: &mut [u32]) {
        assert!(b.len() >= x.pairs.len() * BLOCK);
        let n = x.rows.len();
        let mut index = [0i32; BLOCK];
        for (i, r) in index.iter_mut().zip(&x.rows[r0..n.min(r0 + BLOCK)]) {
            *i = *r as i32;
        }
        let (lo, hi) = (
            lanes((n - r0).min(16)),
            lanes((n - r0).saturating_sub(16).min(16)),
        );
        let idx = [
            _mm512_loadu_si512(index.as_ptr().cast()),
            _mm512_loadu_si512(index.as_ptr().add(16).cast()),
        ];
        let single = _mm512_set1_epi32(0xffff);
        let zero = _mm512_setzero_si512();
        let out = b.as_mut_ptr();
        for (p, pair) in x.pairs.iter().enumerate() {
            // SAFETY: a lane is read only where its mask keeps it (r < n), at
            // rows[r] + offset inside src (caller); b holds `steps·16` rows of 32 words.
            unsafe {
                let base = x.src.as_ptr().add(pair.offset).cast::<i32>();
                for (v, mask) in [lo, hi].into_iter().enumerate() {
                    let mut w = _mm512_mask_i32gather_epi32::<4>(zero, mask, idx[v], base);
                    if !pair.paired {
                        w = _mm512_and_si512(w, single);
                    }
                    _mm512_storeu_si512(out.add(p * BLOCK + v * 16).cast(), w);
                }
            }
        }
    }

    /// `C = A·B` (or `+=`) for C's `a.rows x n`, B's panel of columns `r0..r0 + 32` (32
    /// words per pair, zero past n) written by `fill(r0, panel)`.
    ///
    /// # Safety
    /// AVX-512F, AMX-TILE and AMX-BF16 enabled for this process; `fill` writes the panel's
    /// first `a.pairs` rows; C holds `a.rows` rows of `n` at stride `ldc`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(
        a: &PairRowsA,
        n: usize,
        mut fill: impl FnMut(usize, &mut [u32]),
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        let m = a.rows;
        let steps = a.ld / STEP;
        // The padding pairs (past a.pairs, up to a whole step) stay zero: they meet A's
        // zero words, and a NaN pattern there would make 0 · NaN.
        let mut b = vec![0u32; steps.max(1) * STEP * BLOCK];
        let mut sums = [[0.0f32; BLOCK]; BLOCK];
        let a_stride = a.ld * 4;
        let b_stride = BLOCK * 4;
        // SAFETY: the configuration is a valid palette-1 layout; the tiles are released
        // below before returning.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
        for r0 in (0..n).step_by(BLOCK) {
            fill(r0, &mut b[..a.pairs * BLOCK]);
            for o0 in (0..m).step_by(BLOCK) {
                // SAFETY: A holds whole 32-row panels of `ld` words and B `steps·16` rows of
                // 32 words, so every tile row read (16 rows of 64 bytes at these strides) is
                // inside them; `sums` holds 32 rows of 128 bytes for the four stores.
                unsafe {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nostack, nomem)
                    );
                    let a0 = a.data.as_ptr().add(o0 * a.ld);
                    let a1 = a0.add(STEP * a.ld);
                    for s in 0..steps {
                        let b0 = b.as_ptr().add(s * STEP * BLOCK);
                        asm!(
                            "tileloadd tmm4, [{a0} + {sa} * 1]",
                            "tileloadd tmm5, [{a1} + {sa} * 1]",
                            "tileloadd tmm6, [{b0} + {sb} * 1]",
                            "tileloadd tmm7, [{b1} + {sb} * 1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            a0 = in(reg) a0.add(s * STEP),
                            a1 = in(reg) a1.add(s * STEP),
                            b0 = in(reg) b0,
                            b1 = in(reg) b0.add(16),
                            sa = in(reg) a_stride,
                            sb = in(reg) b_stride,
                            options(nostack, readonly)
                        );
                    }
                    let out = sums.as_mut_ptr().cast::<f32>();
                    asm!(
                        "tilestored [{c00} + {st} * 1], tmm0",
                        "tilestored [{c01} + {st} * 1], tmm1",
                        "tilestored [{c10} + {st} * 1], tmm2",
                        "tilestored [{c11} + {st} * 1], tmm3",
                        c00 = in(reg) out,
                        c01 = in(reg) out.add(16),
                        c10 = in(reg) out.add(16 * BLOCK),
                        c11 = in(reg) out.add(16 * BLOCK + 16),
                        st = in(reg) b_stride,
                        options(nostack)
                    );
                }
                let width = BLOCK.min(n - r0);
                for (o, row) in sums.iter().enumerate().take(BLOCK.min(m - o0)) {
                    let dst = &mut c[(o0 + o) * ldc + r0..][..width];
                    if accumulate {
                        dst.iter_mut().zip(row).for_each(|(d, v)| *d += v);
                    } else {
                        dst.copy_from_slice(&row[..width]);
                    }
                }
            }
        }
        // SAFETY: releases this thread's tiles (configured above).
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use rand::Rng;

    use super::super::isa::isa;
    use super::super::product_check::{
        assert_product, check_pair_product, conv2_pixels, conv2_taps, poisoned, seeded,
    };
    use super::*;

    /// `gemm_amx` against a float64 product of the same bf16 values: conv2's input gradient
    /// (500 taps x 50 channels x 648 pixels) and ragged shapes (odd depths: the last pair a
    /// single; rows and columns off the 32 block; depth 1), overwrite and accumulate, C's
    /// padding poisoned.
    #[test]
    fn gemm_amx_matches_float64() {
        if !isa().amx {
            println!("this CPU (or OS) gives no AMX: the other bf16 paths serve it");
            return;
        }
        let mut rng = seeded(14);
        let bf = |v: f32| bf16::from_f32(v).to_bits();
        let value = |b: u16| f64::from(bf16::from_bits(b).to_f32());
        for &(m, depth, n) in &[
            (500, 50, 648),
            (1, 1, 1),
            (33, 17, 31),
            (67, 33, 97),
            (16, 32, 16),
        ] {
            let a: Vec<u16> = (0..m * depth)
                .map(|_| bf(rng.gen_range(-1.0..1.0)))
                .collect();
            let b: Vec<u16> = (0..depth * n)
                .map(|_| bf(rng.gen_range(-1.0..1.0)))
                .collect();
            let mut pa = PairRowsA::default();
            pa.pack_with(m, depth.div_ceil(2), |i, p| {
                let hi = if 2 * p + 1 < depth {
                    a[i * depth + 2 * p + 1]
                } else {
                    0
                };
                u32::from(a[i * depth + 2 * p]) | u32::from(hi) << 16
            });
            let mut pb = PairRows::default();
            pb.pack(depth, n, |k, j| b[k * n + j]);
            let ldc = n + 3;
            let c0: Vec<f32> = (0..m * ldc).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for accumulate in [false, true] {
                let mut c = poisoned(&c0, n, ldc);
                gemm_amx(&pa, &pb, &mut c, ldc, accumulate);
                let term =
                    |i: usize, j: usize, k: usize| value(a[i * depth + k]) * value(b[k * n + j]);
                let what = format!("{m} x {depth} x {n}");
                assert_product(&c, &c0, (m, n, ldc), depth, accumulate, term, &what);
            }
        }
    }

    /// Against a float64 product of the same bf16 values, for offsets shaped like conv2's
    /// forward (5-wide filter rows: pairs and singles) and filter gradient (9-pixel output
    /// rows), row counts 1, 16, 20, 33, 50, 64 and 67 (ragged panels), r not a multiple of a
    /// block, pair counts below, at and past a step of 16, overwrite and accumulate; C's
    /// padding poisoned; infinities placed right after every single's element must not leak
    /// in. Runs where the CPU has AMX; elsewhere it says it did not run.
    #[test]
    fn window_gemm_amx_matches_float64() {
        if !isa().amx {
            println!("this CPU (or OS) gives no AMX: the other bf16 paths serve it");
            return;
        }
        let (taps, pixels) = (conv2_taps(75), conv2_pixels(97));
        // Offsets that never follow each other.
        let sparse: Vec<usize> = (0..45).map(|i| 2 * i + i / 7).collect();
        let cases: Vec<(usize, &[usize], &[usize])> = vec![
            (50, &pixels, &taps),
            (20, &taps, &pixels),
            (20, &sparse, &taps[..20]),
            (1, &pixels[..7], &taps[..3]),
            (16, &taps[..1], &pixels),
            (64, &pixels[..33], &taps[..32]),
            (67, &pixels[..13], &taps[..9]),
            (33, &taps[..31], &pixels[..40]),
        ];
        check_pair_product(13, &cases, |windows, w, (rows, ld), c, ldc, accumulate| {
            let mut a = PairRowsA::default();
            a.pack(w, rows, ld, windows.pairs);
            window_gemm_amx(windows, &a, c, ldc, accumulate);
        });
    }
}
