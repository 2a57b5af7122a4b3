//! Convolution products with 16 images in the 16 lanes of an AVX-512 register.
//!
//! The AVX-512 tile these products ran on before put output channels in the lanes: conv2's
//! 50 channels filled 50 of 64 lanes (78%), and the sums left the registers transposed (the
//! portable [`window_gemm`](super::window_gemm) keeps that layout). Here a
//! group of 16 images is first laid out image-innermost (`[C][H][W][16]`, [`LaneImages`]),
//! so one vector load brings one input element of all 16 images, every lane does useful
//! work for any channel count, and a register holds one output element of 16 images.
//!
//! - **Forward** ([`lane_product`]): the register tile is [`R`] output channels by V ≤ 5
//!   output pixels (25 accumulators); per tap, V vector loads of the images and R
//!   broadcasts of the filter for R·V FMAs. The taps are summed in blocks as the old tile
//!   summed them (each block fused-added from zero in the registers, then added to the
//!   running total, taps in the filter's order), so training gave the same bits; a test
//!   holds it to that order bit for bit. conv2, batch 256: 4.4 → 3.7 ms.
//! - **Input gradient** ([`lane_input_grad`]): R taps by V output pixels, summed over the
//!   output channels in the registers and added straight into dx's lanes, so neither the
//!   `wᵀ · dy` matrix nor col2im exists. conv2, batch 256: 5.3 → 4.1 ms.
//!
//! - **Filter gradient** ([`lane_filter_product`]): R output channels by V taps, each
//!   lane summing its own image's pixels; the sets of 16 images add up in memory and the
//!   16 lanes are added at the end as a fixed tree ([`fold_lanes`]). It reads the same dy
//!   lanes as the input gradient. conv2's backward, fused, in training: about 5% more
//!   images/s.
//!
//! The layouts cost one gather per element going in and one per element coming out
//! ([`LaneImages::build`], [`into_lanes`], [`lane_plane`]).
//!
//! AVX-512 only: without it the window and GEMM tiles run.

use crate::backend::shapes::Conv2dShape;

/// Images per group: the lanes of an f32 AVX-512 register.
pub(super) const LANES: usize = 16;

/// Output channels per register tile.
pub(super) const R: usize = 5;

/// Output pixels per register tile, at most.
const V_MAX: usize = 5;

/// A group of up to [`LANES`] images laid out `[C][H + 2·pad][W + 2·pad][16]`: element
/// (c, h, w) of image m at `((c·Hp + h)·Wp + w)·16 + m`, zero in the padding and in the
/// lanes of missing images. The buffer is kept between groups.
#[derive(Default)]
pub(super) struct LaneImages {
    data: Vec<f32>,
}

impl LaneImages {
    /// Lays out `imgs` ≤ 16 images of `x` (`imgs` x C x H x W, f32, contiguous).
    ///
    /// # Panics
    /// If `imgs` is 0 or over 16, `x` is not `imgs` images long, or the CPU lacks AVX-512.
    pub(super) fn build(&mut self, s: &Conv2dShape, x: &[f32], imgs: usize) -> &[f32] {
        let image = s.in_c * s.in_h * s.in_w;
        assert!((1..=LANES).contains(&imgs) && x.len() == imgs * image);
        assert!(super::isa::isa().avx512, "image lanes need AVX-512");
        let (hp, wp) = (s.in_h + 2 * s.pad, s.in_w + 2 * s.pad);
        let len = s.in_c * hp * wp * LANES;
        self.data.resize(len, 0.0);
        if s.pad > 0 || imgs < LANES {
            self.data.fill(0.0);
        }
        // SAFETY: AVX-512F (asserted); gather_rows reads image m's element e at
        // x[m·image + e] for m < imgs and e < image (inside x, asserted above) and writes
        // whole vectors at (c·Hp + h)·Wp + w < C·Hp·Wp, inside data.
        unsafe { avx512::gather_in(s, x, imgs, &mut self.data) };
        &self.data
    }
}

/// The filter as the tile reads it: `[tap][O rounded up to R]`, zero past O.
#[derive(Default)]
pub(super) struct LaneFilter {
    data: Vec<f32>,
    cols: usize,
    depth: usize,
}

impl LaneFilter {
    /// Packs `w` (O x K, row-major, f32).
    pub(super) fn pack(&mut self, w: &[f32], cols: usize, depth: usize) {
        assert_eq!(w.len(), cols * depth, "filter is not O x K");
        let ld = cols.div_ceil(R) * R;
        self.cols = cols;
        self.depth = depth;
        self.data.clear();
        self.data.resize(ld * depth, 0.0);
        for (o, row) in w.chunks_exact(depth.max(1)).enumerate().take(cols) {
            for (k, v) in row.iter().enumerate() {
                self.data[k * ld + o] = *v;
            }
        }
    }

    /// Output channels rounded up to [`R`]: the packed rows' length.
    fn ld(&self) -> usize {
        self.cols.div_ceil(R) * R
    }
}

/// Offsets into a [`LaneImages`] layout (already times 16), as the window tile's offsets
/// into an image: one per output pixel (its window's corner) and one per tap.
pub(super) struct LaneWindows<'a> {
    /// The images, [`LaneImages::build`]'s layout.
    pub(super) src: &'a [f32],
    /// One offset per output pixel of an image.
    pub(super) pixels: &'a [usize],
    /// One offset per tap, in the filter's order.
    pub(super) taps: &'a [usize],
    /// Taps summed in the registers from zero before they join the running total (the
    /// window tile's `block`).
    pub(super) block: usize,
}

/// `out[o][p][m] = Σ_k w[o][k] · x_m[pixels[p] + taps[k]]` for o < O rounded up to [`R`] (the
/// padding channels are zero) and every pixel p, all 16 lanes: `out` holds
/// `ld · pixels · 16` floats.
///
/// # Panics
/// If the taps do not match the filter's depth, a window lies outside the images, `out` is
/// too short, or the CPU lacks AVX-512.
pub(super) fn lane_product(x: &LaneWindows, w: &LaneFilter, out: &mut [f32]) {
    assert!(super::isa::isa().avx512, "image lanes need AVX-512");
    assert_eq!(x.taps.len(), w.depth, "taps do not match the filter");
    let (n, ld) = (x.pixels.len(), w.ld());
    assert!(out.len() >= ld * n * LANES, "out too short");
    if let (Some(p), Some(t)) = (x.pixels.iter().max(), x.taps.iter().max()) {
        assert!(
            p + t + LANES <= x.src.len(),
            "a window lies outside the images"
        );
    }
    if n == 0 || ld == 0 {
        return;
    }
    // Tap blocks outermost, then pixels, then channels: a pixel tile's windows over a block
    // (about 9 KiB for conv2) stay in L1 across the channel tiles, the block's filter rows
    // (13 KiB) across the pixel tiles; the running totals wait in `out`. (With the taps
    // innermost, each tile streamed the group's 216 KiB of images from L2: 4.4 ms for
    // conv2's forward instead of 3.7.)
    let block = x.block.max(1);
    for (b, taps) in x.taps.chunks(block).enumerate() {
        for p0 in (0..n).step_by(V_MAX) {
            for o0 in (0..ld).step_by(R) {
                let at = (b * block, o0, p0);
                // SAFETY: AVX-512F (asserted); every pixels[p] + taps[k] + 16 ≤ src.len()
                // (asserted), W rows of ld with o0 + R ≤ ld, out holds ld·n·16 (asserted).
                unsafe {
                    match (n - p0).min(V_MAX) {
                        1 => avx512::tile::<1>(x, taps, w, at, out),
                        2 => avx512::tile::<2>(x, taps, w, at, out),
                        3 => avx512::tile::<3>(x, taps, w, at, out),
                        4 => avx512::tile::<4>(x, taps, w, at, out),
                        _ => avx512::tile::<5>(x, taps, w, at, out),
                    }
                }
            }
        }
    }
}

/// Image m's plane of channel o from `out` (`lane_product`'s layout, `pixels` per channel)
/// into `plane` (`pixels` long).
pub(super) fn lane_plane(out: &[f32], pixels: usize, o: usize, m: usize, plane: &mut [f32]) {
    assert!(m < LANES && plane.len() == pixels && out.len() >= (o + 1) * pixels * LANES);
    assert!(super::isa::isa().avx512, "image lanes need AVX-512");
    // SAFETY: AVX-512F (asserted); reads out[(o·pixels + p)·16 + m] for p < pixels (inside
    // out, asserted) and writes plane[..pixels].
    unsafe { avx512::gather_plane(&out[o * pixels * LANES..], m, plane) }
}

/// The input gradient with 16 images in the lanes, col2im fused: for every tap k and output
/// pixel p, `dx[taps[k] + pixels[p]] += Σ_o w[o][k] · dy[o][p]` per lane, the sum over the
/// O output channels taken in order in the registers and added to dx in a fixed order (tap
/// tiles within pixel tiles). `dy` is `[O][pixels][16]`, `w` the filter (O x K, row-major,
/// K a multiple of [`R`]: pad with zero taps), `dx` the images' layout of [`LaneImages`]
/// (added to, not cleared).
///
/// # Panics
/// If a slice is too short, K is not a multiple of R, an offset lies outside dx, or the CPU
/// lacks AVX-512.
pub(super) fn lane_input_grad(
    dy: &[f32],
    w: &[f32],
    (taps, pixels): (&[usize], &[usize]),
    dx: &mut [f32],
) {
    assert!(super::isa::isa().avx512, "image lanes need AVX-512");
    let (k, n) = (taps.len(), pixels.len());
    assert!(k % R == 0, "taps not a multiple of R");
    let o_n = w.len().checked_div(k).unwrap_or(0);
    assert!(
        w.len() == o_n * k && dy.len() >= o_n * n * LANES,
        "w or dy too short"
    );
    if let (Some(p), Some(t)) = (pixels.iter().max(), taps.iter().max()) {
        assert!(p + t + LANES <= dx.len(), "a window lies outside dx");
    }
    // Pixels outermost: a pixel tile's dy (5 pixels x O, 16 KiB for conv2) stays in L1
    // across the taps; the filter (100 KiB) streams from L2 once per pixel tile.
    for p0 in (0..n).step_by(V_MAX) {
        for t0 in (0..k).step_by(R) {
            let at = (t0, p0);
            // SAFETY: AVX-512F (asserted); dy holds O·n vectors, w O rows of k, every
            // taps[t] + pixels[p] + 16 ≤ dx.len() (asserted).
            unsafe {
                match (n - p0).min(V_MAX) {
                    1 => avx512::input_tile::<1>(dy, w, (taps, pixels), at, dx),
                    2 => avx512::input_tile::<2>(dy, w, (taps, pixels), at, dx),
                    3 => avx512::input_tile::<3>(dy, w, (taps, pixels), at, dx),
                    4 => avx512::input_tile::<4>(dy, w, (taps, pixels), at, dx),
                    _ => avx512::input_tile::<5>(dy, w, (taps, pixels), at, dx),
                }
            }
        }
    }
}

/// Puts `count` images' planes into lanes `lane0..lane0 + count` of `lanes`
/// (`[rows][pq][16]`): `src` holds `rows` rows of `count·pq` (image m's plane of row o at
/// `o·count·pq + m·pq`, as the GEMM paths gather dy). Other lanes are left as they are.
///
/// # Panics
/// If the lanes do not fit in 16, a slice is too short, or the CPU lacks AVX-512.
pub(super) fn into_lanes(
    src: &[f32],
    (rows, count, pq): (usize, usize, usize),
    lane0: usize,
    lanes: &mut [f32],
) {
    assert!(super::isa::isa().avx512, "image lanes need AVX-512");
    assert!(lane0 + count <= LANES && src.len() >= rows * count * pq);
    assert!(lanes.len() >= rows * pq * LANES);
    // SAFETY: AVX-512F (asserted); lengths asserted.
    unsafe { avx512::into_lanes(src, (rows, count, pq), lane0, lanes) }
}

/// The filter gradient's product, per lane: `out[o][k][m] (+)= Σ_p dy[o][p][m] ·
/// x_m[pixels[p] + taps[k]]` for o < `cols` rounded up to [`R`] (dy's padding channels zero)
/// and every tap k: each image's own sum over the pixels (in order, one chain per lane),
/// `out` then holding `ld · taps · 16` floats. [`fold_lanes`] adds the lanes afterwards.
/// `x.block` is not used: each lane's chain runs over all the pixels.
///
/// # Panics
/// If dy or out is too short, a window lies outside the images, or the CPU lacks AVX-512.
pub(super) fn lane_filter_product(
    x: &LaneWindows,
    dy: &[f32],
    cols: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    assert!(super::isa::isa().avx512, "image lanes need AVX-512");
    let (n, k, ld) = (x.pixels.len(), x.taps.len(), cols.div_ceil(R) * R);
    assert!(dy.len() >= ld * n * LANES, "dy too short");
    assert!(out.len() >= ld * k * LANES, "out too short");
    if let (Some(p), Some(t)) = (x.pixels.iter().max(), x.taps.iter().max()) {
        assert!(
            p + t + LANES <= x.src.len(),
            "a window lies outside the images"
        );
    }
    // Channels outermost: a tile's rows of dy (5 channels x 81 pixels, 26 KiB for conv2)
    // stay in L1 across the taps.
    for o0 in (0..ld).step_by(R) {
        for t0 in (0..k).step_by(V_MAX) {
            let at = (o0, t0);
            // SAFETY: AVX-512F (asserted); dy holds ld·n vectors, out ld·k, every
            // pixels[p] + taps[t] + 16 ≤ src.len() (asserted).
            unsafe {
                match (k - t0).min(V_MAX) {
                    1 => avx512::filter_tile::<1>(x, dy, at, out, accumulate),
                    2 => avx512::filter_tile::<2>(x, dy, at, out, accumulate),
                    3 => avx512::filter_tile::<3>(x, dy, at, out, accumulate),
                    4 => avx512::filter_tile::<4>(x, dy, at, out, accumulate),
                    _ => avx512::filter_tile::<5>(x, dy, at, out, accumulate),
                }
            }
        }
    }
}

/// `sums[i] = ` the sum of vector i's 16 lanes (`vectors[16·i ..][..16]`), always added as
/// the same tree: lane l with lane l + 8, then those sums with the ones 4 apart, 2, 1.
///
/// # Panics
/// If `vectors` is not 16 values per sum, or the CPU lacks AVX-512.
pub(super) fn fold_lanes(vectors: &[f32], sums: &mut [f32]) {
    assert!(super::isa::isa().avx512, "image lanes need AVX-512");
    assert_eq!(vectors.len(), sums.len() * LANES, "16 values per sum");
    // SAFETY: AVX-512F (asserted); lengths asserted.
    unsafe { avx512::fold_lanes(vectors, sums) }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{LaneFilter, LaneWindows, LANES, R};
    use crate::backend::cpu::isa::lanes;
    use crate::backend::shapes::Conv2dShape;

    /// Gather offsets `(l - first) · stride` for lanes l = 0..16.
    #[target_feature(enable = "avx512f")]
    fn strided(stride: i32, first: i32) -> __m512i {
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        _mm512_mullo_epi32(
            _mm512_sub_epi32(lanes, _mm512_set1_epi32(first)),
            _mm512_set1_epi32(stride),
        )
    }

    /// [`super::LaneImages::build`]'s layout by gathers: one vector of 16 images per input
    /// element.
    ///
    /// # Safety
    /// AVX-512F; `x` holds `imgs` ≤ 16 images of C x H x W, `data` the padded layout.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gather_in(s: &Conv2dShape, x: &[f32], imgs: usize, data: &mut [f32]) {
        let image = s.in_c * s.in_h * s.in_w;
        let (hp, wp) = (s.in_h + 2 * s.pad, s.in_w + 2 * s.pad);
        assert!(image * imgs <= x.len() && s.in_c * hp * wp * LANES <= data.len());
        assert!(
            i32::try_from(image * LANES).is_ok(),
            "images too large to gather"
        );
        let index = strided(image as i32, 0);
        let mask = lanes(imgs);
        let (src, dst) = (x.as_ptr(), data.as_mut_ptr());
        for c in 0..s.in_c {
            for h in 0..s.in_h {
                for w in 0..s.in_w {
                    let e = (c * s.in_h + h) * s.in_w + w;
                    let at = ((c * hp + h + s.pad) * wp + w + s.pad) * LANES;
                    // SAFETY: lane m reads x[m·image + e], m < imgs (masked): inside x;
                    // the store covers data[at..at + 16], inside data (asserted).
                    unsafe {
                        let v = _mm512_mask_i32gather_ps::<4>(
                            _mm512_setzero_ps(),
                            mask,
                            index,
                            src.add(e).cast(),
                        );
                        _mm512_storeu_ps(dst.add(at), v);
                    }
                }
            }
        }
    }

    /// One register tile of [`super::lane_product`] over one block of taps (`taps`, from
    /// tap `first` on): channels `o0..o0 + R`, pixels `p0..p0 + V`, summed from zero and then
    /// stored into `out` (the first block) or added to it.
    ///
    /// # Safety
    /// AVX-512F; the bounds [`super::lane_product`] asserts.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const V: usize>(
        x: &LaneWindows,
        taps: &[usize],
        w: &LaneFilter,
        (first, o0, p0): (usize, usize, usize),
        out: &mut [f32],
    ) {
        let (n, ld) = (x.pixels.len(), w.ld());
        // SAFETY: pixels[p] + taps[k] + 16 ≤ src.len() and W's rows are ld ≥ o0 + R long
        // (the caller's bounds), so every load is inside its slice; out is read and written
        // at ((o0 + r)·n + p0 + v)·16 ..[..16], inside out (ld·n·16 long).
        unsafe {
            let mut base = [x.src.as_ptr(); V];
            for (v, b) in base.iter_mut().enumerate() {
                *b = b.add(x.pixels[p0 + v]);
            }
            let wp = w.data.as_ptr().add(o0 + first * ld);
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            for (t, &tap) in taps.iter().enumerate() {
                let mut xv = [_mm512_setzero_ps(); V];
                for (xv, p) in xv.iter_mut().zip(base) {
                    *xv = _mm512_loadu_ps(p.add(tap));
                }
                let wk = wp.add(t * ld);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wk.add(r));
                    for (a, xv) in acc.iter_mut().zip(xv) {
                        *a = _mm512_fmadd_ps(xv, wv, *a);
                    }
                }
            }
            let dst = out.as_mut_ptr();
            for (r, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    let at = dst.add(((o0 + r) * n + p0 + v) * LANES);
                    let sum = if first == 0 {
                        *a
                    } else {
                        _mm512_add_ps(_mm512_loadu_ps(at), *a)
                    };
                    _mm512_storeu_ps(at, sum);
                }
            }
        }
    }

    /// One register tile of [`super::lane_input_grad`]: taps `t0..t0 + R`, pixels
    /// `p0..p0 + V`.
    ///
    /// # Safety
    /// AVX-512F; the bounds [`super::lane_input_grad`] asserts.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn input_tile<const V: usize>(
        dy: &[f32],
        w: &[f32],
        (taps, pixels): (&[usize], &[usize]),
        (t0, p0): (usize, usize),
        dx: &mut [f32],
    ) {
        let (k, n) = (taps.len(), pixels.len());
        let o_n = w.len() / k;
        // SAFETY: the caller's bounds: dy holds o_n·n vectors, w o_n rows of k ≥ t0 + R,
        // taps[t] + pixels[p] + 16 ≤ dx.len().
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            let (d, wp) = (dy.as_ptr().add(p0 * LANES), w.as_ptr().add(t0));
            for o in 0..o_n {
                let mut dv = [_mm512_setzero_ps(); V];
                for (v, dv) in dv.iter_mut().enumerate() {
                    *dv = _mm512_loadu_ps(d.add((o * n + v) * LANES));
                }
                let wo = wp.add(o * k);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wo.add(r));
                    for (a, dv) in acc.iter_mut().zip(dv) {
                        *a = _mm512_fmadd_ps(dv, wv, *a);
                    }
                }
            }
            let dst = dx.as_mut_ptr();
            for (r, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    let at = dst.add(taps[t0 + r] + pixels[p0 + v]);
                    _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), *a));
                }
            }
        }
    }

    /// [`super::into_lanes`]: one masked gather per row and pixel.
    ///
    /// # Safety
    /// AVX-512F; the bounds [`super::into_lanes`] asserts.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn into_lanes(
        src: &[f32],
        (rows, count, pq): (usize, usize, usize),
        lane0: usize,
        lanes: &mut [f32],
    ) {
        assert!(
            i32::try_from(LANES * pq).is_ok(),
            "planes too large to gather"
        );
        let index = strided(pq as i32, lane0 as i32);
        let mask = crate::backend::cpu::isa::lanes(count) << lane0;
        for o in 0..rows {
            for p in 0..pq {
                // SAFETY: lane lane0 + m (m < count, the mask) reads
                // src[o·count·pq + m·pq + p], inside src; the masked store writes those
                // lanes of vector o·pq + p, inside `lanes`.
                unsafe {
                    let base = src.as_ptr().add(o * count * pq + p);
                    let v = _mm512_mask_i32gather_ps::<4>(
                        _mm512_setzero_ps(),
                        mask,
                        index,
                        base.cast(),
                    );
                    _mm512_mask_storeu_ps(lanes.as_mut_ptr().add((o * pq + p) * LANES), mask, v);
                }
            }
        }
    }

    /// One register tile of [`super::lane_filter_product`]: channels `o0..o0 + R`, taps
    /// `t0..t0 + V`, every pixel.
    ///
    /// # Safety
    /// AVX-512F; the bounds [`super::lane_filter_product`] asserts.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn filter_tile<const V: usize>(
        x: &LaneWindows,
        dy: &[f32],
        (o0, t0): (usize, usize),
        out: &mut [f32],
        accumulate: bool,
    ) {
        let (n, k) = (x.pixels.len(), x.taps.len());
        // SAFETY: the caller's bounds: dy's rows o0..o0 + R hold n vectors each, every
        // pixels[p] + taps[t0 + v] + 16 ≤ src.len(), out holds (o0 + R)·k vectors.
        unsafe {
            let mut base = [x.src.as_ptr(); V];
            for (v, b) in base.iter_mut().enumerate() {
                *b = b.add(x.taps[t0 + v]);
            }
            let d = dy.as_ptr().add(o0 * n * LANES);
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            for (p, &pixel) in x.pixels.iter().enumerate() {
                let mut dv = [_mm512_setzero_ps(); R];
                for (r, dv) in dv.iter_mut().enumerate() {
                    *dv = _mm512_loadu_ps(d.add((r * n + p) * LANES));
                }
                for (v, b) in base.iter().enumerate() {
                    let xv = _mm512_loadu_ps(b.add(pixel));
                    for (acc, dv) in acc.iter_mut().zip(dv) {
                        acc[v] = _mm512_fmadd_ps(dv, xv, acc[v]);
                    }
                }
            }
            let dst = out.as_mut_ptr();
            for (r, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    let at = dst.add(((o0 + r) * k + t0 + v) * LANES);
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

    /// [`super::fold_lanes`]: 16 vectors at a time, each level adding the two halves of
    /// every group of lanes across a pair of vectors (one permute each way, one add), so
    /// 16 vectors become one vector of their 16 sums in 15 adds; a last partial batch is
    /// padded with zeros.
    ///
    /// # Safety
    /// AVX-512F; `vectors.len() == 16 · sums.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fold_lanes(vectors: &[f32], sums: &mut [f32]) {
        assert_eq!(vectors.len(), sums.len() * LANES);
        // Level with groups of g lanes: output lane l is source lane (l / g)·2g + l % g
        // of the concatenated pair, plus the one g further on.
        let levels: [(__m512i, __m512i); 4] = [8, 4, 2, 1].map(|g: i32| {
            let lo: [i32; 16] = std::array::from_fn(|l| (l as i32 / g) * 2 * g + l as i32 % g);
            let hi = lo.map(|i| i + g);
            // SAFETY: each array holds the 16 i32 lanes the unaligned load reads.
            unsafe {
                (
                    _mm512_loadu_si512(lo.as_ptr().cast()),
                    _mm512_loadu_si512(hi.as_ptr().cast()),
                )
            }
        });
        for (batch, out) in sums.chunks_mut(LANES).enumerate() {
            let mut v = [_mm512_setzero_ps(); LANES];
            for (i, v) in v.iter_mut().enumerate().take(out.len()) {
                // SAFETY: vector batch·16 + i < sums.len() lies inside `vectors`.
                *v = unsafe { _mm512_loadu_ps(vectors.as_ptr().add((batch * LANES + i) * LANES)) };
            }
            let mut count = LANES;
            for (lo, hi) in levels {
                count /= 2;
                for i in 0..count {
                    let (a, b) = (v[2 * i], v[2 * i + 1]);
                    v[i] = _mm512_add_ps(
                        _mm512_permutex2var_ps(a, lo, b),
                        _mm512_permutex2var_ps(a, hi, b),
                    );
                }
            }
            // SAFETY: the masked store writes out[..out.len()], out.len() ≤ 16.
            unsafe {
                _mm512_mask_storeu_ps(
                    out.as_mut_ptr(),
                    crate::backend::cpu::isa::lanes(out.len()),
                    v[0],
                )
            };
        }
    }

    /// [`super::lane_plane`]: lane m of each pixel's vector, 16 pixels per gather.
    ///
    /// # Safety
    /// AVX-512F; `out` holds `plane.len()` vectors of 16, `m < 16`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gather_plane(out: &[f32], m: usize, plane: &mut [f32]) {
        let pixels = plane.len();
        assert!(m < LANES && out.len() >= pixels * LANES);
        let index = strided(LANES as i32, 0);
        for p0 in (0..pixels).step_by(LANES) {
            let mask = lanes((pixels - p0).min(LANES));
            // SAFETY: lane i reads out[(p0 + i)·16 + m] for p0 + i < pixels (masked),
            // inside out; the masked store writes plane[p0..pixels.min(p0 + 16)].
            unsafe {
                let src = out.as_ptr().add(p0 * LANES + m);
                let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, index, src.cast());
                _mm512_mask_storeu_ps(plane.as_mut_ptr().add(p0), mask, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::super::product_check::{seeded, uniform};
    use super::*;

    /// Offsets of the taps and of the output pixels of `imgs` images, in NCHW images
    /// padded by `s.pad` (times `scale`; image m at m·C·Hp·Wp, ignored when `scale` is 16).
    fn offsets(s: &Conv2dShape, imgs: usize, scale: usize) -> (Vec<usize>, Vec<usize>) {
        let (hp, wp) = (s.in_h + 2 * s.pad, s.in_w + 2 * s.pad);
        let mut taps = Vec::new();
        for c in 0..s.in_c {
            for i in 0..s.k_h {
                taps.extend((0..s.k_w).map(|j| (c * hp * wp + i * wp + j) * scale));
            }
        }
        let mut pixels = Vec::new();
        for m in 0..imgs {
            for p in 0..s.out_h() {
                for q in 0..s.out_w() {
                    let at = m * s.in_c * hp * wp + p * s.stride * wp + q * s.stride;
                    pixels.push(at * scale);
                }
            }
        }
        (taps, pixels)
    }

    fn shape(
        in_c: usize,
        (h, w): (usize, usize),
        out_c: usize,
        k: usize,
        stride: usize,
        pad: usize,
    ) -> Conv2dShape {
        Conv2dShape {
            batch: 16,
            in_c,
            in_h: h,
            in_w: w,
            out_c,
            k_h: k,
            k_w: k,
            stride,
            pad,
        }
    }

    /// The product against float64 for conv2's shape and an awkward one (padding, stride 2,
    /// 7 output channels: not a multiple of R, pixels not a multiple of the tile), full and
    /// ragged groups, several blocks; every image's every output.
    #[test]
    fn lane_product_matches_float64() {
        if !crate::backend::cpu::isa::isa().avx512 {
            eprintln!("no AVX-512 on this CPU: the image-lane product is not used here");
            return;
        }
        let mut rng = seeded(21);
        let cases = [
            (shape(20, (13, 13), 50, 5, 1, 0), 16, 64),
            (shape(20, (13, 13), 50, 5, 1, 0), 7, 500),
            (shape(3, (11, 10), 7, 3, 2, 1), 5, 4),
            (shape(2, (6, 9), 16, 3, 1, 2), 16, 1),
        ];
        for (s, imgs, block) in cases {
            let (image, k) = (s.in_c * s.in_h * s.in_w, s.in_c * s.k_h * s.k_w);
            let pq = s.out_h() * s.out_w();
            let x = uniform(&mut rng, imgs * image);
            let w = uniform(&mut rng, s.out_c * k);
            let (taps, pixels) = offsets(&s, 1, LANES);
            let mut images = LaneImages::default();
            let mut filter = LaneFilter::default();
            filter.pack(&w, s.out_c, k);
            let windows = LaneWindows {
                src: images.build(&s, &x, imgs),
                pixels: &pixels,
                taps: &taps,
                block,
            };
            let mut out = vec![f32::NAN; filter.ld() * pq * LANES];
            lane_product(&windows, &filter, &mut out);
            let mut plane = vec![f32::NAN; pq];
            for m in 0..imgs {
                for o in 0..s.out_c {
                    lane_plane(&out, pq, o, m, &mut plane);
                    for (p, &got) in plane.iter().enumerate() {
                        let (py, px) = ((p / s.out_w()) * s.stride, (p % s.out_w()) * s.stride);
                        let (mut want, mut mag) = (0.0f64, 0.0f64);
                        for c in 0..s.in_c {
                            for i in 0..s.k_h {
                                for j in 0..s.k_w {
                                    let (h, v) =
                                        ((py + i).checked_sub(s.pad), (px + j).checked_sub(s.pad));
                                    let Some((h, v)) =
                                        h.zip(v).filter(|&(h, v)| h < s.in_h && v < s.in_w)
                                    else {
                                        continue;
                                    };
                                    let t = f64::from(w[o * k + (c * s.k_h + i) * s.k_w + j])
                                        * f64::from(x[m * image + (c * s.in_h + h) * s.in_w + v]);
                                    want += t;
                                    mag += t.abs();
                                }
                            }
                        }
                        let err = (f64::from(got) - want).abs();
                        assert!(
                            err <= 1e-6 + 2e-6 * mag,
                            "{s:?} imgs {imgs} block {block}: image {m} channel {o} pixel {p}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The input gradient (col2im fused) against float64, for conv2's shape and a padded,
    /// strided one whose 27 taps are padded to 30 (zero weights, the last offset repeated)
    /// as the caller pads them; dx starts at random values and is added to.
    #[test]
    fn lane_input_grad_matches_float64() {
        if !crate::backend::cpu::isa::isa().avx512 {
            eprintln!("no AVX-512 on this CPU: the image-lane product is not used here");
            return;
        }
        let mut rng = seeded(23);
        for s in [
            shape(20, (13, 13), 50, 5, 1, 0),
            shape(3, (11, 10), 7, 3, 2, 1),
        ] {
            let (hp, wp) = (s.in_h + 2 * s.pad, s.in_w + 2 * s.pad);
            let k = s.in_c * s.k_h * s.k_w;
            let kpad = k.div_ceil(R) * R;
            let pq = s.out_h() * s.out_w();
            let (mut taps, pixels) = offsets(&s, 1, LANES);
            taps.resize(kpad, *taps.last().unwrap());
            let w = uniform(&mut rng, s.out_c * k);
            let mut wpad = vec![0.0; s.out_c * kpad];
            for o in 0..s.out_c {
                wpad[o * kpad..o * kpad + k].copy_from_slice(&w[o * k..(o + 1) * k]);
            }
            let dy = uniform(&mut rng, s.out_c * pq * LANES);
            let dx0 = uniform(&mut rng, s.in_c * hp * wp * LANES);
            let mut dx = dx0.clone();
            lane_input_grad(&dy, &wpad, (&taps, &pixels), &mut dx);
            // float64: each element's starting value plus every (o, tap, pixel) landing on it.
            let mut want: Vec<f64> = dx0.iter().map(|&v| f64::from(v)).collect();
            let mut mag: Vec<f64> = want.iter().map(|v| v.abs()).collect();
            for o in 0..s.out_c {
                for t in 0..k {
                    for (p, &pixel) in pixels.iter().enumerate() {
                        for m in 0..LANES {
                            let term =
                                f64::from(w[o * k + t]) * f64::from(dy[(o * pq + p) * LANES + m]);
                            want[taps[t] + pixel + m] += term;
                            mag[taps[t] + pixel + m] += term.abs();
                        }
                    }
                }
            }
            for (i, ((&got, want), mag)) in dx.iter().zip(&want).zip(&mag).enumerate() {
                let err = (f64::from(got) - want).abs();
                assert!(
                    err <= 1e-6 + 2e-6 * mag,
                    "{s:?}: element {i}: {got} vs {want}"
                );
            }
        }
    }

    /// The filter gradient per lane, then the lanes folded, against float64: conv2's shape
    /// (50 channels: 10 tiles of R) and an awkward one (padding, stride 2, 7 channels, 27
    /// taps), two sets of images summed as a chunk sums them, the second shape's sets short
    /// (11 images: the other lanes zero in x and in dy, as the caller leaves them); the fold
    /// covers 25,000 and 189 sums, neither a multiple of 16.
    #[test]
    fn lane_filter_product_and_fold_match_float64() {
        if !crate::backend::cpu::isa::isa().avx512 {
            eprintln!("no AVX-512 on this CPU: the image-lane product is not used here");
            return;
        }
        let mut rng = seeded(24);
        for (s, imgs) in [
            (shape(20, (13, 13), 50, 5, 1, 0), 16),
            (shape(3, (11, 10), 7, 3, 2, 1), 11),
        ] {
            let image = s.in_c * s.in_h * s.in_w;
            let k = s.in_c * s.k_h * s.k_w;
            let pq = s.out_h() * s.out_w();
            let ld = s.out_c.div_ceil(R) * R;
            let (taps, pixels) = offsets(&s, 1, LANES);
            let xs: Vec<Vec<f32>> = (0..2).map(|_| uniform(&mut rng, imgs * image)).collect();
            let dys: Vec<Vec<f32>> = (0..2)
                .map(|_| {
                    let mut dy = vec![0.0f32; ld * pq * LANES];
                    for o in 0..s.out_c {
                        for p in 0..pq {
                            for m in 0..imgs {
                                dy[(o * pq + p) * LANES + m] = rng.gen_range(-1.0..1.0);
                            }
                        }
                    }
                    dy
                })
                .collect();
            let mut totals = vec![f32::NAN; ld * k * LANES];
            let mut images = LaneImages::default();
            for (set, (x, dy)) in xs.iter().zip(&dys).enumerate() {
                let windows = LaneWindows {
                    src: images.build(&s, x, imgs),
                    pixels: &pixels,
                    taps: &taps,
                    block: pq,
                };
                lane_filter_product(&windows, dy, s.out_c, &mut totals, set > 0);
            }
            let mut dw = vec![f32::NAN; s.out_c * k];
            fold_lanes(&totals[..s.out_c * k * LANES], &mut dw);
            for o in 0..s.out_c {
                for c in 0..s.in_c {
                    for i in 0..s.k_h {
                        for j in 0..s.k_w {
                            let (mut want, mut mag) = (0.0f64, 0.0f64);
                            for (x, dy) in xs.iter().zip(&dys) {
                                for m in 0..imgs {
                                    for p in 0..pq {
                                        let (py, px) = (
                                            (p / s.out_w()) * s.stride + i,
                                            (p % s.out_w()) * s.stride + j,
                                        );
                                        let (Some(h), Some(v)) =
                                            (py.checked_sub(s.pad), px.checked_sub(s.pad))
                                        else {
                                            continue;
                                        };
                                        if h >= s.in_h || v >= s.in_w {
                                            continue;
                                        }
                                        let t = f64::from(dy[(o * pq + p) * LANES + m])
                                            * f64::from(
                                                x[m * image + (c * s.in_h + h) * s.in_w + v],
                                            );
                                        want += t;
                                        mag += t.abs();
                                    }
                                }
                            }
                            let got = dw[o * k + (c * s.k_h + i) * s.k_w + j];
                            let err = (f64::from(got) - want).abs();
                            assert!(
                                err <= 1e-6 + 2e-6 * mag,
                                "{s:?}: dw[{o}][{c}][{i}][{j}] {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Exactly the sums the docs promise: each output the taps' products fused-added in
    /// order from zero within blocks of 64 taps, the blocks' sums added in order (a scalar
    /// `mul_add` reference, compared bit for bit). conv2's shape, 16 images and a ragged 9.
    #[test]
    fn lane_product_sums_blocks_of_taps_in_order() {
        if !crate::backend::cpu::isa::isa().avx512 {
            eprintln!("no AVX-512 on this CPU: the image-lane product is not used here");
            return;
        }
        let mut rng = seeded(22);
        let s = shape(20, (13, 13), 50, 5, 1, 0);
        let (image, k, pq) = (20 * 169, 500, 81);
        for imgs in [16, 9] {
            let x = uniform(&mut rng, imgs * image);
            let w = uniform(&mut rng, s.out_c * k);
            let (taps, pixels) = offsets(&s, 1, LANES);
            let (mut images, mut filter) = (LaneImages::default(), LaneFilter::default());
            filter.pack(&w, s.out_c, k);
            let windows = LaneWindows {
                src: images.build(&s, &x, imgs),
                pixels: &pixels,
                taps: &taps,
                block: 64,
            };
            let mut out = vec![0.0; filter.ld() * pq * LANES];
            lane_product(&windows, &filter, &mut out);
            let (taps, pixels) = offsets(&s, 1, 1);
            let mut plane = vec![0.0; pq];
            for m in 0..imgs {
                for o in 0..s.out_c {
                    lane_plane(&out, pq, o, m, &mut plane);
                    for (p, got) in plane.iter().enumerate() {
                        let mut total = 0.0f32;
                        for (b, block) in taps.chunks(64).enumerate() {
                            let mut acc = 0.0f32;
                            for (t, tap) in block.iter().enumerate() {
                                let xv = x[m * image + pixels[p] + tap];
                                acc = xv.mul_add(w[o * k + b * 64 + t], acc);
                            }
                            total = if b == 0 { acc } else { total + acc };
                        }
                        assert_eq!(
                            got.to_bits(),
                            total.to_bits(),
                            "{imgs} images: image {m} channel {o} pixel {p}"
                        );
                    }
                }
            }
        }
    }
}
