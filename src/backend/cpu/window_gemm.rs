//! The convolutions' forward and filter-gradient products read straight from the images,
//! with no im2col matrix: the portable path, for CPUs without AVX-512 (where AVX-512 runs,
//! [`image_lanes`](super::image_lanes) takes these products with 16 images in the lanes).
//!
//! Both products have the form `C[o][r] = Σ_k W[k][o] · x[rows[r] + steps[k]]`, where x
//! holds a group of images and `rows`/`steps` are offsets into it:
//! - forward: r runs over output pixels (each pixel's window offset), k over the filter's
//!   taps (each tap's offset in an image), W is the filter transposed, C the output;
//! - filter gradient: r runs over taps, k over output pixels, W is the output gradient
//!   transposed (pixel-major), C the filter gradient.
//!
//! The tile is R values of r by V vectors of 16 output channels (V = 4 and R = 6 for
//! LeNet's 50 channels, V = 2 and R = 12 for its 20), written as plain loops the compiler
//! vectorizes for the baseline instruction set: each step of k reads V·16 values of W and
//! R values straight from x, so the im2col matrix (25 copies of each conv2 input element,
//! 1.3 MB per group of eight images) is never written or read back. The sum over k runs in
//! blocks of [`Windows::block`] steps in order, so it is deterministic. The bf16 pair
//! products ([`window_gemm_bf16`](super::window_gemm_bf16)) share the tile's layout
//! ([`tile_bases`], [`store_tile`], [`avx512::add_into`]).

/// Output channels per chunk of W: four 16-lane vectors.
pub(super) const CHUNK: usize = 64;

/// W (`depth x cols`) packed as `[chunk of 64 columns][k][64]`, zero-padded past `cols`.
/// The buffer is kept between calls; [`PackedW::pack_transposed`] resizes it.
#[derive(Default)]
pub(super) struct PackedW {
    data: Vec<f32>,
    cols: usize,
    depth: usize,
}

impl PackedW {
    /// Packs `W[k][o] = src[o·ld + k]` for `o < cols`, `k < depth`: the transpose of a
    /// row-major `cols x depth` matrix (a filter, O x taps, or an output gradient, O x pixels).
    ///
    /// # Panics
    /// If an element lies outside `src`.
    pub(super) fn pack_transposed(&mut self, src: &[f32], cols: usize, depth: usize, ld: usize) {
        if cols > 0 && depth > 0 {
            assert!(
                depth <= ld && (cols - 1) * ld + depth <= src.len(),
                "W outside its slice"
            );
        }
        self.cols = cols;
        self.depth = depth;
        self.data.clear();
        self.data.resize(cols.div_ceil(CHUNK) * depth * CHUNK, 0.0);
        if depth == 0 {
            return;
        }
        // Blocks of 32 steps of k, so the rows written (32 x 256 bytes) stay in L1 while
        // every column fills them.
        for (chunk, packed) in self.data.chunks_exact_mut(depth * CHUNK).enumerate() {
            for k0 in (0..depth).step_by(32) {
                let k1 = depth.min(k0 + 32);
                for o in 0..CHUNK.min(cols - chunk * CHUNK) {
                    let row = &src[(chunk * CHUNK + o) * ld + k0..][..k1 - k0];
                    for (k, v) in (k0..k1).zip(row) {
                        packed[k * CHUNK + o] = *v;
                    }
                }
            }
        }
    }
}

/// The operand read from the images: `X[r][k] = src[rows[r] + steps[k]]`.
pub(super) struct Windows<'a> {
    /// The images.
    pub(super) src: &'a [f32],
    /// One offset per value of r (pixels' windows, or taps).
    pub(super) rows: &'a [usize],
    /// One offset per step of k (taps, or pixels' windows).
    pub(super) steps: &'a [usize],
    /// Steps of k summed in the registers from zero before they join the running total
    /// (blocked summation). A sum of K terms in one chain carries each rounding error
    /// through all later additions (error growing like K); in blocks, like block + K / block.
    /// Each block costs a pass over the R x 64 tile (load, add, store): on conv2's forward
    /// (500 taps) blocks of 128 take the error from 4.2e-7 to 2.2e-7 (PyTorch float32: 3.3e-7,
    /// tests/numerics.rs) for 2.5% of the product's time, blocks of 64 to 1.6e-7 for 4%.
    pub(super) block: usize,
}

/// `C[o][r] = Σ_k W[k][o] · X[r][k]` (or `+=` when `accumulate`) for `o < w.cols` and
/// `r < x.rows.len()`, C's rows at stride `ldc`.
///
/// # Panics
/// If `x.steps` is not W's depth long, an offset pair lies outside `x.src`, or C is too
/// short.
pub(super) fn window_gemm(x: &Windows, w: &PackedW, c: &mut [f32], ldc: usize, accumulate: bool) {
    let (n, cols) = (x.rows.len(), w.cols);
    assert_eq!(x.steps.len(), w.depth, "steps do not match W's depth");
    if n == 0 || cols == 0 {
        return;
    }
    assert!(n <= ldc && c.len() >= (cols - 1) * ldc + n, "C too short");
    if let (Some(r), Some(s)) = (x.rows.iter().max(), x.steps.iter().max()) {
        assert!(r + s < x.src.len(), "a window lies outside the images");
    }
    if w.depth == 0 {
        if !accumulate {
            c.chunks_mut(ldc)
                .take(cols)
                .for_each(|row| row[..n].fill(0.0));
        }
        return;
    }
    for (chunk, packed) in w.data.chunks_exact(w.depth * CHUNK).enumerate() {
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
    x: &Windows,
    packed: &[f32],
    width: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let mut out = [[0.0f32; CHUNK]; R];
    for r0 in (0..x.rows.len()).step_by(R) {
        let bases = tile_bases::<R>(x.rows, r0);
        // Blocked summation: each block of steps is summed in the registers from zero, then
        // added to the running total in `out`.
        let block = x.block.max(1);
        for (b, steps) in x.steps.chunks(block).enumerate() {
            let w = &packed[b * block * CHUNK..];
            tile::<V, R>(x.src, &bases, steps, w, &mut out, b > 0);
        }
        store_tile(&out, (r0, x.rows.len()), width, c, ldc, accumulate);
    }
}

/// The offsets of the R values of r from `r0` on; past the edge the last offset repeats
/// (always inside x), and [`store_tile`] drops those sums.
pub(super) fn tile_bases<const R: usize>(rows: &[usize], r0: usize) -> [usize; R] {
    std::array::from_fn(|i| rows[(r0 + i).min(rows.len() - 1)])
}

/// Writes (or with `accumulate` adds) a tile's sums `out[i][o]` into `C[o][r0 + i]` for the
/// `width` columns of the chunk and the values of r below `n`.
pub(super) fn store_tile<const R: usize>(
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

/// `out[i][o] = Σ_k w[k·64 + o] · src[bases[i] + steps[k]]` for o < 16·V, the sum taken
/// from zero and then added to `out` when `accumulate`.
fn tile<const V: usize, const R: usize>(
    src: &[f32],
    bases: &[usize; R],
    steps: &[usize],
    w: &[f32],
    out: &mut [[f32; CHUNK]; R],
    accumulate: bool,
) {
    let mut acc = [[0.0f32; CHUNK]; R];
    for (k, &s) in steps.iter().enumerate() {
        let wk = &w[k * CHUNK..k * CHUNK + 16 * V];
        for (acc, &b) in acc.iter_mut().zip(bases) {
            let xv = src[b + s];
            for (a, wv) in acc.iter_mut().zip(wk) {
                *a += xv * wv;
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(&acc) {
        for (o, a) in out.iter_mut().zip(acc).take(16 * V) {
            *o = if accumulate { *o + a } else { *a };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use std::arch::x86_64::*;

    use super::CHUNK;

    /// `out[i][16·v ..]` = `acc[i][v]`, or `+=` when `accumulate`: a tile's registers into
    /// its running total.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(in super::super) unsafe fn add_into<const V: usize, const R: usize>(
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
}

#[cfg(test)]
mod tests {
    use super::super::product_check::{
        assert_product, conv2_pixels, conv2_taps, poisoned, seeded, uniform,
    };
    use super::*;

    /// The product against float64, for offsets shaped like conv2's forward (runs
    /// of 9 pixels) and filter gradient (the lists swapped), channel counts 1, 16, 20, 50,
    /// 64, 67 and 130 (every tile shape, ragged chunks), R not a multiple of the tile, depth
    /// 0, overwrite and accumulate, blocks of 7 and 16 steps and one block; C's padding
    /// poisoned. x ends right after the last element read.
    #[test]
    fn window_gemm_matches_float64() {
        let mut rng = seeded(11);
        let (taps, pixels) = (conv2_taps(50), conv2_pixels(97));
        let cases: Vec<(usize, &[usize], &[usize])> = vec![
            (50, &pixels, &taps),
            (20, &taps, &pixels),
            (1, &pixels[..7], &taps[..3]),
            (16, &taps[..1], &pixels),
            (64, &pixels[..25], &taps),
            (67, &pixels[..13], &taps[..9]),
            (130, &taps[..31], &pixels[..40]),
            (5, &pixels[..4], &[]),
        ];
        for (cols, rows, steps) in cases {
            let (n, depth) = (rows.len(), steps.len());
            let len = rows.iter().max().unwrap() + steps.iter().max().unwrap_or(&0) + 1;
            let src = uniform(&mut rng, len);
            let ld = depth + 3;
            let wsrc = uniform(&mut rng, cols * ld);
            let mut w = PackedW::default();
            w.pack_transposed(&wsrc, cols, depth, ld);
            let ldc = n + 2;
            let c0 = uniform(&mut rng, cols * ldc);
            for (accumulate, block) in [(false, 7), (true, 16), (false, usize::MAX)] {
                let x = Windows {
                    src: &src,
                    rows,
                    steps,
                    block,
                };
                let mut c = poisoned(&c0, n, ldc);
                window_gemm(&x, &w, &mut c, ldc, accumulate);
                let term = |o: usize, r: usize, k: usize| {
                    wsrc[o * ld + k] as f64 * src[rows[r] + steps[k]] as f64
                };
                let what = format!("{cols} x {n} x {depth} block {block}");
                assert_product(&c, &c0, (cols, n, ldc), depth, accumulate, term, &what);
            }
        }
    }
}
