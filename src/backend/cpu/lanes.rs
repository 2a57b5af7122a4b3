//! Convolution products with a group of images in the lanes of a vector register, written
//! once over the [`Engine`] trait (16 images on AVX-512, 8 on AVX2, 4 portable).
//!
//! A group of images is first laid out image-innermost (`[C][H][W][LANES]`,
//! [`LaneImages`]), so one vector load brings one input element of every image in the group,
//! every lane does useful work for any channel count, and a register holds one output
//! element of each image. The three products over it, each an `E::R` x `E::V` register
//! tile: [`lane_product`] (forward), [`lane_input_grad`] (col2im fused) and
//! [`lane_filter_product`] (each lane its own image's sum, folded by [`fold_lanes`]). The
//! layouts cost one copy per element going in and one coming out ([`transpose`]), and live
//! on whole cache lines ([`Lines`]), so no vector load or store is split across two.

use std::marker::PhantomData;

use super::engine::{store_tile, Engine};
use crate::backend::shapes::Conv2dShape;
use crate::backend::Precision;

/// f32 storage that starts on a cache line, for the lanes' operands and results: every
/// vector the tiles load or store then lies in one line (16 bytes off, as an allocator may
/// place a `Vec`, every other one is split across two, and the forward's tile runs 5%
/// slower).
#[derive(Default)]
pub(super) struct Lines(Vec<Line>);

/// One cache line of f32.
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl Lines {
    /// The first `len` values, as last written (zero where never written).
    pub(super) fn resized(&mut self, len: usize) -> &mut [f32] {
        &mut bytemuck::cast_slice_mut(super::fitted(&mut self.0, len.div_ceil(16)))[..len]
    }
}

/// A group of up to `E::LANES` images laid out `[C][H + 2·pad][W + 2·pad][LANES]`: element
/// (c, h, w) of image m at `((c·Hp + h)·Wp + w)·LANES + m`, zero in the padding and in the
/// lanes of missing images. The buffer is kept between groups.
#[derive(Default)]
pub(super) struct LaneImages {
    data: Lines,
}

impl LaneImages {
    /// Lays out `imgs` ≤ `E::LANES` images of `x` (`imgs` x C x H x W, contiguous); half
    /// values are widened a channel at a time into `wide` (the group's planes of one
    /// channel: in L1, not a whole group in f32 written out and read back).
    ///
    /// # Panics
    /// If `imgs` is 0 or over the lanes, or `x` is not `imgs` images long.
    pub(super) fn build<E: Engine, T: Precision>(
        &mut self,
        s: &Conv2dShape,
        x: &[T],
        imgs: usize,
        wide: &mut Vec<f32>,
    ) -> &[f32] {
        let (plane, image) = (s.in_h * s.in_w, s.in_c * s.in_h * s.in_w);
        assert!((1..=E::LANES).contains(&imgs) && x.len() == imgs * image);
        let (hp, wp) = padded_dims(s);
        let data = self.data.resized(s.in_c * hp * wp * E::LANES);
        if s.pad > 0 || imgs < E::LANES {
            data.fill(0.0);
        }
        for c in 0..s.in_c {
            // Channel c of image m at src[m·stride + h·W + w].
            let (src, stride) = match T::as_f32(x) {
                Some(x) => (&x[c * plane..], image),
                None => {
                    wide.resize(imgs * plane, 0.0);
                    for (m, dst) in wide.chunks_exact_mut(plane.max(1)).enumerate() {
                        T::widen_slice(&x[m * image + c * plane..][..plane], dst);
                    }
                    (&wide[..], plane)
                }
            };
            for [at, from, n] in padded_runs(s, c, E::LANES) {
                let dst = &mut data[at..at + n * E::LANES];
                transpose(&src[from..], (stride, E::LANES), (imgs, n), dst);
            }
        }
        data
    }
}

/// The input's dimensions with the padding: the planes of [`LaneImages`] and of the im2col
/// path's padded images.
pub(super) fn padded_dims(s: &Conv2dShape) -> (usize, usize) {
    (s.in_h + 2 * s.pad, s.in_w + 2 * s.pad)
}

/// Plane c's pixels as runs a padded layout of `lanes` values a pixel holds contiguously (the
/// whole plane, or each row where padding lies between rows): `[where in the layout, where
/// in the plane, pixels]`.
pub(super) fn padded_runs(
    s: &Conv2dShape,
    c: usize,
    lanes: usize,
) -> impl Iterator<Item = [usize; 3]> {
    let ((hp, wp), pad) = (padded_dims(s), s.pad);
    let (rows, n) = match pad {
        0 => (1, s.in_h * s.in_w),
        _ => (s.in_h, s.in_w),
    };
    (0..rows).map(move |h| [((c * hp + h + pad) * wp + pad) * lanes, h * n, n])
}

/// The filter as the tile reads it: `[tap][O rounded up to E::R]`, zero past O.
pub(super) struct LaneFilter<E> {
    data: Vec<f32>,
    cols: usize,
    depth: usize,
    engine: PhantomData<E>,
}

impl<E: Engine> LaneFilter<E> {
    /// Packs `w` (O x K, row-major, f32).
    pub(super) fn pack(w: &[f32], cols: usize, depth: usize) -> Self {
        assert_eq!(w.len(), cols * depth, "filter is not O x K");
        let ld = cols.div_ceil(E::R) * E::R;
        let mut data = vec![0.0; ld * depth];
        transpose(w, (depth, ld), (cols, depth), &mut data);
        Self {
            data,
            cols,
            depth,
            engine: PhantomData,
        }
    }

    /// Output channels rounded up to `E::R`: the packed rows' length.
    pub(super) fn ld(&self) -> usize {
        self.cols.div_ceil(E::R) * E::R
    }
}

/// Offsets into a [`LaneImages`] layout (already times the lanes), as the window tile's
/// offsets into an image: one per output pixel (its window's corner) and one per tap.
pub(super) struct LaneWindows<'a> {
    /// The images, [`LaneImages::build`]'s layout.
    pub(super) src: &'a [f32],
    /// One offset per output pixel of an image.
    pub(super) pixels: &'a [usize],
    /// One offset per tap, in the filter's order.
    pub(super) taps: &'a [usize],
    /// Taps summed in the registers from zero before they join the running total.
    pub(super) block: usize,
}

/// Asserts that every window (a vector of `lanes` at each `pixel + tap`) lies inside the
/// `len` floats of the images.
fn assert_inside((pixels, taps): (&[usize], &[usize]), lanes: usize, len: usize) {
    if let (Some(p), Some(t)) = (pixels.iter().max(), taps.iter().max()) {
        assert!(p + t + lanes <= len, "a window lies outside the images");
    }
}

/// Calls `$tile::<E, R, V>($args)` for the engine's R and the tile width `$v` (1 to
/// `E::V`): the tile's accumulators are arrays of constant size, so R and V are constants
/// of each instance, and the arms other engines need are compiled out.
macro_rules! tile_of_width {
    ($E:ty, $v:expr, $tile:ident($($arg:expr),*)) => {
        match (<$E>::R, $v) {
            (5, 1) => $tile::<$E, 5, 1>($($arg),*),
            (5, 2) => $tile::<$E, 5, 2>($($arg),*),
            (5, 3) => $tile::<$E, 5, 3>($($arg),*),
            (5, 4) => $tile::<$E, 5, 4>($($arg),*),
            (5, 5) => $tile::<$E, 5, 5>($($arg),*),
            (4, 1) => $tile::<$E, 4, 1>($($arg),*),
            (4, 2) => $tile::<$E, 4, 2>($($arg),*),
            (4, 3) => $tile::<$E, 4, 3>($($arg),*),
            (3, 1) => $tile::<$E, 3, 1>($($arg),*),
            (3, 2) => $tile::<$E, 3, 2>($($arg),*),
            (3, 3) => $tile::<$E, 3, 3>($($arg),*),
            (r, v) => unreachable!("no {r} x {v} tile"),
        }
    };
}

/// `out[o][p][m] = Σ_k w[o][k] · x_m[pixels[p] + taps[k]]` for o < O rounded up to `E::R`
/// (the padding channels are zero) and every pixel p, all lanes: `out` holds
/// `ld · pixels · LANES` floats.
///
/// # Panics
/// If the taps do not match the filter's depth, a window lies outside the images, `out` is
/// too short, or the CPU lacks the engine.
pub(super) fn lane_product<E: Engine>(x: &LaneWindows, w: &LaneFilter<E>, out: &mut [f32]) {
    assert!(E::available(), "{} is not available", E::KIND.name());
    assert_eq!(x.taps.len(), w.depth, "taps do not match the filter");
    let (n, ld) = (x.pixels.len(), w.ld());
    assert!(out.len() >= ld * n * E::LANES, "out too short");
    assert_inside((x.pixels, x.taps), E::LANES, x.src.len());
    // Tap blocks outermost, then pixels, then channels: a pixel tile's windows over a block
    // stay in L1 across the channel tiles, the block's filter rows across the pixel tiles;
    // the running totals wait in `out`.
    let block = x.block.max(1);
    // SAFETY: the engine is available (asserted); every pixels[p] + taps[k] + LANES ≤
    // src.len() (asserted), W rows of ld with o0 + R ≤ ld, out holds ld·n·LANES (asserted).
    unsafe {
        E::run(|| {
            for (b, taps) in x.taps.chunks(block).enumerate() {
                for p0 in (0..n).step_by(E::V) {
                    for o0 in (0..ld).step_by(E::R) {
                        let at = (b * block, o0, p0);
                        tile_of_width!(E, (n - p0).min(E::V), tile(x, taps, w, at, out));
                    }
                }
            }
        })
    }
}

/// One register tile of [`lane_product`] over one block of taps (`taps`, from tap `first`
/// on): channels `o0..o0 + R`, pixels `p0..p0 + V`, summed from zero and then stored into
/// `out` (the first block) or added to it.
///
/// # Safety
/// Inside `E::run`; the bounds [`lane_product`] asserts.
#[inline(always)]
unsafe fn tile<E: Engine, const R: usize, const V: usize>(
    x: &LaneWindows,
    taps: &[usize],
    w: &LaneFilter<E>,
    (first, o0, p0): (usize, usize, usize),
    out: &mut [f32],
) {
    let (n, ld) = (x.pixels.len(), w.ld());
    // SAFETY: pixels[p] + taps[k] + LANES ≤ src.len() and W's rows are ld ≥ o0 + R long
    // (the caller's bounds), so every load is inside its slice; out is read and written at
    // ((o0 + r)·n + p0 + v)·LANES ..[..LANES], inside out (ld·n·LANES long).
    unsafe {
        let mut base = [x.src.as_ptr(); V];
        for (v, b) in base.iter_mut().enumerate() {
            *b = b.add(x.pixels[p0 + v]);
        }
        let wp = w.data.as_ptr().add(o0 + first * ld);
        let mut acc = [[E::splat(0.0); V]; R];
        for (t, &tap) in taps.iter().enumerate() {
            let mut xv = [E::splat(0.0); V];
            for (xv, p) in xv.iter_mut().zip(base) {
                *xv = E::load(p.add(tap));
            }
            let wk = wp.add(t * ld);
            for (r, acc) in acc.iter_mut().enumerate() {
                let wv = E::splat(*wk.add(r));
                for (a, xv) in acc.iter_mut().zip(xv) {
                    *a = E::fmadd(xv, wv, *a);
                }
            }
        }
        let dst = out.as_mut_ptr();
        store_tile::<E, V>(&acc, first > 0, |r, v| {
            dst.add(((o0 + r) * n + p0 + v) * E::LANES)
        });
    }
}

super::engine::multiversion!(
    /// Transposes `rows` x `cols` values: `dst[j·dst_ld + m] = src[m·src_ld + j]`, other
    /// values of `dst` left as they are. Vectorized where one side is whole vectors of 4, 8
    /// or 16 lanes: rows into lanes ([`LaneImages`]) or lanes into rows (the products'
    /// outputs).
    ///
    /// # Panics
    /// If a slice is too short.
    pub(super) fn transpose(
        src: &[f32], lds: (usize, usize), shape: (usize, usize), dst: &mut [f32]
    ) = transpose_body
);

#[inline(always)]
fn transpose_body(src: &[f32], lds: (usize, usize), shape: (usize, usize), dst: &mut [f32]) {
    let ((src_ld, dst_ld), (rows, cols)) = (lds, shape);
    if rows == 0 || cols == 0 {
        return;
    }
    /// L rows into `cols` vectors of L lanes.
    #[inline(always)]
    fn into_vectors<const L: usize>(src: &[f32], src_ld: usize, dst: &mut [f32]) {
        let cols = dst.len() / L;
        let rows: [&[f32]; L] = std::array::from_fn(|m| &src[m * src_ld..][..cols]);
        for (j, d) in dst.chunks_exact_mut(L).enumerate() {
            for m in 0..L {
                d[m] = rows[m][j];
            }
        }
    }
    /// `rows` vectors of L lanes into L rows.
    #[inline(always)]
    fn from_vectors<const L: usize>(src: &[f32], (dst_ld, rows): (usize, usize), dst: &mut [f32]) {
        let mut rest = dst;
        let out: [&mut [f32]; L] = std::array::from_fn(|_| {
            let row = std::mem::take(&mut rest);
            let (row, tail) = row.split_at_mut(dst_ld.min(row.len()));
            rest = tail;
            &mut row[..rows]
        });
        for (m, v) in src[..rows * L].chunks_exact(L).enumerate() {
            for j in 0..L {
                out[j][m] = v[j];
            }
        }
    }
    match (rows, cols, src_ld, dst_ld) {
        (16, _, _, 16) => into_vectors::<16>(src, src_ld, &mut dst[..cols * 16]),
        (8, _, _, 8) => into_vectors::<8>(src, src_ld, &mut dst[..cols * 8]),
        (4, _, _, 4) => into_vectors::<4>(src, src_ld, &mut dst[..cols * 4]),
        (_, 16, 16, _) => from_vectors::<16>(src, (dst_ld, rows), dst),
        (_, 8, 8, _) => from_vectors::<8>(src, (dst_ld, rows), dst),
        (_, 4, 4, _) => from_vectors::<4>(src, (dst_ld, rows), dst),
        _ => {
            for m in 0..rows {
                for j in 0..cols {
                    dst[j * dst_ld + m] = src[m * src_ld + j];
                }
            }
        }
    }
}

/// The input gradient with the images in the lanes, col2im fused: for every tap k and
/// output pixel p, `dx[taps[k] + pixels[p]] += Σ_o w[o][k] · dy[o][p]` per lane, the sum
/// over the O output channels taken in order in the registers and added to dx in a fixed
/// order (tap tiles within pixel tiles). `dy` is `[O][pixels][LANES]`, `w` the filter (O x
/// K, row-major, K a multiple of `E::R`: pad with zero taps), `dx` the images' layout of
/// [`LaneImages`] (added to, not cleared).
///
/// # Panics
/// If a slice is too short, K is not a multiple of R, an offset lies outside dx, or the CPU
/// lacks the engine.
pub(super) fn lane_input_grad<E: Engine>(
    dy: &[f32],
    w: &[f32],
    (taps, pixels): (&[usize], &[usize]),
    dx: &mut [f32],
) {
    assert!(E::available(), "{} is not available", E::KIND.name());
    let (k, n) = (taps.len(), pixels.len());
    assert!(k % E::R == 0, "taps not a multiple of R");
    let o_n = w.len().checked_div(k).unwrap_or(0);
    assert!(
        w.len() == o_n * k && dy.len() >= o_n * n * E::LANES,
        "w or dy too short"
    );
    assert_inside((pixels, taps), E::LANES, dx.len());
    // Pixels outermost: a pixel tile's dy (V pixels x O) stays in L1 across the taps; the
    // filter streams from L2 once per pixel tile.
    // SAFETY: the engine is available (asserted); dy holds O·n vectors, w O rows of k, every
    // taps[t] + pixels[p] + LANES ≤ dx.len() (asserted).
    unsafe {
        E::run(|| {
            for p0 in (0..n).step_by(E::V) {
                for t0 in (0..k).step_by(E::R) {
                    let v = (n - p0).min(E::V);
                    tile_of_width!(E, v, input_tile(dy, w, (taps, pixels), (t0, p0), dx));
                }
            }
        })
    }
}

/// One register tile of [`lane_input_grad`]: taps `t0..t0 + R`, pixels `p0..p0 + V`.
///
/// # Safety
/// Inside `E::run`; the bounds [`lane_input_grad`] asserts.
#[inline(always)]
unsafe fn input_tile<E: Engine, const R: usize, const V: usize>(
    dy: &[f32],
    w: &[f32],
    (taps, pixels): (&[usize], &[usize]),
    (t0, p0): (usize, usize),
    dx: &mut [f32],
) {
    let (k, n) = (taps.len(), pixels.len());
    let o_n = w.len() / k;
    // SAFETY: the caller's bounds: dy holds o_n·n vectors, w o_n rows of k ≥ t0 + R,
    // taps[t] + pixels[p] + LANES ≤ dx.len().
    unsafe {
        let mut acc = [[E::splat(0.0); V]; R];
        let (d, wp) = (dy.as_ptr().add(p0 * E::LANES), w.as_ptr().add(t0));
        for o in 0..o_n {
            let mut dv = [E::splat(0.0); V];
            for (v, dv) in dv.iter_mut().enumerate() {
                *dv = E::load(d.add((o * n + v) * E::LANES));
            }
            let wo = wp.add(o * k);
            for (r, acc) in acc.iter_mut().enumerate() {
                let wv = E::splat(*wo.add(r));
                for (a, dv) in acc.iter_mut().zip(dv) {
                    *a = E::fmadd(dv, wv, *a);
                }
            }
        }
        let dst = dx.as_mut_ptr();
        store_tile::<E, V>(&acc, true, |r, v| dst.add(taps[t0 + r] + pixels[p0 + v]));
    }
}

/// The filter gradient's product, per lane: `out[o][k][m] (+)= Σ_p dy[o][p][m] ·
/// x_m[pixels[p] + taps[k]]` for o < `cols` rounded up to `E::R` (dy's padding channels
/// zero) and every tap k: each image's own sum over the pixels (in order, one chain per
/// lane), `out` then holding `ld · taps · LANES` floats. [`fold_lanes`] adds the lanes
/// afterwards. `x.block` is not used: each lane's chain runs over all the pixels.
///
/// # Panics
/// If dy or out is too short, a window lies outside the images, or the CPU lacks the engine.
pub(super) fn lane_filter_product<E: Engine>(
    x: &LaneWindows,
    dy: &[f32],
    cols: usize,
    out: &mut [f32],
    accumulate: bool,
) {
    assert!(E::available(), "{} is not available", E::KIND.name());
    let (n, k, ld) = (x.pixels.len(), x.taps.len(), cols.div_ceil(E::R) * E::R);
    assert!(dy.len() >= ld * n * E::LANES, "dy too short");
    assert!(out.len() >= ld * k * E::LANES, "out too short");
    assert_inside((x.pixels, x.taps), E::LANES, x.src.len());
    // Channels outermost: a tile's rows of dy (R channels x the pixels) stay in L1 across
    // the taps.
    // SAFETY: the engine is available (asserted); dy holds ld·n vectors, out ld·k, every
    // pixels[p] + taps[t] + LANES ≤ src.len() (asserted).
    unsafe {
        E::run(|| {
            for o0 in (0..ld).step_by(E::R) {
                for t0 in (0..k).step_by(E::V) {
                    let v = (k - t0).min(E::V);
                    tile_of_width!(E, v, filter_tile(x, dy, (o0, t0), out, accumulate));
                }
            }
        })
    }
}

/// One register tile of [`lane_filter_product`]: channels `o0..o0 + R`, taps
/// `t0..t0 + V`, every pixel.
///
/// # Safety
/// Inside `E::run`; the bounds [`lane_filter_product`] asserts.
#[inline(always)]
unsafe fn filter_tile<E: Engine, const R: usize, const V: usize>(
    x: &LaneWindows,
    dy: &[f32],
    (o0, t0): (usize, usize),
    out: &mut [f32],
    accumulate: bool,
) {
    let (n, k) = (x.pixels.len(), x.taps.len());
    // SAFETY: the caller's bounds: dy's rows o0..o0 + R hold n vectors each, every
    // pixels[p] + taps[t0 + v] + LANES ≤ src.len(), out holds (o0 + R)·k vectors.
    unsafe {
        let mut base = [x.src.as_ptr(); V];
        for (v, b) in base.iter_mut().enumerate() {
            *b = b.add(x.taps[t0 + v]);
        }
        let d = dy.as_ptr().add(o0 * n * E::LANES);
        let mut acc = [[E::splat(0.0); V]; R];
        for (p, &pixel) in x.pixels.iter().enumerate() {
            // The V windows' vectors held, one dy vector at a time: R·V + V + 1 registers.
            let mut xv = [E::splat(0.0); V];
            for (xv, b) in xv.iter_mut().zip(base) {
                *xv = E::load(b.add(pixel));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let dv = E::load(d.add((r * n + p) * E::LANES));
                for (a, xv) in acc.iter_mut().zip(xv) {
                    *a = E::fmadd(dv, xv, *a);
                }
            }
        }
        let dst = out.as_mut_ptr();
        store_tile::<E, V>(&acc, accumulate, |r, v| {
            dst.add(((o0 + r) * k + t0 + v) * E::LANES)
        });
    }
}

/// `sums[i] = ` the sum of vector i's `E::LANES` values (`vectors[LANES·i ..][..LANES]`),
/// always added as the same tree: lane l with lane l + LANES/2, then those sums with the ones
/// a quarter apart, and so on.
///
/// # Panics
/// If `vectors` is not `E::LANES` values per sum, or the CPU lacks the engine.
pub(super) fn fold_lanes<E: Engine>(vectors: &[f32], sums: &mut [f32]) {
    assert!(E::available(), "{} is not available", E::KIND.name());
    assert_eq!(
        vectors.len(),
        sums.len() * E::LANES,
        "{} values per sum",
        E::LANES
    );
    // SAFETY: the engine is available (asserted); vector i lies at LANES·i, inside
    // `vectors` for i < sums.len() (asserted).
    unsafe {
        E::run(|| {
            for (i, sum) in sums.iter_mut().enumerate() {
                *sum = E::sum(E::load(vectors.as_ptr().add(i * E::LANES)));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::super::conv::lane_offsets;
    use super::super::engine::on_each_engine;
    use super::super::product_check::{seeded, uniform};
    use super::*;

    /// [`lane_product`] of `imgs` images `x` (f32) by the filter `w` (O x K) in blocks of
    /// `block` taps, into a poisoned `out` (its layout).
    fn forward<E: Engine>(
        s: &Conv2dShape,
        x: &[f32],
        w: &[f32],
        imgs: usize,
        block: usize,
    ) -> Vec<f32> {
        let (taps, pixels) = lane_offsets(s, E::LANES);
        let filter = LaneFilter::<E>::pack(w, s.out_c, w.len() / s.out_c);
        let mut images = LaneImages::default();
        let windows = LaneWindows {
            src: images.build::<E, f32>(s, x, imgs, &mut Vec::new()),
            pixels: &pixels,
            taps: &taps,
            block,
        };
        let mut out = vec![f32::NAN; filter.ld() * pixels.len() * E::LANES];
        lane_product(&windows, &filter, &mut out);
        out
    }

    /// `got` within 1e-6 + 2e-6 · `mag` (the terms' Σ|t|) of the float64 `want`.
    fn assert_near<E: Engine>(got: f32, (want, mag): (f64, f64), at: impl Fn() -> String) {
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= 1e-6 + 2e-6 * mag,
            "{}: {}: {got} vs {want}",
            E::KIND.name(),
            at()
        );
    }

    /// The input element that tap t (in the filter's order) of output pixel p reads from
    /// image `x_m` (C x H x W from its start), None in the padding.
    fn tap_input(s: &Conv2dShape, x_m: &[f32], t: usize, p: usize) -> Option<f32> {
        let (c, i, j) = (t / (s.k_h * s.k_w), t / s.k_w % s.k_h, t % s.k_w);
        let py = (p / s.out_w()) * s.stride + i;
        let px = (p % s.out_w()) * s.stride + j;
        let (h, v) = (py.checked_sub(s.pad)?, px.checked_sub(s.pad)?);
        (h < s.in_h && v < s.in_w).then(|| x_m[(c * s.in_h + h) * s.in_w + v])
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
        on_each_engine!(lane_product_matches_float64_on);
    }

    fn lane_product_matches_float64_on<E: Engine>() {
        let mut rng = seeded(21);
        let cases = [
            (shape(20, (13, 13), 50, 5, 1, 0), E::LANES, 64),
            (shape(20, (13, 13), 50, 5, 1, 0), E::LANES - 1, 500),
            (shape(3, (11, 10), 7, 3, 2, 1), 3, 4),
            (shape(2, (6, 9), 16, 3, 1, 2), E::LANES, 1),
        ];
        for (s, imgs, block) in cases {
            let (image, k) = (s.in_c * s.in_h * s.in_w, s.in_c * s.k_h * s.k_w);
            let pq = s.out_h() * s.out_w();
            let x = uniform(&mut rng, imgs * image);
            let w = uniform(&mut rng, s.out_c * k);
            let out = forward::<E>(&s, &x, &w, imgs, block);
            for m in 0..imgs {
                for o in 0..s.out_c {
                    let plane = (0..pq).map(|p| out[(o * pq + p) * E::LANES + m]);
                    for (p, got) in plane.enumerate() {
                        let (mut want, mut mag) = (0.0f64, 0.0f64);
                        for t in 0..k {
                            let Some(xv) = tap_input(&s, &x[m * image..], t, p) else {
                                continue;
                            };
                            let t = f64::from(w[o * k + t]) * f64::from(xv);
                            want += t;
                            mag += t.abs();
                        }
                        let at = || {
                            format!(
                                "{s:?} imgs {imgs} block {block}: image {m} channel {o} pixel {p}"
                            )
                        };
                        assert_near::<E>(got, (want, mag), at);
                    }
                }
            }
        }
    }

    /// `Lines` starts on a cache line through growth, keeps what was written and reads zero
    /// where nothing was.
    #[test]
    fn lines_start_on_a_cache_line_and_keep_their_values() {
        let mut lines = Lines::default();
        lines.resized(20).fill(1.0);
        for len in [3, 1000, 5, 100_000] {
            let v = lines.resized(len);
            assert_eq!(v.as_ptr() as usize % 64, 0, "length {len}");
            let ones = v.iter().take_while(|x| **x == 1.0).count();
            assert!(ones == len.min(20) && v[ones..].iter().all(|x| *x == 0.0));
        }
    }

    /// The input gradient (col2im fused) against float64, for conv2's shape and a padded,
    /// strided one whose 27 taps are padded to 30 (zero weights, the last offset repeated)
    /// as the caller pads them; dx starts at random values and is added to.
    #[test]
    fn lane_input_grad_matches_float64() {
        on_each_engine!(lane_input_grad_matches_float64_on);
    }

    fn lane_input_grad_matches_float64_on<E: Engine>() {
        let mut rng = seeded(23);
        for s in [
            shape(20, (13, 13), 50, 5, 1, 0),
            shape(3, (11, 10), 7, 3, 2, 1),
        ] {
            let (hp, wp) = padded_dims(&s);
            let k = s.in_c * s.k_h * s.k_w;
            let kpad = k.div_ceil(E::R) * E::R;
            let pq = s.out_h() * s.out_w();
            let (mut taps, pixels) = lane_offsets(&s, E::LANES);
            taps.resize(kpad, *taps.last().unwrap());
            let w = uniform(&mut rng, s.out_c * k);
            let mut wpad = vec![0.0; s.out_c * kpad];
            for o in 0..s.out_c {
                wpad[o * kpad..o * kpad + k].copy_from_slice(&w[o * k..(o + 1) * k]);
            }
            let dy = uniform(&mut rng, s.out_c * pq * E::LANES);
            let dx0 = uniform(&mut rng, s.in_c * hp * wp * E::LANES);
            let mut dx = dx0.clone();
            lane_input_grad::<E>(&dy, &wpad, (&taps, &pixels), &mut dx);
            // float64: each element's starting value plus every (o, tap, pixel) landing on it.
            let mut want: Vec<f64> = dx0.iter().map(|&v| f64::from(v)).collect();
            let mut mag: Vec<f64> = want.iter().map(|v| v.abs()).collect();
            for o in 0..s.out_c {
                for t in 0..k {
                    for (p, &pixel) in pixels.iter().enumerate() {
                        for m in 0..E::LANES {
                            let term = f64::from(w[o * k + t])
                                * f64::from(dy[(o * pq + p) * E::LANES + m]);
                            want[taps[t] + pixel + m] += term;
                            mag[taps[t] + pixel + m] += term.abs();
                        }
                    }
                }
            }
            for (i, ((&got, &want), &mag)) in dx.iter().zip(&want).zip(&mag).enumerate() {
                assert_near::<E>(got, (want, mag), || format!("{s:?}: element {i}"));
            }
        }
    }

    /// The filter gradient per lane, then the lanes folded, against float64: conv2's shape
    /// (50 channels: 10 tiles of R) and an awkward one (padding, stride 2, 7 channels, 27
    /// taps), two sets of images summed as a chunk sums them, the second shape's sets short
    /// (two thirds of the lanes: the others zero in x and in dy, as the caller leaves them);
    /// the fold covers 25,000 and 189 sums.
    #[test]
    fn lane_filter_product_and_fold_match_float64() {
        on_each_engine!(lane_filter_product_and_fold_match_float64_on);
    }

    fn lane_filter_product_and_fold_match_float64_on<E: Engine>() {
        let mut rng = seeded(24);
        for (s, imgs) in [
            (shape(20, (13, 13), 50, 5, 1, 0), E::LANES),
            (shape(3, (11, 10), 7, 3, 2, 1), E::LANES * 2 / 3),
        ] {
            let image = s.in_c * s.in_h * s.in_w;
            let k = s.in_c * s.k_h * s.k_w;
            let pq = s.out_h() * s.out_w();
            let ld = s.out_c.div_ceil(E::R) * E::R;
            let (taps, pixels) = lane_offsets(&s, E::LANES);
            let xs: Vec<Vec<f32>> = (0..2).map(|_| uniform(&mut rng, imgs * image)).collect();
            let dys: Vec<Vec<f32>> = (0..2)
                .map(|_| {
                    let mut dy = vec![0.0f32; ld * pq * E::LANES];
                    for o in 0..s.out_c {
                        for p in 0..pq {
                            for m in 0..imgs {
                                dy[(o * pq + p) * E::LANES + m] = rng.gen_range(-1.0..1.0);
                            }
                        }
                    }
                    dy
                })
                .collect();
            let mut totals = vec![f32::NAN; ld * k * E::LANES];
            let mut images = LaneImages::default();
            for (set, (x, dy)) in xs.iter().zip(&dys).enumerate() {
                let windows = LaneWindows {
                    src: images.build::<E, f32>(&s, x, imgs, &mut Vec::new()),
                    pixels: &pixels,
                    taps: &taps,
                    block: pq,
                };
                lane_filter_product::<E>(&windows, dy, s.out_c, &mut totals, set > 0);
            }
            let mut dw = vec![f32::NAN; s.out_c * k];
            fold_lanes::<E>(&totals[..s.out_c * k * E::LANES], &mut dw);
            for o in 0..s.out_c {
                for t in 0..k {
                    let (mut want, mut mag) = (0.0f64, 0.0f64);
                    for (x, dy) in xs.iter().zip(&dys) {
                        for m in 0..imgs {
                            for p in 0..pq {
                                let Some(xv) = tap_input(&s, &x[m * image..], t, p) else {
                                    continue;
                                };
                                let t = f64::from(dy[(o * pq + p) * E::LANES + m]) * f64::from(xv);
                                want += t;
                                mag += t.abs();
                            }
                        }
                    }
                    let at = || format!("{s:?}: dw[{o}][tap {t}]");
                    assert_near::<E>(dw[o * k + t], (want, mag), at);
                }
            }
        }
    }

    /// Exactly the sums the docs promise: each output the taps' products multiply-added
    /// (fused where the engine fuses) in order from zero within blocks of 64 taps, the
    /// blocks' sums added in order (a scalar reference, compared bit for bit). conv2's
    /// shape, full lanes and a ragged group.
    /// [`transpose`] on both vectorized sides and the plain loops (rows short of the lanes,
    /// odd leading dimensions), into a poisoned `dst`: every value moved, no other touched.
    #[test]
    fn transpose_moves_every_value_and_no_other() {
        let mut rng = seeded(23);
        // (rows, cols, src_ld, dst_ld): rows into vectors (rows = dst_ld = 4, 8, 16), vectors
        // into rows (cols = src_ld), and the plain loops.
        let into = [(8, 13, 15, 8), (16, 81, 81, 16), (4, 1, 1, 4)];
        let from = [(13, 8, 8, 17), (81, 16, 16, 90), (5, 4, 4, 5)];
        let plain = [(3, 13, 14, 8), (8, 7, 9, 16), (7, 8, 9, 8)];
        for (rows, cols, src_ld, dst_ld) in into.into_iter().chain(from).chain(plain) {
            let src = uniform(&mut rng, (rows - 1) * src_ld + cols);
            let mut dst = vec![f32::NAN; (cols - 1) * dst_ld + rows + 3];
            transpose(&src, (src_ld, dst_ld), (rows, cols), &mut dst);
            for (i, got) in dst.iter().enumerate() {
                let (j, m) = (i / dst_ld, i % dst_ld);
                let want = if j < cols && m < rows {
                    src[m * src_ld + j]
                } else {
                    f32::NAN
                };
                let at = format!("{rows} x {cols} ({src_ld}, {dst_ld}): dst[{i}]");
                assert_eq!(got.to_bits(), want.to_bits(), "{at}");
            }
        }
    }

    #[test]
    fn lane_product_sums_blocks_of_taps_in_order() {
        on_each_engine!(lane_product_sums_blocks_of_taps_in_order_on);
    }

    fn lane_product_sums_blocks_of_taps_in_order_on<E: Engine>() {
        let mut rng = seeded(22);
        let s = shape(20, (13, 13), 50, 5, 1, 0);
        let (image, k, pq) = (20 * 169, 500, 81);
        for imgs in [E::LANES, E::LANES / 2 + 1] {
            let x = uniform(&mut rng, imgs * image);
            let w = uniform(&mut rng, s.out_c * k);
            let out = forward::<E>(&s, &x, &w, imgs, 64);
            let (taps, pixels) = lane_offsets(&s, 1);
            for m in 0..imgs {
                for o in 0..s.out_c {
                    let plane = (0..pq).map(|p| out[(o * pq + p) * E::LANES + m]);
                    for (p, got) in plane.enumerate() {
                        let mut total = 0.0f32;
                        for (b, block) in taps.chunks(64).enumerate() {
                            let mut acc = 0.0f32;
                            for (t, tap) in block.iter().enumerate() {
                                let xv = x[m * image + pixels[p] + tap];
                                let wv = w[o * k + b * 64 + t];
                                acc = if E::FUSED {
                                    xv.mul_add(wv, acc)
                                } else {
                                    xv * wv + acc
                                };
                            }
                            total = if b == 0 { acc } else { total + acc };
                        }
                        assert_eq!(
                            got.to_bits(),
                            total.to_bits(),
                            "{}: {imgs} images: image {m} channel {o} pixel {p}",
                            E::KIND.name()
                        );
                    }
                }
            }
        }
    }
}
