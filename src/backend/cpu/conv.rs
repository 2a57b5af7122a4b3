//! The convolutions' drivers: groups of images per rayon task, the products on the engines,
//! the epilogues (bias, ReLU, pool) and the fixed order of the sums.
//!
//! From [`WINDOW_TAPS`] taps on (conv2), f32 and widened products run with a group of images
//! in the lanes of the process's engine ([`lanes`]: the im2col matrix never formed,
//! `col[tap][pixel]` read as `images[tap offset + pixel offset]`); below it (conv1's 9
//! taps) im2col is written out and multiplied on the GEMM tiles ([`microkernel`]). bf16 on
//! a CPU with AMX, or an AMD CPU with AVX512-BF16, takes a pair engine ([`super::pairs`]):
//! the window products ([`PairOperand`]) by pairs of adjacent taps or pixels, the input
//! gradient ([`gemm_amx`], [`gemm_bf16`]) by pairs of output channels. The filter gradient
//! sums images in fixed chunks and then the chunks as a binary tree (`summation`), so the
//! result does not depend on the thread count and its rounding error grows like log(batch).

use rayon::prelude::*;

use crate::backend::shapes::{Conv2dShape, Pool2dShape};
use crate::backend::Precision;

use super::engine::{with_engine, Engine};
use super::half_convert::{narrow_bf16, narrow_epilogue};
use super::isa::isa;
use super::lanes::{
    fold_lanes, lane_filter_product, lane_input_grad, lane_product, padded_dims, padded_runs,
    transpose, LaneFilter, LaneImages, LaneWindows, Lines,
};
use super::microkernel::{add_windows, gemm, gemm_nt, PackedA};
use super::pairs::{
    gemm_amx, gemm_bf16, pairs, PairImage, PairOperand, PairPanels, PairRows, PairRowsA,
    PairWindows,
};
use super::pool::{avg_plane, relu_pool_backward};
use super::summation::{pairwise_sum, Cascade};
use super::{pair_bits, widened, with_kept, write_f32};

/// Images per GEMM: a group's taps side by side make the column dimension long (one 13x13
/// image alone gives conv2 only 81 columns, two and a half register tiles).
const GROUP: usize = 8;

/// Taps from which the products read the images in place ([`lanes`], or the bf16 pair
/// products). Below it the im2col matrix is small (conv1's 9 rows)
/// and im2col with the GEMM tiles is faster.
const WINDOW_TAPS: usize = 64;

/// Taps summed in registers before they join a forward output's running total (see
/// [`LaneWindows::block`]): conv2's 500 taps in eight blocks. A sum of K terms in one chain
/// carries each rounding error through all later additions (error growing like K); in
/// blocks, like block + K / block. The forward's error decides which ReLU inputs near zero
/// float32 sends the other way than float64 (tools/torch_crosscheck.py counts them; 64 is
/// where that count met PyTorch float32's: docs/cpu-backend.md).
const FORWARD_BLOCK: usize = 64;

/// Images per partial sum of the filter gradient (groups of [`GROUP`] accumulated in order);
/// the partials are then added as a tree, so the result does not depend on the thread count.
const FILTER_CHUNK: usize = 4 * GROUP;

/// Each tap's offset in a (padded) image: (c, i, j) at c·H·W + i·W + j, in the filter's
/// order. With [`pixel_offsets`], `images[pixel + tap]` is the im2col matrix's element,
/// which the window products read in place.
fn tap_offsets(s: &Conv2dShape) -> Vec<usize> {
    let (hp, wp) = padded_dims(s);
    let mut taps = Vec::with_capacity(s.in_c * s.k_h * s.k_w);
    for c in 0..s.in_c {
        for i in 0..s.k_h {
            taps.extend((0..s.k_w).map(|j| c * hp * wp + i * wp + j));
        }
    }
    taps
}

/// Each output pixel's window offset in a group of `imgs` (padded) images: (m, p, q) at
/// m·C·H·W + p·stride·W + q·stride. A shorter group uses a prefix.
fn pixel_offsets(s: &Conv2dShape, imgs: usize) -> Vec<usize> {
    let (hp, wp) = padded_dims(s);
    let mut pixels = Vec::with_capacity(imgs * s.out_h() * s.out_w());
    for m in 0..imgs {
        for p in 0..s.out_h() {
            let row = m * s.in_c * hp * wp + p * s.stride * wp;
            pixels.extend((0..s.out_w()).map(|q| row + q * s.stride));
        }
    }
    pixels
}

/// [`tap_offsets`] and one image's [`pixel_offsets`] in [`lanes`]' layout (each element a
/// vector of `lanes` images).
pub(super) fn lane_offsets(s: &Conv2dShape, lanes: usize) -> (Vec<usize>, Vec<usize>) {
    let scale = |v: Vec<usize>| v.into_iter().map(|o| o * lanes).collect();
    (scale(tap_offsets(s)), scale(pixel_offsets(s, 1)))
}

/// The offsets (taps, and a [`GROUP`]'s pixels) that make a group's im2col matrix implicit,
/// when the convolution has [`WINDOW_TAPS`] taps or more (else None: im2col is written out).
fn window_offsets(s: &Conv2dShape) -> Option<(Vec<usize>, Vec<usize>)> {
    (s.in_c * s.k_h * s.k_w >= WINDOW_TAPS).then(|| (tap_offsets(s), pixel_offsets(s, GROUP)))
}

/// Writes the im2col matrix of images `first..first + imgs` of x into `col` (K rows of
/// imgs·PQ), `image` holding one image in f32 (padded where the convolution pads).
fn im2col_group<T: Precision>(
    s: &Conv2dShape,
    x: &[T],
    (first, imgs): (usize, usize),
    col: &mut Vec<f32>,
    image: &mut Vec<f32>,
) {
    let (pq, image_in) = (s.out_h() * s.out_w(), s.in_c * s.in_h * s.in_w);
    let npq = imgs * pq;
    col.resize(s.in_c * s.k_h * s.k_w * npq, 0.0);
    for m in 0..imgs {
        let x_n = &x[(first + m) * image_in..][..image_in];
        let x_n = match s.pad {
            0 => widened(x_n, image),
            _ => padded_group(s, x_n, image, |src, dst| T::widen_slice(src, dst)),
        };
        im2col(s, x_n, col, npq, m * pq);
    }
}

/// Images `first..first + imgs` of bf16 x as bit patterns, zero-padded into `buf` when the
/// convolution pads: what [`PairImage`] pairs up for the bf16 window product.
fn group_bits<'a>(
    s: &Conv2dShape,
    x: &'a [u16],
    (first, imgs): (usize, usize),
    buf: &'a mut Vec<u16>,
) -> &'a [u16] {
    let image_in = s.in_c * s.in_h * s.in_w;
    let x = &x[first * image_in..(first + imgs) * image_in];
    if s.pad == 0 {
        return x;
    }
    padded_group(s, x, buf, |src, dst| dst.copy_from_slice(src))
}

/// A group of images `x` (planes of in_h x in_w) zero-padded into `buf` (planes of the
/// padded dimensions), each row moved by `copy(src, dst)`.
fn padded_group<'a, S, D: Copy + Default>(
    s: &Conv2dShape,
    x: &[S],
    buf: &'a mut Vec<D>,
    copy: impl Fn(&[S], &mut [D]),
) -> &'a [D] {
    let (hp, wp) = padded_dims(s);
    let planes = x.len().checked_div(s.in_h * s.in_w).unwrap_or(0);
    buf.clear();
    buf.resize(planes * hp * wp, D::default());
    if s.in_h > 0 && s.in_w > 0 {
        for (plane, src) in x.chunks_exact(s.in_h * s.in_w).enumerate() {
            for [at, from, n] in padded_runs(s, plane, 1) {
                copy(&src[from..from + n], &mut buf[at..at + n]);
            }
        }
    }
    buf
}

/// Writes image `x`'s taps into `col` ((C·KH·KW) rows of stride `ld`), starting at column
/// `off`: row (c, i, j), column p·Q + q holds x[c][p·stride + i][q·stride + j], x given with
/// its padding (planes of [`padded_dims`]). A row of taps at stride 1 is a copy.
fn im2col(s: &Conv2dShape, x: &[f32], col: &mut [f32], ld: usize, off: usize) {
    let (p_n, q_n, wp) = (s.out_h(), s.out_w(), padded_dims(s).1);
    if p_n * q_n == 0 {
        return;
    }
    for (row, tap) in tap_offsets(s).into_iter().enumerate() {
        let taps = col[row * ld + off..][..p_n * q_n].chunks_exact_mut(q_n);
        for (p, dst) in taps.enumerate() {
            let src = &x[tap + p * s.stride * wp..];
            if s.stride == 1 {
                dst.copy_from_slice(&src[..q_n]);
            } else {
                dst.iter_mut()
                    .zip(src.iter().step_by(s.stride))
                    .for_each(|(d, v)| *d = *v);
            }
        }
    }
}

/// Writes the image gradient `acc` (C x H x W) from the taps in `dcol` (rows of stride `ld`,
/// this image's columns from `off`): each element the sum of the taps that read it, in the
/// order kernel rows, then columns (zero where none does), the transpose of [`im2col`]. A
/// padded convolution sums into a padded copy (allocated here: LeNet's convolutions do not
/// pad), then drops the padding.
fn col2im(s: &Conv2dShape, dcol: &[f32], ld: usize, off: usize, acc: &mut [f32]) {
    let (p_n, q_n) = (s.out_h(), s.out_w());
    let (hp, wp) = padded_dims(s);
    let mut padded = Vec::new();
    let planes = match s.pad {
        0 => &mut *acc,
        _ => {
            padded.resize(s.in_c * hp * wp, 0.0);
            &mut padded[..]
        }
    };
    // At stride 1 each plane's rows are all written by `add_windows` (the last window ends
    // at the last row), so nothing is cleared first.
    let cover = s.stride == 1 && p_n > 0 && q_n > 0 && p_n + s.k_h - 1 == hp;
    if !cover {
        planes.fill(0.0);
    }
    if p_n * q_n > 0 {
        for (c, plane) in planes.chunks_exact_mut(hp * wp).enumerate() {
            let src = &dcol[c * s.k_h * s.k_w * ld + off..];
            let shape = ((s.k_h, s.k_w), (p_n, q_n), s.stride);
            add_windows(plane, wp, src, ld, shape, cover);
        }
    }
    if s.pad > 0 {
        for (row, dst) in acc.chunks_exact_mut(s.in_w.max(1)).enumerate() {
            let (c, h) = (row / s.in_h, row % s.in_h);
            dst.copy_from_slice(&padded[(c * hp + h + s.pad) * wp + s.pad..][..s.in_w]);
        }
    }
}

/// Where a convolution's output gradient comes from.
pub(super) enum OutputGrad<'a, T> {
    /// The gradient itself (batch x O x P x Q).
    Tensor(&'a [T]),
    /// Through the ReLU and average pool that followed the convolution: the gradient is
    /// `(y > 0) ⊙ avg_pool_backward(d_pooled)`, computed a group at a time where it is used
    /// instead of written to memory and read back.
    Pooled {
        /// The pool after the convolution.
        pool: &'a Pool2dShape,
        /// The gradient at the pool's output.
        d_pooled: &'a [T],
        /// The ReLU's output (the convolution's output as stored).
        y: &'a [T],
    },
}

/// The forward's driver: y in groups of `group` images, a rayon task each, with the pooled
/// output split alike; each group's sums from `product(state, (first, imgs), out)` (`state`
/// and `out` kept per thread, [`with_kept`]), plane (m, o) at `out[at(imgs, m, o)..]`; then
/// [`write_outputs`].
#[allow(clippy::type_complexity)]
fn forward_groups<T: Precision, S: Default + 'static>(
    s: &Conv2dShape,
    (bias, relu, pool): (Option<&[f32]>, bool, Option<(&Pool2dShape, &mut [T])>),
    y: &mut [T],
    group: usize,
    at: impl Fn(usize, usize, usize) -> usize + Sync,
    product: impl Fn(&mut S, (usize, usize), &mut Vec<f32>) + Sync,
) {
    let image_out = s.out_c * s.out_h() * s.out_w();
    let (pool, pooled): (_, Vec<Option<&mut [T]>>) = match pool {
        Some((p, pooled)) => {
            let chunk = s.out_c * p.out_h() * p.out_w() * group;
            (Some(p), pooled.chunks_mut(chunk).map(Some).collect())
        }
        None => (None, (0..s.batch.div_ceil(group)).map(|_| None).collect()),
    };
    y.par_chunks_mut(image_out * group)
        .zip(pooled)
        .enumerate()
        .for_each(|(g, (y_g, pooled_g))| {
            with_kept(|(state, out, scratch): &mut (S, Vec<f32>, _)| {
                let imgs = y_g.len() / image_out;
                product(state, (g * group, imgs), out);
                let sums = (&out[..], |m, o| at(imgs, m, o));
                write_outputs(s, (bias, relu, pool), (y_g, pooled_g), sums, scratch);
            })
        });
}

/// The forward's epilogue for one group: each image m's plane o of y is the sums from
/// `at(m, o)` plus the bias, through the ReLU when asked, and with a pool also
/// average-pooled from the f32 values. For half storage each plane is computed in f32 in
/// `wide` (and `wide_pooled`), which stay in the L1 cache, and rounded into y (and the
/// pooled output) plane by plane.
fn write_outputs<T: Precision>(
    s: &Conv2dShape,
    (bias, relu, pool): (Option<&[f32]>, bool, Option<&Pool2dShape>),
    (y_g, pooled_g): (&mut [T], Option<&mut [T]>),
    (sums, at): (&[f32], impl Fn(usize, usize) -> usize),
    [wide, wide_pooled]: &mut [Vec<f32>; 2],
) {
    let pq = s.out_h() * s.out_w();
    let pooled_len = pool.map_or(1, |p| p.out_h() * p.out_w());
    let mut pooled_planes = pooled_g.map(|p| p.chunks_mut(pooled_len));
    for (i, dst) in y_g.chunks_mut(pq).enumerate() {
        let (m, o) = (i / s.out_c, i % s.out_c);
        let src = &sums[at(m, o)..][..pq];
        let b = bias.map_or(0.0, |b| b[o]);
        let values = match narrow_epilogue(src, (b, relu), wide, dst) {
            true => &wide[..],
            false => write_f32(dst, wide, |dst| add_bias_relu(src, b, relu, dst)),
        };
        if let (Some(p), Some(out)) = (pool, pooled_planes.as_mut().and_then(Iterator::next)) {
            write_f32(out, wide_pooled, |out| avg_plane(p, values, out));
        }
    }
}

/// [`forward`] with the images in the lanes of engine E ([`lanes`]): the f32 and widened
/// products of convolutions with [`WINDOW_TAPS`] taps or more: the taps summed in
/// blocks of [`FORWARD_BLOCK`], in order.
#[allow(clippy::type_complexity)]
fn forward_lanes<E: Engine, T: Precision>(
    s: &Conv2dShape,
    x: &[T],
    w: &[T],
    epilogue: (Option<&[f32]>, bool, Option<(&Pool2dShape, &mut [T])>),
    y: &mut [T],
) {
    let (k, pq) = (s.in_c * s.k_h * s.k_w, s.out_h() * s.out_w());
    let image_in = s.in_c * s.in_h * s.in_w;
    let filter = LaneFilter::<E>::pack(widened(w, &mut Vec::new()), s.out_c, k);
    let (taps, pixels) = lane_offsets(s, E::LANES);
    // The images' planes, [imgs][O][PQ], from `lane_product`'s layout, [O][PQ][LANES].
    let at = |_, m, o| (m * s.out_c + o) * pq;
    forward_groups(s, epilogue, y, E::LANES, at, |state, (first, imgs), out| {
        let (images, wide, sums): &mut (LaneImages, Vec<f32>, Lines) = state;
        let sums = sums.resized(filter.ld() * pq * E::LANES);
        let windows = LaneWindows {
            src: images.build::<E, T>(s, &x[first * image_in..][..imgs * image_in], imgs, wide),
            pixels: &pixels,
            taps: &taps,
            block: FORWARD_BLOCK,
        };
        lane_product(&windows, &filter, sums);
        out.resize(imgs * s.out_c * pq, 0.0);
        let lds = (E::LANES, s.out_c * pq);
        for (o, sums) in sums.chunks_exact(pq * E::LANES).take(s.out_c).enumerate() {
            transpose(sums, lds, (pq, imgs), &mut out[o * pq..]);
        }
    });
}

/// Gathers a group's output gradients (images `first..first + imgs`, each O x PQ) into O rows
/// of `imgs·PQ` (f32, `dst` resized to fit); half values are widened a group at a time into
/// `tmp`'s buffers.
fn gather_dy<T: Precision>(
    dy: &OutputGrad<T>,
    (first, imgs): (usize, usize),
    (out_c, pq): (usize, usize),
    dst: &mut Vec<f32>,
    [tmp, tmp_act]: &mut [Vec<f32>; 2],
) {
    let (npq, planes) = (imgs * pq, first * out_c..(first + imgs) * out_c);
    dst.resize(out_c * npq, 0.0);
    let row = |i: usize| (i % out_c) * npq + (i / out_c) * pq;
    match dy {
        OutputGrad::Tensor(dy) => {
            let src = widened(&dy[planes.start * pq..planes.end * pq], tmp);
            for (i, plane) in src.chunks(pq).enumerate() {
                dst[row(i)..][..pq].copy_from_slice(plane);
            }
        }
        OutputGrad::Pooled { pool, d_pooled, y } => {
            let pooled = pool.out_h() * pool.out_w();
            let g = widened(&d_pooled[planes.start * pooled..planes.end * pooled], tmp);
            let y = &y[planes.start * pq..planes.end * pq];
            for (i, (g, y)) in g.chunks(pooled).zip(y.chunks(pq)).enumerate() {
                relu_pool_backward(pool, g, y, tmp_act, &mut dst[row(i)..][..pq]);
            }
        }
    }
}

/// Body of [`add_bias_relu`].
#[inline(always)]
fn add_bias_relu_body(src: &[f32], bias: f32, relu: bool, dst: &mut [f32]) {
    for (d, v) in dst.iter_mut().zip(src) {
        let v = v + bias;
        *d = if relu { v.max(0.0) } else { v };
    }
}

super::engine::multiversion!(
    /// `dst = src + bias`, through a ReLU if `relu` (the forward's epilogue, which writes
    /// every output element once: vectorized for the process's engine).
    fn add_bias_relu(src: &[f32], bias: f32, relu: bool, dst: &mut [f32]) = add_bias_relu_body
);

/// `y = conv(x, w) + bias` (ReLU'd if `relu`); with `pool`, each plane of y is also
/// average-pooled into the pooled output while it is in cache (from the f32 values).
pub(super) fn forward<T: Precision>(
    s: &Conv2dShape,
    x: &[T],
    w: &[T],
    bias: Option<&[f32]>,
    y: &mut [T],
    relu: bool,
    pool: Option<(&Pool2dShape, &mut [T])>,
) {
    let (k, pq) = (s.in_c * s.k_h * s.k_w, s.out_h() * s.out_w());
    if s.out_c * pq == 0 {
        return;
    }
    // y_group (O x imgs·PQ) = w (O x K) · col (K x imgs·PQ), col read from the images
    // (the lanes, or the bf16 pairs) or written out (im2col, GEMM tile).
    let offsets = window_offsets(s);
    if offsets.is_some() && pair_bits(x).is_none() {
        return with_engine!(E => forward_lanes::<E, T>(s, x, w, (bias, relu, pool), y));
    }
    let mut w_packed = PackedA::default();
    // bf16 on AMX or AVX512-BF16: the window product on the bf16 values themselves, by pairs
    // of taps.
    let bf16 = offsets.as_ref().zip(pair_bits(x)).zip(pair_bits(w));
    let mut w_pairs = PairOperand::default();
    let tap_pairs = match bf16 {
        Some((((taps, _), _), w_bits)) => {
            let grouped = pairs(taps);
            w_pairs.pack(w_bits, s.out_c, k, &grouped);
            grouped
        }
        None => {
            w_packed.pack(widened(w, &mut Vec::new()), s.out_c, k, k, 1);
            Vec::new()
        }
    };
    // The GEMM's layout, [O][imgs·PQ].
    let at = |imgs, m, o| o * imgs * pq + m * pq;
    forward_groups(
        s,
        (bias, relu, pool),
        y,
        GROUP,
        at,
        |state, (first, imgs), out| {
            let (images, col, bits, image_pairs): &mut (_, _, _, PairImage) = state;
            let npq = imgs * pq;
            out.resize(s.out_c * pq * GROUP, 0.0);
            if let Some((((_, pixels), x_bits), _)) = bf16 {
                let col = PairWindows {
                    src: image_pairs.build(group_bits(s, x_bits, (first, imgs), bits)),
                    rows: &pixels[..npq],
                    pairs: &tap_pairs,
                    block: FORWARD_BLOCK / 2,
                };
                w_pairs.product(&col, out, npq, false);
            } else {
                im2col_group(s, x, (first, imgs), col, images);
                gemm(&w_packed, col, npq, npq, out, npq, false);
            }
        },
    );
}

/// The filter transposed, as the input gradient's product `dcol = wᵀ · dy` takes it.
enum FilterT {
    /// Packed for the f32 GEMM tile.
    F32(PackedA),
    /// bf16 on AVX512-BF16: packed by pairs of output channels for [`gemm_bf16`], dy then
    /// rounded to bf16 (it is bf16 already, or formed from bf16 values as `backward`
    /// describes) and packed alike.
    Bf16(PairPanels),
    /// bf16 on AMX: rows of taps by pairs of output channels for [`gemm_amx`], dy rounded
    /// and packed as for `Bf16`.
    Amx(PairRowsA),
}

impl FilterT {
    fn new<T: Precision>(s: &Conv2dShape, w: &[T]) -> Self {
        let k = s.in_c * s.k_h * s.k_w;
        // Packing dy is one pass per group, paid back over many taps (conv2's 500), not
        // over conv1's 9.
        let bits = pair_bits(w).filter(|_| k >= WINDOW_TAPS);
        if let Some(bits) = bits.filter(|_| isa().amx) {
            let mut packed = PairRowsA::default();
            packed.pack(k, s.out_c, |tap, o| bits[o * k + tap]);
            return FilterT::Amx(packed);
        }
        if let Some(bits) = bits {
            let mut packed = PairPanels::default();
            packed.pack(k, s.out_c, |tap, o| bits[o * k + tap]);
            return FilterT::Bf16(packed);
        }
        let mut packed = PackedA::default();
        packed.pack(widened(w, &mut Vec::new()), k, s.out_c, 1, k);
        FilterT::F32(packed)
    }
}

/// The input gradient with the images in the lanes of engine E ([`lane_input_grad`]): for
/// convolutions with [`WINDOW_TAPS`] taps or more whose products run in f32. Replaces the
/// GEMM tile's `wᵀ · dy` and col2im: full lanes, and the sums go straight into dx.
struct LaneInput<E> {
    /// The filter (O x K) widened, taps padded with zeros to a multiple of `E::R`.
    w: Vec<f32>,
    /// Tap offsets in the lanes layout (the last repeated over the padding taps).
    taps: Vec<usize>,
    /// Output pixels' offsets in the lanes layout.
    pixels: Vec<usize>,
    engine: std::marker::PhantomData<E>,
}

impl<E: Engine> LaneInput<E> {
    fn new<T: Precision>(s: &Conv2dShape, w: &[T]) -> Self {
        let k = s.in_c * s.k_h * s.k_w;
        let (mut wide, kpad) = (Vec::new(), k.div_ceil(E::R) * E::R);
        let w = widened(w, &mut wide);
        let mut padded = vec![0.0; s.out_c * kpad];
        for (o, src) in w.chunks_exact(k.max(1)).enumerate() {
            padded[o * kpad..][..k].copy_from_slice(src);
        }
        let (mut taps, pixels) = lane_offsets(s, E::LANES);
        let last = taps.last().copied().unwrap_or(0);
        taps.resize(kpad, last);
        Self {
            w: padded,
            taps,
            pixels,
            engine: std::marker::PhantomData,
        }
    }

    /// The input gradient of `imgs` ≤ `E::LANES` images from their dy in lanes
    /// (`[O][PQ][LANES]`) into `dx` (imgs x C x H x W); `dx_lanes` and
    /// `plane` are scratch.
    fn input_grad<T: Precision>(
        &self,
        s: &Conv2dShape,
        dy_lanes: &[f32],
        dx_lanes: &mut Lines,
        plane: &mut Vec<f32>,
        dx: &mut [T],
    ) {
        let (hp, wp) = padded_dims(s);
        let hw = s.in_h * s.in_w;
        let dx_lanes = dx_lanes.resized(s.in_c * hp * wp * E::LANES);
        dx_lanes.fill(0.0);
        lane_input_grad::<E>(dy_lanes, &self.w, (&self.taps, &self.pixels), dx_lanes);
        let (image, imgs) = (s.in_c * hw, dx.len() / (s.in_c * hw).max(1));
        write_f32(dx, plane, |d| {
            for c in 0..s.in_c {
                for [at, from, n] in padded_runs(s, c, E::LANES) {
                    let dst = &mut d[c * hw + from..];
                    transpose(&dx_lanes[at..], (E::LANES, image), (n, imgs), dst);
                }
            }
        });
    }
}

/// One group's input gradient from its gathered output gradient `dyg` (O x imgs·PQ):
/// `dcol = wᵀ · dyg` (resized to fit), then col2im into each image of `dx_group` (imgs x C x
/// H x W); `dy_pairs` holds dyg packed for the bf16 product, `scratch` one image in f32.
fn input_grad_group<T: Precision>(
    s: &Conv2dShape,
    w_t: &FilterT,
    dyg: &[f32],
    (dcol, dy_pairs): (&mut Vec<f32>, &mut PairRows),
    dx_group: &mut [T],
    scratch: &mut Vec<f32>,
) {
    let (pq, image_in) = (s.out_h() * s.out_w(), s.in_c * s.in_h * s.in_w);
    let npq = dx_group.len() / image_in * pq;
    dcol.resize(s.in_c * s.k_h * s.k_w * npq, 0.0);
    match w_t {
        FilterT::F32(w_t) => gemm(w_t, dyg, npq, npq, dcol, npq, false),
        FilterT::Bf16(w_t) => {
            dy_pairs.pack_f32(dyg, s.out_c, npq, npq);
            gemm_bf16(w_t, dy_pairs, dcol, npq, false);
        }
        FilterT::Amx(w_t) => {
            dy_pairs.pack_f32(dyg, s.out_c, npq, npq);
            gemm_amx(w_t, dy_pairs, dcol, npq, false);
        }
    }
    for (m, dx_n) in dx_group.chunks_mut(image_in).enumerate() {
        write_f32(dx_n, scratch, |acc| col2im(s, dcol, npq, m * pq, acc));
    }
}

/// A thread's buffers in [`backward`] ([`with_kept`]), each sized where it is filled: f32
/// (im2col's image and columns, dy gathered, one image of dx, dcol), [`gather_dy`]'s, the
/// bf16 products' (dy's bits, x's bits, dy packed, x's pairs), and dy packed for the input
/// gradient's bf16 GEMM.
type BackwardScratch = (
    [Vec<f32>; 5],
    [Vec<f32>; 2],
    (Vec<u16>, Vec<u16>, PairOperand, PairImage),
    PairRows,
);

/// The convolution's backward from dy, in one pass: with `filter` (x, dw) the filter
/// gradient, with `db` the bias gradient, with `input` (the filter w, dx) the input
/// gradient, all from the same gathered rows of dy (each group of images gathers dy once and
/// uses it while it is in cache).
pub(super) fn backward<T: Precision>(
    s: &Conv2dShape,
    dy: OutputGrad<T>,
    filter: Option<(&[T], &mut [f32])>,
    db: Option<&mut [f32]>,
    input: Option<(&[T], &mut [T])>,
) {
    let k = s.in_c * s.k_h * s.k_w;
    let pq = s.out_h() * s.out_w();
    let image_in = s.in_c * s.in_h * s.in_w;
    let chunk_count = s.batch.div_ceil(FILTER_CHUNK);
    // dw = Σ_groups dy_group (O x imgs·PQ) · col_groupᵀ (imgs·PQ x K), colᵀ read from the
    // images (taps as rows, pixels as steps) and dy transposed to pixel-major.
    // dcol_group = wᵀ (K x O) · dy_group, then col2im, for the input gradient.
    let (x, dw) = match filter {
        Some((x, dw)) => (x, Some(dw)),
        None => (&[][..], None),
    };
    let (with_filter, with_bias) = (dw.is_some(), db.is_some());
    // The chunks' partials, added as a tree: their number grows with the batch.
    let add_chunks = |chunks: Vec<(Vec<f32>, Vec<f32>)>| {
        let (filters, biases): (Vec<_>, Vec<_>) = chunks.into_iter().unzip();
        if let Some(dw) = dw {
            Cascade::sum_into(filters, dw);
        }
        if let Some(db) = db {
            Cascade::sum_into(biases, db);
        }
    };
    let offsets = window_offsets(s);
    // With the images in the lanes ([`filter_chunks_lanes`]) the input gradient is
    // [`LaneInput`]'s, else FilterT's.
    let in_lanes = offsets.is_some() && pair_bits(x).is_none();
    let (w, dx_chunks): (_, Vec<Option<&mut [T]>>) = match input {
        Some((w, dx)) if image_in > 0 => {
            let chunks = dx.chunks_mut(image_in * FILTER_CHUNK).map(Some).collect();
            (Some(w), chunks)
        }
        _ => (None, (0..chunk_count).map(|_| None).collect()),
    };
    if in_lanes {
        let chunks = with_engine!(E => {
            let lane_input = w.map(|w| LaneInput::<E>::new(s, w));
            let sums = (with_filter, with_bias);
            filter_chunks_lanes(s, x, &dy, lane_input.as_ref(), dx_chunks, sums)
        });
        return add_chunks(chunks);
    }
    let w_t = w.map(|w| FilterT::new(s, w));
    // bf16 on AMX or AVX512-BF16: the window product on x's bf16 values and dy rounded to bf16, by
    // pairs of adjacent pixels. dy is bf16 already, or formed here from the pool's bf16
    // gradient (a multiply by 1/4 under LeNet's 2x2 pool: exact); any other pool's rounding is
    // the one the unfused ops make when they store the convolution's output gradient.
    let bf16 = offsets.as_ref().zip(pair_bits(x)).filter(|_| with_filter);
    let chunks: Vec<(Vec<f32>, Vec<f32>)> = dx_chunks
        .into_par_iter()
        .enumerate()
        .map(|(chunk, mut dx_chunk)| {
            with_kept(|scratch: &mut BackwardScratch| {
                let (f32s, tmp, (dy_bits, bits, dy_pairs, image_pairs), dy_rows) = scratch;
                let [images, col, dyg, image, dcol] = f32s;
                let mut partial = vec![0.0f32; if with_filter { s.out_c * k } else { 0 }];
                let mut partial_bias = vec![0.0f32; if with_bias { s.out_c } else { 0 }];
                let start = chunk * FILTER_CHUNK;
                let end = s.batch.min(start + FILTER_CHUNK);
                for (nth, first) in (start..end).step_by(GROUP).enumerate() {
                    let imgs = GROUP.min(end - first);
                    let npq = imgs * pq;
                    gather_dy(&dy, (first, imgs), (s.out_c, pq), dyg, tmp);
                    if let Some(((taps, pixels), x_bits)) = bf16 {
                        let pixel_pairs = pairs(&pixels[..npq]);
                        dy_bits.resize(s.out_c * npq, 0);
                        narrow_bf16(&dyg[..s.out_c * npq], bytemuck::cast_slice_mut(dy_bits));
                        dy_pairs.pack(dy_bits, s.out_c, npq, &pixel_pairs);
                        // One block per group, as below.
                        let col_t = PairWindows {
                            src: image_pairs.build(group_bits(s, x_bits, (first, imgs), bits)),
                            rows: taps,
                            pairs: &pixel_pairs,
                            block: pixel_pairs.len(),
                        };
                        dy_pairs.product(&col_t, &mut partial, k, nth > 0);
                    } else if with_filter {
                        // Dot products along the pixels, which dy and the columns both hold
                        // contiguously: nothing transposed.
                        im2col_group(s, x, (first, imgs), col, images);
                        let (dy, col) = ((&dyg[..], npq, s.out_c), (&col[..], npq, k));
                        gemm_nt(dy, col, npq, (&mut partial, k), nth > 0);
                    }
                    for (o, b) in partial_bias.iter_mut().enumerate() {
                        *b += lane_sum(&dyg[o * npq..(o + 1) * npq]);
                    }
                    if let (Some(w_t), Some(dx_chunk)) = (&w_t, dx_chunk.as_deref_mut()) {
                        let at = (first - start) * image_in;
                        let dx_group = &mut dx_chunk[at..at + imgs * image_in];
                        input_grad_group(s, w_t, dyg, (dcol, dy_rows), dx_group, image);
                    }
                }
                (partial, partial_bias)
            })
        })
        .collect();
    add_chunks(chunks);
}

/// A thread's buffers in [`filter_chunks_lanes`] ([`with_kept`]): the images in the lanes;
/// f32 (a channel widened, dy gathered, one image of dx); [`gather_dy`]'s; dy in the lanes,
/// the filter gradient's running sums, dx in the lanes.
type LaneScratch = (LaneImages, [Vec<f32>; 3], [Vec<f32>; 2], [Lines; 3]);

/// [`backward`]'s chunks with the images in the lanes of engine E ([`lanes`]), for the f32
/// and widened products with [`WINDOW_TAPS`] taps or more: each chunk's filter gradient (O
/// x K) and bias gradient (each empty unless `(filter, bias)` asks for it), and with
/// `lane_input` its input gradient written into the chunk of dx. dy is gathered and its bias
/// sums taken per [`GROUP`] of images as in `backward` (the same bits), then put into the
/// lanes, where the filter gradient ([`lane_filter_product`]: each image's pixels summed in
/// its own lane, the chunk's sets of `E::LANES` in order, then the lanes as a fixed tree,
/// [`fold_lanes`]) and the input gradient ([`LaneInput`]) read it.
fn filter_chunks_lanes<E: Engine, T: Precision>(
    s: &Conv2dShape,
    x: &[T],
    dy: &OutputGrad<T>,
    lane_input: Option<&LaneInput<E>>,
    dx_chunks: Vec<Option<&mut [T]>>,
    (with_filter, with_bias): (bool, bool),
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let lanes = E::LANES;
    let k = s.in_c * s.k_h * s.k_w;
    let pq = s.out_h() * s.out_w();
    let image_in = s.in_c * s.in_h * s.in_w;
    let ld = s.out_c.div_ceil(E::R) * E::R;
    let (taps, pixels) = lane_offsets(s, lanes);
    dx_chunks
        .into_par_iter()
        .enumerate()
        .map(|(chunk, mut dx_chunk)| {
            with_kept(|scratch: &mut LaneScratch| {
                let (images, [wide, dyg, plane], tmp, [dy_lanes, totals, dx_lanes]) = scratch;
                // dy's lanes: channels past O zero (a kept buffer holds another call's).
                let dy_lanes = dy_lanes.resized(ld * pq * lanes);
                dy_lanes[s.out_c * pq * lanes..].fill(0.0);
                let totals = totals.resized(if with_filter { ld * k * lanes } else { 0 });
                let mut partial_bias = vec![0.0f32; if with_bias { s.out_c } else { 0 }];
                let start = chunk * FILTER_CHUNK;
                let end = s.batch.min(start + FILTER_CHUNK);
                // Groups of GROUP images (fewer where the lanes are fewer), so a group
                // never straddles two sets.
                let group = GROUP.min(lanes);
                for first in (start..end).step_by(group) {
                    let imgs = group.min(end - first);
                    let npq = imgs * pq;
                    gather_dy(dy, (first, imgs), (s.out_c, pq), dyg, tmp);
                    for (o, b) in partial_bias.iter_mut().enumerate() {
                        *b += lane_sum(&dyg[o * npq..(o + 1) * npq]);
                    }
                    // Sets of `lanes` images from the chunk's start; a short last set's
                    // other lanes must be zero (x's are, and a stale infinity times zero is
                    // NaN).
                    let lane0 = (first - start) % lanes;
                    let set_first = first - lane0;
                    let set = lanes.min(end - set_first);
                    if lane0 == 0 && set < lanes {
                        dy_lanes.fill(0.0);
                    }
                    let rows = dyg.chunks_exact(npq).take(s.out_c);
                    for (src, dst) in rows.zip(dy_lanes.chunks_exact_mut(pq * lanes)) {
                        transpose(src, (pq, lanes), (imgs, pq), &mut dst[lane0..]);
                    }
                    if lane0 + imgs < set {
                        continue;
                    }
                    if let (Some(lanes), Some(dx_chunk)) = (lane_input, dx_chunk.as_deref_mut()) {
                        let at = (set_first - start) * image_in;
                        let dx = &mut dx_chunk[at..at + set * image_in];
                        lanes.input_grad(s, dy_lanes, dx_lanes, plane, dx);
                    }
                    if !with_filter {
                        continue;
                    }
                    let xg = &x[set_first * image_in..(set_first + set) * image_in];
                    let windows = LaneWindows {
                        src: images.build::<E, T>(s, xg, set, wide),
                        pixels: &pixels,
                        taps: &taps,
                        block: pixels.len(),
                    };
                    let more = set_first > start;
                    lane_filter_product::<E>(&windows, dy_lanes, s.out_c, totals, more);
                }
                let mut partial = vec![0.0f32; if with_filter { s.out_c * k } else { 0 }];
                fold_lanes::<E>(&totals[..partial.len() * lanes], &mut partial);
                (partial, partial_bias)
            })
        })
        .collect()
}

/// Sum with 16 independent accumulators (one AVX-512 register), combined in a fixed order:
/// a plain left-to-right sum waits on each addition's latency. Deterministic.
fn lane_sum(v: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        lanes.iter_mut().zip(c).for_each(|(l, x)| *l += x);
    }
    let tail: f32 = chunks.remainder().iter().sum();
    lanes.iter().sum::<f32>() + tail
}

pub(super) fn backward_bias<T: Precision>(s: &Conv2dShape, dy: &[T], db: &mut [f32]) {
    let pq = s.out_h() * s.out_w();
    db.par_iter_mut().enumerate().for_each_init(
        || (Vec::new(), vec![0.0f32; s.batch]),
        |(wide, per_image), (o, db)| {
            // Each image's plane, then the images as a tree (the batch can be long: the
            // linear layers' bias gradients are one term per image).
            for (n, sum) in per_image.iter_mut().enumerate() {
                let plane = &dy[(n * s.out_c + o) * pq..(n * s.out_c + o + 1) * pq];
                *sum = match plane {
                    [one] => 0.0 + one.to_f32(), // lane_sum's bits (a linear layer's term)
                    _ => lane_sum(widened(plane, wide)),
                };
            }
            *db = pairwise_sum(per_image);
        },
    );
}
