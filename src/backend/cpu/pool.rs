//! Max and average pooling, one plane per rayon task. Backward gathers per input element
//! (like the kernels), so overlapping windows need no atomics and results are exact.

use rayon::prelude::*;

use crate::backend::shapes::Pool2dShape;
use crate::backend::Precision;

use super::{widened, write_f32};

/// Output rows (or columns) whose window covers input row `i`: `ceil((i-k+1)/s) ..= min(i/s, out-1)`.
fn covering(i: usize, k: usize, stride: usize, out: usize) -> std::ops::RangeInclusive<usize> {
    let first = (i + 1).saturating_sub(k).div_ceil(stride);
    first..=(i / stride).min(out - 1)
}

pub(super) fn max_forward<T: Precision>(s: &Pool2dShape, x: &[T], y: &mut [T], argmax: &mut [i32]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    y.par_chunks_mut(oh * ow)
        .zip(argmax.par_chunks_mut(oh * ow))
        .enumerate()
        .for_each(|(pl, (y, am))| {
            let x = &x[pl * plane_in..(pl + 1) * plane_in];
            for p in 0..oh {
                for q in 0..ow {
                    let mut arg = p * s.stride * s.in_w + q * s.stride;
                    let mut best = x[arg].to_f32();
                    for i in 0..s.k_h {
                        for j in 0..s.k_w {
                            let idx = (p * s.stride + i) * s.in_w + q * s.stride + j;
                            let v = x[idx].to_f32();
                            if v > best || (v.is_nan() && !best.is_nan()) {
                                best = v;
                                arg = idx;
                            }
                        }
                    }
                    y[p * ow + q] = T::from_f32(best);
                    am[p * ow + q] = arg as i32;
                }
            }
        });
}

pub(super) fn max_backward<T: Precision>(s: &Pool2dShape, dy: &[T], argmax: &[i32], dx: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    dx.par_chunks_mut(plane_in)
        .enumerate()
        .for_each(|(pl, dx)| {
            let (dy, am) = (
                &dy[pl * oh * ow..(pl + 1) * oh * ow],
                &argmax[pl * oh * ow..(pl + 1) * oh * ow],
            );
            for ih in 0..s.in_h {
                for iw in 0..s.in_w {
                    let here = (ih * s.in_w + iw) as i32;
                    let mut acc = 0.0f32;
                    for p in covering(ih, s.k_h, s.stride, oh) {
                        for q in covering(iw, s.k_w, s.stride, ow) {
                            if am[p * ow + q] == here {
                                acc += dy[p * ow + q].to_f32();
                            }
                        }
                    }
                    dx[ih * s.in_w + iw] = T::from_f32(acc);
                }
            }
        });
}

/// Body of [`avg_plane`].
#[inline(always)]
fn avg_plane_body(s: &Pool2dShape, wide: &[f32], out: &mut [f32]) {
    let (oh, ow) = (s.out_h(), s.out_w());
    let inv = 1.0 / (s.k_h * s.k_w) as f32;
    if s.k_h == 2 && s.k_w == 2 && s.stride == 2 {
        // LeNet's pools: written out so the compiler vectorizes the pairs (the general loop
        // below adds in the same order, so both give the same bits).
        for (p, out_row) in out.chunks_exact_mut(ow).take(oh).enumerate() {
            let r0 = &wide[2 * p * s.in_w..][..2 * ow];
            let r1 = &wide[(2 * p + 1) * s.in_w..][..2 * ow];
            for (q, o) in out_row.iter_mut().enumerate() {
                *o = (((r0[2 * q] + r0[2 * q + 1]) + r1[2 * q]) + r1[2 * q + 1]) * inv;
            }
        }
        return;
    }
    if s.stride == s.k_h && s.stride == s.k_w {
        for p in 0..oh {
            let out_row = &mut out[p * ow..(p + 1) * ow];
            out_row.fill(0.0);
            for i in 0..s.k_h {
                let row = &wide[(p * s.stride + i) * s.in_w..][..ow * s.stride];
                for (o, w) in out_row.iter_mut().zip(row.chunks_exact(s.stride)) {
                    for v in w {
                        *o += v;
                    }
                }
            }
            out_row.iter_mut().for_each(|o| *o *= inv);
        }
        return;
    }
    for p in 0..oh {
        for q in 0..ow {
            let mut acc = 0.0f32;
            for i in 0..s.k_h {
                for j in 0..s.k_w {
                    acc += wide[(p * s.stride + i) * s.in_w + q * s.stride + j];
                }
            }
            out[p * ow + q] = acc * inv;
        }
    }
}

pub(super) fn avg_forward<T: Precision>(s: &Pool2dShape, x: &[T], y: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    y.par_chunks_mut(oh * ow).enumerate().for_each_init(
        || (vec![0.0f32; plane_in], vec![0.0f32; oh * ow]),
        |(wide, out), (pl, y)| {
            T::widen_slice(&x[pl * plane_in..(pl + 1) * plane_in], wide);
            avg_plane(s, wide, out);
            T::narrow_slice(out, y);
        },
    );
}

/// Body of [`avg_backward_plane`].
#[inline(always)]
fn avg_backward_plane_body(s: &Pool2dShape, g: &[f32], wide: &mut [f32]) {
    let (oh, ow) = (s.out_h(), s.out_w());
    let inv = 1.0 / (s.k_h * s.k_w) as f32;
    if s.stride == s.k_h && s.stride == s.k_w {
        // Windows tile the plane: each input element is covered by at most one window, so
        // the gather reduces to a copy (same bits; rows and columns past the last window
        // get zero).
        if s.in_h != oh * s.stride || s.in_w != ow * s.stride {
            wide.fill(0.0);
        }
        if s.k_h == 2 && s.k_w == 2 {
            // LeNet's pools: each gradient written to its 2x2 window, vectorizable.
            for (p, g_row) in g.chunks_exact(ow).take(oh).enumerate() {
                for i in 0..2 {
                    let row = &mut wide[(2 * p + i) * s.in_w..][..2 * ow];
                    for (q, v) in g_row.iter().enumerate() {
                        row[2 * q] = v * inv;
                        row[2 * q + 1] = v * inv;
                    }
                }
            }
            return;
        }
        for p in 0..oh {
            for i in 0..s.k_h {
                let row = &mut wide[(p * s.stride + i) * s.in_w..][..ow * s.stride];
                for (q, d) in row.chunks_exact_mut(s.stride).enumerate() {
                    d.fill(g[p * ow + q] * inv);
                }
            }
        }
        return;
    }
    for ih in 0..s.in_h {
        for iw in 0..s.in_w {
            let mut acc = 0.0f32;
            for p in covering(ih, s.k_h, s.stride, oh) {
                for q in covering(iw, s.k_w, s.stride, ow) {
                    acc += g[p * ow + q];
                }
            }
            wide[ih * s.in_w + iw] = acc * inv;
        }
    }
}

pub(super) fn avg_backward<T: Precision>(s: &Pool2dShape, dy: &[T], dx: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    dx.par_chunks_mut(plane_in).enumerate().for_each_init(
        || (vec![0.0f32; oh * ow], vec![0.0f32; plane_in]),
        |(g, wide), (pl, dx)| {
            T::widen_slice(&dy[pl * oh * ow..(pl + 1) * oh * ow], g);
            avg_backward_plane(s, g, wide);
            T::narrow_slice(wide, dx);
        },
    );
}

/// `dx = (y > 0) ⊙ avg_backward(dy)`: the pooling's and the ReLU's backward in one pass over
/// each plane instead of two over the whole tensor.
pub(super) fn avg_relu_backward<T: Precision>(s: &Pool2dShape, dy: &[T], y: &[T], dx: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    dx.par_chunks_mut(plane_in).enumerate().for_each_init(
        || {
            (
                vec![0.0f32; oh * ow],
                vec![0.0f32; plane_in],
                vec![0.0f32; plane_in],
            )
        },
        |(g, wide, act), (pl, dx)| {
            let g = widened(&dy[pl * oh * ow..(pl + 1) * oh * ow], g);
            let act = widened(&y[pl * plane_in..(pl + 1) * plane_in], act);
            write_f32(dx, wide, |dx| avg_relu_backward_plane(s, g, act, dx));
        },
    );
}

/// Body of [`avg_relu_backward_plane`].
#[inline(always)]
fn avg_relu_backward_plane_body(s: &Pool2dShape, g: &[f32], act: &[f32], dx: &mut [f32]) {
    avg_backward_plane_body(s, g, dx);
    for (d, a) in dx.iter_mut().zip(act) {
        *d = if *a > 0.0 { *d } else { 0.0 };
    }
}

// The plane loops are compiled twice: for the baseline instruction set (SSE2: four lanes)
// and for AVX-512, picked at run time per plane. Element-wise arithmetic in the same order,
// so both give the same bits.
multiversion!(
    /// Average-pools one f32 plane (`s.in_h x s.in_w`) into `out` (`out_h x out_w`).
    pub(super) fn avg_plane(s: &Pool2dShape, wide: &[f32], out: &mut [f32]) = avg_plane_body
);
multiversion!(
    /// Spreads one f32 plane of output gradients `g` (`out_h x out_w`) over the input plane
    /// `wide` (`in_h x in_w`, overwritten).
    fn avg_backward_plane(s: &Pool2dShape, g: &[f32], wide: &mut [f32]) = avg_backward_plane_body
);
multiversion!(
    /// One plane of [`avg_relu_backward`]: `dx = (act > 0) ⊙ avg_backward(g)`, all f32.
    pub(super) fn avg_relu_backward_plane(
        s: &Pool2dShape,
        g: &[f32],
        act: &[f32],
        dx: &mut [f32],
    ) = avg_relu_backward_plane_body
);
