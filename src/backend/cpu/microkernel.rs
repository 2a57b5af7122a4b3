//! The convolutions' GEMM: A packed into panels, B and C used in place, and a register tile
//! on the process's engine.
//!
//! `C (M x N) = A (M x K) · B (K x N)`, or `C += A·B`. A is packed once into panels of
//! [`MR`] = 10 rows, k-major (`[panel][k][row]`), zero-padded to whole panels. B's and C's
//! rows are read and written where they lie, at any stride, so the im2col buffers need no
//! second copy.
//!
//! The register tile ([`Engine::GEMM_ROWS`] rows x [`Engine::GEMM_VECTORS`] vectors) on
//! AVX-512 is 10 rows x 32 columns, 20 zmm accumulators: each step of k loads two vectors of
//! B and broadcasts ten values of A (from L1: a panel of 10 x 500 is 20 KB) into 20 FMAs, so
//! the two FMA pipes rather than the loads set the pace. AVX2's 16 registers take 5 rows x
//! 16 columns (half a panel at a time). The columns are walked in blocks of the tile's width
//! with the panels inside, so each block of B is fetched from memory once and reused by
//! every panel from cache.
//!
//! Why 10 rows: it divides every output-channel count in LeNet (20, 50) and conv2's
//! input-gradient rows (500), so no FMA is spent on padding; a 16-row tile (as general
//! GEMM libraries use) computes 64 rows for conv2's 50. A ragged last block of columns goes
//! through a zero-padded copy, so the tile loads and stores whole vectors.
//!
//! Each engine's tile sums over k in order from zero, with its multiply-add (fused except
//! on the portable engine), so each is deterministic; they differ in the last bits.

use super::engine::{store_tile, with_engine, Engine};

/// Rows per packed panel of A.
pub(super) const MR: usize = 10;

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
        (self.rows, self.depth) = (rows, depth);
        pack_panels(&mut self.data, (rows, depth), |i, k| src[i * rs + k * cs]);
    }
}

/// Packs the `rows x depth` matrix whose element (i, k) is `at(i, k)` into `data` as panels of
/// [`MR`] rows, `[panel][k][row]`, the last panel padded with zero rows.
pub(super) fn pack_panels<W: Copy + Default>(
    data: &mut Vec<W>,
    (rows, depth): (usize, usize),
    at: impl Fn(usize, usize) -> W,
) {
    data.clear();
    data.resize(rows.div_ceil(MR) * depth * MR, W::default());
    for (p, panel) in data.chunks_exact_mut((depth * MR).max(1)).enumerate() {
        for i in 0..MR.min(rows - p * MR) {
            for k in 0..depth {
                panel[k * MR + i] = at(p * MR + i, k);
            }
        }
    }
}

/// Asserts that C (`rows` rows of `cols` at stride `ldc`) fits in `c`, and returns whether
/// there is anything to compute.
pub(super) fn c_fits(c: &[f32], (rows, cols): (usize, usize), ldc: usize) -> bool {
    if rows == 0 || cols == 0 {
        return false;
    }
    assert!(
        cols <= ldc && c.len() >= (rows - 1) * ldc + cols,
        "C too short"
    );
    true
}

/// `C = 0` for a product over no steps (or nothing, when accumulating).
pub(super) fn clear(c: &mut [f32], (rows, cols): (usize, usize), ldc: usize, accumulate: bool) {
    if !accumulate {
        c.chunks_mut(ldc)
            .take(rows)
            .for_each(|row| row[..cols].fill(0.0));
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
    with_engine!(E => gemm_on::<E>(a, b, ldb, cols, c, ldc, accumulate));
}

/// [`gemm`] on engine E's tile.
///
/// # Panics
/// As [`gemm`], or if the CPU lacks the engine.
fn gemm_on<E: Engine>(
    a: &PackedA,
    b: &[f32],
    ldb: usize,
    cols: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let (m, k) = (a.rows, a.depth);
    if !c_fits(c, (m, cols), ldc) {
        return;
    }
    if k == 0 {
        return clear(c, (m, cols), ldc, accumulate);
    }
    assert!(
        cols <= ldb && b.len() >= (k - 1) * ldb + cols,
        "B too short"
    );
    assert!(E::available(), "{} is not available", E::KIND.name());
    let nr = E::GEMM_VECTORS * E::LANES;
    // A ragged last block: B's columns copied into whole vectors (zero past them), C's
    // through a scratch panel.
    let (mut padded_b, mut padded_c) = (Vec::new(), vec![0.0f32; MR * nr]);
    for j0 in (0..cols).step_by(nr) {
        let width = nr.min(cols - j0);
        if width < nr {
            padded_b.resize(k * nr, 0.0);
            for (dst, src) in padded_b.chunks_exact_mut(nr).zip(b[j0..].chunks(ldb)) {
                dst[..width].copy_from_slice(&src[..width]);
            }
        }
        for (p, panel) in a.data.chunks_exact(k * MR).enumerate() {
            let rows = MR.min(m - p * MR);
            let c = &mut c[p * MR * ldc + j0..];
            if width == nr {
                panel_tiles::<E>(panel, (&b[j0..], ldb), (c, ldc), rows, accumulate);
                continue;
            }
            if accumulate {
                for (dst, src) in padded_c.chunks_exact_mut(nr).zip(c.chunks(ldc)).take(rows) {
                    dst[..width].copy_from_slice(&src[..width]);
                }
            }
            panel_tiles::<E>(
                panel,
                (&padded_b, nr),
                (&mut padded_c, nr),
                rows,
                accumulate,
            );
            for (src, dst) in padded_c.chunks_exact(nr).zip(c.chunks_mut(ldc)).take(rows) {
                dst[..width].copy_from_slice(&src[..width]);
            }
        }
    }
}

/// One panel of A (`k x MR`, [`PackedA`]'s layout) times a block of B (k rows of whole
/// vectors) into its `rows` rows of C, `E::GEMM_ROWS` rows at a time.
///
/// # Panics
/// If B or C is too short for the block, or the CPU lacks the engine.
fn panel_tiles<E: Engine>(
    panel: &[f32],
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    rows: usize,
    accumulate: bool,
) {
    let (k, nr) = (panel.len() / MR, E::GEMM_VECTORS * E::LANES);
    assert!(E::available(), "{} is not available", E::KIND.name());
    assert!((1..=MR).contains(&rows) && k >= 1);
    assert!(b.len() >= (k - 1) * ldb + nr && c.len() >= (rows - 1) * ldc + nr);
    let (a, b, c) = (panel.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    // SAFETY: the engine is available (asserted); each tile reads rows row0.. of the panel
    // (k x MR), B's k rows of nr columns and C's rows below `rows` (asserted), nr columns.
    unsafe {
        E::run(|| {
            for row0 in (0..rows).step_by(E::GEMM_ROWS) {
                let (a, c) = (a.add(row0), c.add(row0 * ldc));
                let at = (a, (b, ldb), k, (c, ldc), rows - row0, accumulate);
                match (E::GEMM_ROWS, E::GEMM_VECTORS) {
                    (10, 2) => tile::<E, 10, 2>(at),
                    (5, 2) => tile::<E, 5, 2>(at),
                    (r, v) => unreachable!("no {r} x {v} GEMM tile"),
                }
            }
        })
    }
}

/// A tile's operands: A from its first row (k-major, rows MR apart), B (k rows and their
/// stride), the steps of k, C from its first row (and its stride), the rows of C to write,
/// and whether to add to C.
type TileAt = (
    *const f32,
    (*const f32, usize),
    usize,
    (*mut f32, usize),
    usize,
    bool,
);

/// One register tile: `ROWS` rows by `NV` vectors of columns, summed over k in order from
/// zero, then stored into C's first `rows` rows (or added to them).
///
/// # Safety
/// Inside `E::run`; the bounds [`panel_tiles`] asserts.
#[inline(always)]
unsafe fn tile<E: Engine, const ROWS: usize, const NV: usize>(
    (a, (b, ldb), depth, (c, ldc), rows, accumulate): TileAt,
) {
    // SAFETY: the caller's bounds: the panel holds depth rows of MR values from a's panel,
    // B's rows NV·LANES values, C's first `rows` rows NV·LANES values.
    unsafe {
        let mut acc = [[E::splat(0.0); NV]; ROWS];
        for k in 0..depth {
            let bk = b.add(k * ldb);
            let mut bv = [E::splat(0.0); NV];
            for (v, bv) in bv.iter_mut().enumerate() {
                *bv = E::load(bk.add(v * E::LANES));
            }
            let ak = a.add(k * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = E::splat(*ak.add(i));
                for (r, bv) in row.iter_mut().zip(bv) {
                    *r = E::fmadd(av, bv, *r);
                }
            }
        }
        store_tile::<E, NV>(&acc[..rows.min(ROWS)], accumulate, |i, v| {
            c.add(i * ldc + v * E::LANES)
        });
    }
}

/// `C = A·Bᵀ` (or `C += A·Bᵀ`) where A is M rows and B is N rows, both of K contiguous
/// elements (each given as (rows, stride, count); C as (rows, stride)): the filter
/// gradient's product, whose reduction runs along the pixels that both operands store
/// contiguously, so neither needs transposing. The tile is [`Engine::DOT_ROWS`] rows of A x
/// [`Engine::DOT_COLS`] rows of B, one vector of partial sums each (element i of a product
/// joins lane i % LANES): on AVX-512 4 x 5, 20 zmm accumulators, per 16 steps of k 9 loads
/// feeding 20 FMAs; each accumulator is folded to its element of C at the end
/// ([`Engine::sum`]). Loop order keeps the tile's rows of B in L1 while A streams from L2.
///
/// # Panics
/// If A, B or C is too short for the shape.
pub(super) fn gemm_nt(
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
    k: usize,
    c: (&mut [f32], usize),
    accumulate: bool,
) {
    with_engine!(E => gemm_nt_on::<E>(a, b, k, c, accumulate));
}

/// [`gemm_nt`] on engine E's tile.
fn gemm_nt_on<E: Engine>(
    (a, lda, m): (&[f32], usize, usize),
    (b, ldb, n): (&[f32], usize, usize),
    k: usize,
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(n <= ldc && c.len() >= (m - 1) * ldc + n, "C too short");
    if k > 0 {
        assert!(k <= lda && a.len() >= (m - 1) * lda + k, "A too short");
        assert!(k <= ldb && b.len() >= (n - 1) * ldb + k, "B too short");
    }
    assert!(E::available(), "{} is not available", E::KIND.name());
    let (a, b, c) = ((a, lda, m), (b, ldb, n), (c, ldc));
    // SAFETY: the engine is available (asserted); the bounds are asserted above.
    unsafe {
        E::run(|| match (E::DOT_ROWS, E::DOT_COLS) {
            (4, 5) => nt_tiles::<E, 4, 5>(a, b, k, c, accumulate),
            (2, 5) => nt_tiles::<E, 2, 5>(a, b, k, c, accumulate),
            (r, s) => unreachable!("no {r} x {s} dot tile"),
        })
    }
}

/// [`gemm_nt_on`]'s loops with `R x S` tiles.
///
/// # Safety
/// Inside `E::run`; A, B and C hold the rows [`gemm_nt_on`] asserts.
#[inline(always)]
unsafe fn nt_tiles<E: Engine, const R: usize, const S: usize>(
    (a, lda, m): (&[f32], usize, usize),
    (b, ldb, n): (&[f32], usize, usize),
    k: usize,
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    // Two tiles of B rows per pass over A: the rows of A each tile pair loads from L2 serve
    // both tiles from L1.
    for jb in (0..n).step_by(2 * S) {
        for i0 in (0..m).step_by(R) {
            for j0 in (jb..n.min(jb + 2 * S)).step_by(S) {
                // Rows past the edge repeat the last row; their sums are dropped.
                let mut a_rows = [a.as_ptr(); R];
                for (r, p) in a_rows.iter_mut().enumerate() {
                    *p = a[(i0 + r).min(m - 1) * lda..][..k].as_ptr();
                }
                let mut b_rows = [b.as_ptr(); S];
                for (s, p) in b_rows.iter_mut().enumerate() {
                    *p = b[(j0 + s).min(n - 1) * ldb..][..k].as_ptr();
                }
                // SAFETY: every row pointer starts k elements inside its slice.
                let sums = unsafe { dot_tile::<E, R, S>(a_rows, b_rows, k) };
                for (r, row) in sums.iter().enumerate().take(m - i0) {
                    let c_row = &mut c[(i0 + r) * ldc + j0..];
                    for (s, v) in row.iter().enumerate().take(n - j0) {
                        c_row[s] = if accumulate { c_row[s] + v } else { *v };
                    }
                }
            }
        }
    }
}

/// The `R x S` dot products of k elements of `gemm_nt`'s tile: each product's partial sums
/// in one vector (element i in lane i % LANES, multiply-added in order), the ragged tail
/// through zero-padded copies, then each vector folded by [`Engine::sum`].
///
/// # Safety
/// Inside `E::run`; every pointer is valid for k elements.
#[inline(always)]
unsafe fn dot_tile<E: Engine, const R: usize, const S: usize>(
    a: [*const f32; R],
    b: [*const f32; S],
    k: usize,
) -> [[f32; S]; R] {
    let whole = k / E::LANES * E::LANES;
    let mut acc = [[E::splat(0.0); S]; R];
    // SAFETY: the caller's: every row holds k ≥ whole elements; the tail's copies hold a
    // whole vector each.
    unsafe {
        for start in (0..whole).step_by(E::LANES) {
            dot_step::<E, R, S>(&mut acc, a.map(|p| p.add(start)), b.map(|p| p.add(start)));
        }
        if whole < k {
            let (mut ta, mut tb) = ([[0.0f32; 16]; R], [[0.0f32; 16]; S]);
            for (t, p) in ta.iter_mut().zip(a) {
                std::ptr::copy_nonoverlapping(p.add(whole), t.as_mut_ptr(), k - whole);
            }
            for (t, p) in tb.iter_mut().zip(b) {
                std::ptr::copy_nonoverlapping(p.add(whole), t.as_mut_ptr(), k - whole);
            }
            dot_step::<E, R, S>(
                &mut acc,
                ta.each_ref().map(|t| t.as_ptr()),
                tb.each_ref().map(|t| t.as_ptr()),
            );
        }
    }
    let mut sums = [[0.0f32; S]; R];
    for (sums, acc) in sums.iter_mut().zip(&acc) {
        for (sum, acc) in sums.iter_mut().zip(acc) {
            // SAFETY: inside `E::run`.
            *sum = unsafe { E::sum(*acc) };
        }
    }
    sums
}

/// One step of [`dot_tile`]: a vector from each row, every product multiply-added.
///
/// # Safety
/// Inside `E::run`; every pointer is valid for a vector.
#[inline(always)]
unsafe fn dot_step<E: Engine, const R: usize, const S: usize>(
    acc: &mut [[E::Vector; S]; R],
    a: [*const f32; R],
    b: [*const f32; S],
) {
    // SAFETY: the caller's.
    unsafe {
        let mut av = [E::splat(0.0); R];
        for (v, p) in av.iter_mut().zip(a) {
            *v = E::load(p);
        }
        for (s, p) in b.iter().enumerate() {
            let bv = E::load(*p);
            for (row, av) in acc.iter_mut().zip(av) {
                row[s] = E::fmadd(av, bv, row[s]);
            }
        }
    }
}

/// col2im's inner step, one input channel: `plane[(p·stride + i)·in_w + q·stride + j] +=
/// src[(i·k_w + j)·ld + p·q_n + q]` for every kernel tap (i, j) < (k_h, k_w) and output
/// pixel (p, q) < (p_n, q_n), each element's taps added in the order kernel rows i, then
/// columns j (plain loops compiled for the process's engine; at stride 1 each tap row is one
/// vector add).
///
/// With `overwrite`, the rows `0..(p_n - 1)·stride + k_h` start from zero instead of the
/// plane's values: col2im then writes a whole plane without clearing it first (a pass over
/// memory that is not in cache yet).
///
/// # Panics
/// If `stride` is 0, the taps do not fit the image row, or a row lies outside its slice.
pub(super) fn add_windows(
    plane: &mut [f32],
    in_w: usize,
    src: &[f32],
    ld: usize,
    ((k_h, k_w), (p_n, q_n), stride): ((usize, usize), (usize, usize), usize),
    overwrite: bool,
) {
    if k_h == 0 || k_w == 0 || q_n == 0 || p_n == 0 {
        return;
    }
    assert!(stride > 0, "stride 0");
    assert!(
        in_w > (q_n - 1) * stride + k_w - 1,
        "the taps do not fit the image row"
    );
    let rows = (p_n - 1) * stride + k_h;
    assert!(plane.len() >= rows * in_w, "rows outside the plane");
    assert!(
        src.len() >= (k_h * k_w - 1) * ld + p_n * q_n,
        "taps outside src"
    );
    let shape = [k_h, k_w, p_n, q_n, stride];
    add_windows_loops(plane, in_w, src, ld, shape, overwrite);
}

super::engine::multiversion!(
    /// [`add_windows`]'s loops, vectorized for the process's engine.
    fn add_windows_loops(
        plane: &mut [f32],
        in_w: usize,
        src: &[f32],
        ld: usize,
        shape: [usize; 5],
        overwrite: bool,
    ) = add_windows_body
);

/// [`add_windows`]'s loops (its bounds asserted).
#[inline(always)]
fn add_windows_body(
    plane: &mut [f32],
    in_w: usize,
    src: &[f32],
    ld: usize,
    [k_h, k_w, p_n, q_n, stride]: [usize; 5],
    overwrite: bool,
) {
    if overwrite {
        plane[..((p_n - 1) * stride + k_h) * in_w].fill(0.0);
    }
    for i in 0..k_h {
        for p in 0..p_n {
            let row = &mut plane[(p * stride + i) * in_w..(p * stride + i + 1) * in_w];
            for j in 0..k_w {
                let taps = &src[(i * k_w + j) * ld + p * q_n..][..q_n];
                if stride == 1 {
                    let dst = &mut row[j..j + q_n];
                    dst.iter_mut().zip(taps).for_each(|(d, v)| *d += v);
                } else {
                    let dst = row[j..].iter_mut().step_by(stride);
                    dst.zip(taps).for_each(|(d, v)| *d += v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::on_each_engine;
    use super::super::product_check::{check_product, seeded, uniform};
    use super::*;

    /// Every engine's tile against a float64 product, on sizes around the tile edges, A
    /// packed from row- and column-major storage, strided B and C, overwrite and accumulate,
    /// with C's padding columns poisoned to catch stray writes.
    #[test]
    fn gemm_matches_float64_on_ragged_shapes() {
        on_each_engine!(gemm_matches_float64_on);
    }

    fn gemm_matches_float64_on<E: Engine>() {
        let mut rng = seeded(7);
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
            let a = uniform(&mut rng, m * lda);
            let b = uniform(&mut rng, k * ldb);
            let c0 = uniform(&mut rng, m * ldc);
            // The same A stored column-major: at[k·m + i] = A[i][k].
            let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * lda + x / m]).collect();
            let term =
                |i: usize, j: usize, kk: usize| a[i * lda + kk] as f64 * b[kk * ldb + j] as f64;
            for transposed in [false, true] {
                let mut packed = PackedA::default();
                if transposed {
                    packed.pack(&at, m, k, 1, m);
                } else {
                    packed.pack(&a, m, k, lda, 1);
                }
                let what = format!("{} {m}x{k}x{n} A transposed {transposed}", E::KIND.name());
                check_product(&c0, (m, n, ldc), k, &term, &what, |c, accumulate| {
                    gemm_on::<E>(&packed, &b, ldb, n, c, ldc, accumulate)
                });
            }
        }
    }

    /// `add_windows` (compiled for the process's engine) against plain loops in the
    /// same order (bit for bit), for LeNet's col2im (13 columns: one vector) and odd shapes
    /// (28 columns: two vectors, one kernel row, one output row), at strides 1, 2 and 3
    /// (taps that skip and taps that overlap).
    #[test]
    fn add_windows_matches_plain_loops() {
        for &(k_h, k_w, q_n, p_n, stride) in &[
            (5, 5, 9, 9, 1),
            (3, 3, 26, 26, 1),
            (1, 1, 1, 1, 1),
            (2, 4, 14, 3, 1),
            (1, 7, 17, 2, 1),
            (3, 2, 15, 4, 2),
            (4, 3, 5, 1, 1),
            (3, 3, 6, 5, 2),
            (1, 2, 4, 3, 3),
        ] {
            let in_w = (q_n - 1) * stride + k_w + 1;
            let ld = p_n * q_n + 3;
            let src: Vec<f32> = (0..k_h * k_w * ld)
                .map(|i| (i % 97) as f32 * 0.37)
                .collect();
            let rows = (p_n - 1) * stride + k_h;
            let start: Vec<f32> = (0..rows * in_w + 5).map(|i| (i % 13) as f32).collect();
            // The plain loops, adding onto `plane`.
            let add = |mut plane: Vec<f32>| {
                for i in 0..k_h {
                    for p in 0..p_n {
                        for j in 0..k_w {
                            for q in 0..q_n {
                                plane[(p * stride + i) * in_w + q * stride + j] +=
                                    src[(i * k_w + j) * ld + p * q_n + q];
                            }
                        }
                    }
                }
                plane
            };
            let shape = ((k_h, k_w), (p_n, q_n), stride);
            let what = format!("{k_h}x{k_w} taps, {p_n}x{q_n} pixels, stride {stride}");
            let want = add(start.clone());
            let mut got = start.clone();
            add_windows(&mut got, in_w, &src, ld, shape, false);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{what}");
            // Overwriting: the same sums from zero on the rows the windows cover (whatever
            // they held: NaN here), the elements past them untouched.
            let mut cleared = start.clone();
            cleared[..rows * in_w].fill(0.0);
            let want = add(cleared);
            let mut got = start.clone();
            got[..rows * in_w].fill(f32::NAN);
            add_windows(&mut got, in_w, &src, ld, shape, true);
            assert_eq!(bits(&got), bits(&want), "{what}, overwriting");
        }
    }

    /// `gemm_nt` on both paths against float64, with edge tiles in both directions, k
    /// below, at and past a vector, overwrite and accumulate, padding poisoned.
    #[test]
    fn gemm_nt_matches_float64_on_ragged_shapes() {
        on_each_engine!(gemm_nt_matches_float64_on);
    }

    fn gemm_nt_matches_float64_on<E: Engine>() {
        let mut rng = seeded(8);
        for &(m, n, k) in &[
            (1, 1, 1),
            (4, 5, 16),
            (50, 500, 81),
            (20, 9, 676),
            (7, 11, 17),
            (3, 2, 0),
            (5, 6, 33),
        ] {
            let (lda, ldb, ldc) = (k + 2, k + 7, n + 1);
            let a = uniform(&mut rng, m * lda);
            let b = uniform(&mut rng, n * ldb);
            let c0 = uniform(&mut rng, m * ldc);
            let term =
                |i: usize, j: usize, kk: usize| a[i * lda + kk] as f64 * b[j * ldb + kk] as f64;
            let what = format!("{} {m}x{n}x{k}", E::KIND.name());
            check_product(&c0, (m, n, ldc), k, &term, &what, |c, accumulate| {
                gemm_nt_on::<E>((&a, lda, m), (&b, ldb, n), k, (c, ldc), accumulate)
            });
        }
    }
}
