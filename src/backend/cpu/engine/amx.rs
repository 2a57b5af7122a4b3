//! The AMX pair engine: AMX-BF16 tiles (`tdpbf16ps`), where the CPU has them (Sapphire
//! Rapids and later Xeons) and Linux granted them (`isa::Isa::amx`). The kernel for the
//! bf16 pair products of `pairs.rs`, the window product and the GEMM alike.
//!
//! One `tdpbf16ps` multiplies a tile of 16 rows x 16 pairs of A by 16 pairs x 16 columns of
//! B (32-bit words, a pair per word) into 16 x 16 f32 sums: 8,192 multiply-adds, 256 times a
//! `vdpbf16ps`'s. The kernel holds a 32 x 32 block of C in four tiles (tmm0-3), two tiles of A
//! (tmm4-5) and two of B (tmm6-7), so each step of 16 pairs loads four tiles for four
//! products. A is packed by the caller (`pairs::PairRowsA`: the filter once per call, dy once
//! per group of images) in 32-row panels, the pairs padded to a multiple of 16 with zero
//! words; B is gathered per block of 32 values of r (`vpgatherdd`, 16 at a time: the window
//! product) or copied from rows of pairs (the GEMM) into a panel of `pairs x 32` words,
//! which then serves every panel of A.
//!
//! Work: each of conv2's three products is 1.04 GFLOP per batch of 256 (50 x 500 x 81 per
//! image), 1.5x that with the padding (50 rows in 64, singles as half-empty pairs). About
//! twice the f32 tiles' speed (docs/cpu-backend.md has the figures); the tile loads wait on
//! the products before them (no spare tiles to alternate), far from AMX's nominal rate.
//!
//! A tile's lanes add their pairs in order, accumulating over all pairs (no blocks). The
//! tile registers are per thread: each call loads its configuration (`ldtilecfg`) and
//! releases the tiles (`tilerelease`) before it returns, so nothing else sees them.

use std::arch::asm;
use std::arch::x86_64::*;

use super::avx512::lanes;
use crate::backend::cpu::pairs::{PairRowsA, PairWindows, AMX_BLOCK as BLOCK, AMX_STEP as STEP};

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
pub(in crate::backend::cpu) unsafe fn gather_panel(x: &PairWindows, r0: usize, b: &mut [u32]) {
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
pub(in crate::backend::cpu) unsafe fn product(
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
