//! The convolutions' GEMM: A packed into panels, B and C used in place, and an AVX-512
//! register tile.
//!
//! `C (M x N) = A (M x K) · B (K x N)`, or `C += A·B`. A is packed once into panels of
//! [`MR`] = 10 rows, k-major (`[panel][k][row]`), zero-padded to whole panels. B's and C's
//! rows are read and written where they lie, at any stride, so the im2col buffers need no
//! second copy.
//!
//! The register tile is 10 rows x 32 columns, 20 zmm accumulators. Each step of k loads two
//! vectors of B and broadcasts ten values of A (from L1: a panel of 10 x 500 is 20 KB) into
//! 20 FMAs, so the two FMA pipes rather than the loads set the pace: 640 FLOPs per 12 loads.
//! The columns are walked in blocks of 32 with the panels inside, so each block of B is
//! fetched from memory once and reused by every panel from cache.
//!
//! Why 10 rows: it divides every output-channel count in LeNet (20, 50) and conv2's
//! input-gradient rows (500), so no FMA is spent on padding; a 16-row tile (as general
//! GEMM libraries use) computes 64 rows for conv2's 50. Ragged column edges are masked, and
//! a tile of at most 16 columns uses one vector per row.
//!
//! Without AVX-512 the same tile runs as portable Rust that the compiler vectorizes for the
//! baseline instruction set, with separate multiplies and adds instead of fused ones: the
//! two paths differ in the last bits, and each is deterministic (the sum over k always runs
//! in order).

/// Rows per packed panel of A (and per register tile).
pub(super) const MR: usize = 10;
/// Columns per register tile: two 16-lane vectors.
const NR: usize = 32;

/// A (M x K) packed into panels of [`MR`] rows, `[panel][k][row]`, the last panel padded
/// with zero rows. The buffer is kept between calls; [`PackedA::pack`] resizes it.
#[derive(Default)]
pub(super) struct PackedA {
    data: Vec<f32>,
    rows: usize,
    depth: usize,
}

impl PackedA {
    /// Packs the `rows x depth` matrix with `A[i][k] = src[i·rs + k·cs]`.
    ///
    /// # Panics
    /// If an element lies outside `src`.
    pub(super) fn pack(&mut self, src: &[f32], rows: usize, depth: usize, rs: usize, cs: usize) {
        if rows > 0 && depth > 0 {
            assert!(
                (rows - 1) * rs + (depth - 1) * cs < src.len(),
                "A outside its slice"
            );
        }
        let panels = rows.div_ceil(MR);
        self.data.clear();
        self.data.resize(panels * depth * MR, 0.0);
        self.rows = rows;
        self.depth = depth;
        if depth == 0 {
            return;
        }
        for (p, panel) in self.data.chunks_exact_mut(depth * MR).enumerate() {
            for i in 0..MR.min(rows - p * MR) {
                let row = (p * MR + i) * rs;
                if cs == 1 {
                    let src = &src[row..row + depth];
                    for (k, v) in src.iter().enumerate() {
                        panel[k * MR + i] = *v;
                    }
                } else {
                    for k in 0..depth {
                        panel[k * MR + i] = src[row + k * cs];
                    }
                }
            }
        }
    }
}

/// `C = A·B` (or `C += A·B` when `accumulate`) for C's first `cols` columns: B is K rows of
/// stride `ldb`, C is M rows of stride `ldc`.
///
/// # Panics
/// If B or C is too short for the shape.
pub(super) fn gemm(
    a: &PackedA,
    b: &[f32],
    ldb: usize,
    cols: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    gemm_on(has_avx512(), a, b, ldb, cols, c, ldc, accumulate);
}

/// [`gemm`] on the AVX-512 tile (when `avx512` and the CPU has it) or the portable one.
#[allow(clippy::too_many_arguments)]
fn gemm_on(
    avx512: bool,
    a: &PackedA,
    b: &[f32],
    ldb: usize,
    cols: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let (m, k) = (a.rows, a.depth);
    if m == 0 || cols == 0 {
        return;
    }
    assert!(
        cols <= ldc && c.len() >= (m - 1) * ldc + cols,
        "C too short"
    );
    if k == 0 {
        if !accumulate {
            c.chunks_mut(ldc).for_each(|row| row[..cols].fill(0.0));
        }
        return;
    }
    assert!(
        cols <= ldb && b.len() >= (k - 1) * ldb + cols,
        "B too short"
    );
    let avx512 = avx512 && has_avx512();
    for j0 in (0..cols).step_by(NR) {
        let width = NR.min(cols - j0);
        for (p, panel) in a.data.chunks_exact(k * MR).enumerate() {
            let rows = MR.min(m - p * MR);
            let tile = Tile {
                depth: k,
                a: panel,
                b: &b[j0..],
                ldb,
                c: &mut c[p * MR * ldc + j0..],
                ldc,
                rows,
                cols: width,
                accumulate,
            };
            run_tile(tile, avx512);
        }
    }
}

/// One register tile's operands: `rows x cols` of C (at most MR x NR) from `depth` steps.
struct Tile<'a> {
    depth: usize,
    /// The panel, `depth x MR`.
    a: &'a [f32],
    /// B from the tile's first column.
    b: &'a [f32],
    ldb: usize,
    /// C from the tile's first element.
    c: &'a mut [f32],
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
}

impl Tile<'_> {
    /// Whether every element the tile touches lies inside its slices.
    fn in_bounds(&self) -> bool {
        self.rows >= 1
            && self.rows <= MR
            && self.cols >= 1
            && self.cols <= NR
            && self.a.len() >= self.depth * MR
            && self.b.len() >= (self.depth - 1) * self.ldb + self.cols
            && self.c.len() >= (self.rows - 1) * self.ldc + self.cols
    }
}

/// Copies a short row (the convolutions copy many runs of 3 to 26 floats): with AVX-512, one
/// masked load and store per 16 elements instead of a call to `memcpy`.
#[inline]
pub(super) fn copy_row(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F was detected; the slices have equal lengths.
        return unsafe { avx512::copy(dst, src) };
    }
    dst.copy_from_slice(src);
}

fn run_tile(tile: Tile, avx512: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: the caller found AVX-512F on this CPU (`has_avx512`).
        return unsafe { avx512::tile(tile) };
    }
    let _ = avx512;
    portable_tile(tile);
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The tile in portable Rust: B's row copied into a fixed-size array so the inner loops have
/// constant bounds and vectorize.
fn portable_tile(t: Tile) {
    assert!(t.in_bounds());
    let mut acc = [[0.0f32; NR]; MR];
    let mut bv = [0.0f32; NR];
    for k in 0..t.depth {
        bv[..t.cols].copy_from_slice(&t.b[k * t.ldb..k * t.ldb + t.cols]);
        let ak = &t.a[k * MR..(k + 1) * MR];
        for (row, av) in acc.iter_mut().zip(ak) {
            for (r, b) in row.iter_mut().zip(&bv) {
                *r += av * b;
            }
        }
    }
    for (i, row) in acc.iter().enumerate().take(t.rows) {
        let c = &mut t.c[i * t.ldc..i * t.ldc + t.cols];
        if t.accumulate {
            c.iter_mut().zip(row).for_each(|(c, v)| *c += v);
        } else {
            c.copy_from_slice(&row[..t.cols]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Tile, MR};

    /// The lanes below `n` (n ≤ 16).
    fn lanes(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// `dst = src` (equal lengths) in masked 16-lane moves.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn copy(dst: &mut [f32], src: &[f32]) {
        let n = dst.len().min(src.len());
        for start in (0..n).step_by(16) {
            let mask = lanes((n - start).min(16));
            // SAFETY: the mask keeps every lane below n, inside both slices.
            unsafe {
                let v = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(start));
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(start), mask, v);
            }
        }
    }

    /// The AVX-512 tile: one or two vectors per row depending on the width.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile(t: Tile) {
        assert!(t.in_bounds());
        if t.cols <= 16 {
            // SAFETY: bounds asserted above; AVX-512F is enabled here.
            unsafe { tile_vectors::<1>(t) }
        } else {
            // SAFETY: as above.
            unsafe { tile_vectors::<2>(t) }
        }
    }

    /// `V` vectors of 16 columns per row; lanes at or past `t.cols` are masked off in every
    /// load and store (a masked-off lane is never accessed).
    ///
    /// # Safety
    /// `t.in_bounds()` and AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile_vectors<const V: usize>(t: Tile) {
        let mut mask = [0 as __mmask16; V];
        for (v, m) in mask.iter_mut().enumerate() {
            *m = lanes(t.cols.saturating_sub(v * 16).min(16));
        }
        let mut acc = [[_mm512_setzero_ps(); V]; MR];
        let (a, b) = (t.a.as_ptr(), t.b.as_ptr());
        for k in 0..t.depth {
            // SAFETY: row k of B holds t.cols elements from b + k·ldb (in_bounds); lanes past
            // them are masked; the panel holds depth x MR elements.
            unsafe {
                let bk = b.add(k * t.ldb);
                let mut bv = [_mm512_setzero_ps(); V];
                for v in 0..V {
                    bv[v] = _mm512_maskz_loadu_ps(mask[v], bk.wrapping_add(v * 16));
                }
                let ak = a.add(k * MR);
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ak.add(i));
                    for v in 0..V {
                        row[v] = _mm512_fmadd_ps(av, bv[v], row[v]);
                    }
                }
            }
        }
        let c = t.c.as_mut_ptr();
        for (i, row) in acc.iter().enumerate().take(t.rows) {
            for v in 0..V {
                // SAFETY: row i of C holds t.cols elements from c + i·ldc (in_bounds); the
                // mask keeps every access below them.
                unsafe {
                    let ci = c.add(i * t.ldc).wrapping_add(v * 16);
                    let mut r = row[v];
                    if t.accumulate {
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
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Both tile paths (the AVX-512 one where the CPU has it) against a float64 product, on
    /// sizes around the tile edges, A packed from row- and column-major storage, strided B
    /// and C, overwrite and accumulate, with C's padding columns poisoned to catch stray
    /// writes.
    #[test]
    fn gemm_matches_float64_on_ragged_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let paths: &[bool] = if has_avx512() {
            &[false, true]
        } else {
            &[false]
        };
        for &(m, k, n) in &[
            (1, 1, 1),
            (10, 13, 32),
            (11, 7, 33),
            (23, 0, 5),
            (50, 500, 17),
            (3, 64, 70),
            (20, 9, 16),
            (31, 2, 15),
        ] {
            let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
            let a: Vec<f32> = (0..m * lda).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..k * ldb).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|_| rng.gen_range(-1.0..1.0)).collect();
            // The same A stored column-major: at[k·m + i] = A[i][k].
            let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * lda + x / m]).collect();
            for &avx in paths {
                for accumulate in [false, true] {
                    for transposed in [false, true] {
                        let mut packed = PackedA::default();
                        if transposed {
                            packed.pack(&at, m, k, 1, m);
                        } else {
                            packed.pack(&a, m, k, lda, 1);
                        }
                        let mut c = c0.clone();
                        for row in c.chunks_mut(ldc) {
                            row[n..].fill(f32::NAN);
                        }
                        gemm_on(avx, &packed, &b, ldb, n, &mut c, ldc, accumulate);
                        for i in 0..m {
                            for j in 0..n {
                                let mut want = if accumulate {
                                    c0[i * ldc + j] as f64
                                } else {
                                    0.0
                                };
                                let mut mag = want.abs();
                                for kk in 0..k {
                                    let t = a[i * lda + kk] as f64 * b[kk * ldb + j] as f64;
                                    want += t;
                                    mag += t.abs();
                                }
                                let got = c[i * ldc + j] as f64;
                                assert!(
                                    (got - want).abs() <= 1e-6 + 2e-6 * mag,
                                    "{m}x{k}x{n} avx512 {avx} accumulate {accumulate} \
                                     at ({i}, {j}): {got} vs {want}"
                                );
                            }
                            let pad = &c[i * ldc + n..(i + 1) * ldc];
                            assert!(pad.iter().all(|v| v.is_nan()), "wrote past column {n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn copy_row_copies_every_length() {
        let src: Vec<f32> = (0..40).map(|i| i as f32).collect();
        for n in 0..40 {
            let mut dst = [f32::NAN; 41];
            copy_row(&mut dst[..n], &src[..n]);
            assert_eq!(&dst[..n], &src[..n]);
            assert!(
                dst[n..].iter().all(|v| v.is_nan()),
                "length {n}: wrote past the end"
            );
        }
    }
}
