//! Convolution as im2col + GEMM, a group of images per rayon task (their taps side by side,
//! so each GEMM is wide).
//!
//! For image n, `col` is the (C·KH·KW) x (P·Q) matrix of input taps, so the forward pass is
//! `y_n = w · col` (O x P·Q), the input gradient is `col2im(wᵀ · dy_n)`, and the filter
//! gradient is `Σ_n dy_n · col_nᵀ`. The filter gradient sums images in fixed chunks and then
//! the chunks in order, so the result does not depend on the thread count.

use rayon::prelude::*;

use crate::backend::ops::Precision;
use crate::backend::shapes::Conv2dShape;

/// Images per partial sum of the filter gradient.
const FILTER_CHUNK: usize = 8;

/// A packed row-major matrix used as a GEMM operand, possibly transposed: `rows x cols`
/// are the dimensions of the operand as used (op(X)), not as stored.
struct Operand<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    transposed: bool,
}

impl Operand<'_> {
    fn strides(&self) -> (isize, isize) {
        if self.transposed {
            (1, self.rows as isize)
        } else {
            (self.cols as isize, 1)
        }
    }
}

/// `c = a·b + beta·c`, c packed row-major `a.rows x b.cols`.
fn sgemm(a: Operand, b: Operand, beta: f32, c: &mut [f32]) {
    assert!(a.cols == b.rows && a.data.len() >= a.rows * a.cols && b.data.len() >= b.rows * b.cols);
    assert!(c.len() >= a.rows * b.cols);
    let ((rsa, csa), (rsb, csb)) = (a.strides(), b.strides());
    // SAFETY: the asserts above bound every address the strides can form inside the slices;
    // c is exclusively borrowed.
    unsafe {
        matrixmultiply::sgemm(
            a.rows,
            a.cols,
            b.cols,
            1.0,
            a.data.as_ptr(),
            rsa,
            csa,
            b.data.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            b.cols as isize,
            1,
        )
    }
}

/// Images per GEMM: a group's taps side by side make the GEMMs wide enough to run near the
/// CPU's peak (one 13x13 image alone gives conv2 an N of only 81).
const GROUP: usize = FILTER_CHUNK;

/// Writes image `x`'s taps into `col` ((C·KH·KW) rows of stride `ld`), starting at column
/// `off`: row (c, i, j), column p·Q + q holds x[c][p·stride + i - pad][q·stride + j - pad]
/// (zero in the padding).
fn im2col(s: &Conv2dShape, x: &[f32], col: &mut [f32], ld: usize, off: usize) {
    let (p_n, q_n) = (s.out_h(), s.out_w());
    let mut row = 0;
    for c in 0..s.in_c {
        let plane = &x[c * s.in_h * s.in_w..(c + 1) * s.in_h * s.in_w];
        for i in 0..s.k_h {
            for j in 0..s.k_w {
                let dst = &mut col[row * ld + off..row * ld + off + p_n * q_n];
                if s.stride == 1 && s.pad == 0 {
                    // Every tap is inside the image: each output row is a contiguous run.
                    for (p, d) in dst.chunks_exact_mut(q_n).enumerate() {
                        let src = &plane[(p + i) * s.in_w + j..(p + i) * s.in_w + j + q_n];
                        d.copy_from_slice(src);
                    }
                } else {
                    for p in 0..p_n {
                        let ih = (p * s.stride + i) as isize - s.pad as isize;
                        for q in 0..q_n {
                            let iw = (q * s.stride + j) as isize - s.pad as isize;
                            dst[p * q_n + q] = if ih >= 0
                                && iw >= 0
                                && (ih as usize) < s.in_h
                                && (iw as usize) < s.in_w
                            {
                                plane[ih as usize * s.in_w + iw as usize]
                            } else {
                                0.0
                            };
                        }
                    }
                }
                row += 1;
            }
        }
    }
}

/// Adds the taps in `dcol` (rows of stride `ld`, this image's columns from `off`) back onto
/// the image gradient `acc` (C x H x W): the transpose of [`im2col`].
fn col2im(s: &Conv2dShape, dcol: &[f32], ld: usize, off: usize, acc: &mut [f32]) {
    let (p_n, q_n) = (s.out_h(), s.out_w());
    let mut row = 0;
    for c in 0..s.in_c {
        let plane = &mut acc[c * s.in_h * s.in_w..(c + 1) * s.in_h * s.in_w];
        for i in 0..s.k_h {
            for j in 0..s.k_w {
                let src = &dcol[row * ld + off..row * ld + off + p_n * q_n];
                if s.stride == 1 && s.pad == 0 {
                    for (p, v) in src.chunks_exact(q_n).enumerate() {
                        let d = &mut plane[(p + i) * s.in_w + j..(p + i) * s.in_w + j + q_n];
                        d.iter_mut().zip(v).for_each(|(d, v)| *d += v);
                    }
                } else {
                    for p in 0..p_n {
                        let ih = (p * s.stride + i) as isize - s.pad as isize;
                        if ih < 0 || ih as usize >= s.in_h {
                            continue;
                        }
                        for q in 0..q_n {
                            let iw = (q * s.stride + j) as isize - s.pad as isize;
                            if iw >= 0 && (iw as usize) < s.in_w {
                                plane[ih as usize * s.in_w + iw as usize] += src[p * q_n + q];
                            }
                        }
                    }
                }
                row += 1;
            }
        }
    }
}

/// Gathers a group's output gradients (images x O x PQ) into O rows of `imgs·PQ` (f32).
fn gather_dy<T: Precision>(dy: &[T], out_c: usize, pq: usize, imgs: usize, dst: &mut [f32]) {
    let npq = imgs * pq;
    for m in 0..imgs {
        for o in 0..out_c {
            let src = &dy[(m * out_c + o) * pq..(m * out_c + o + 1) * pq];
            T::widen_slice(src, &mut dst[o * npq + m * pq..o * npq + (m + 1) * pq]);
        }
    }
}

fn widen<T: Precision>(v: &[T]) -> Vec<f32> {
    let mut out = vec![0.0f32; v.len()];
    T::widen_slice(v, &mut out);
    out
}

pub(super) fn forward<T: Precision>(
    s: &Conv2dShape,
    x: &[T],
    w: &[T],
    bias: Option<&[f32]>,
    y: &mut [T],
    relu: bool,
) {
    let k = s.in_c * s.k_h * s.k_w;
    let pq = s.out_h() * s.out_w();
    let w32 = widen(w);
    let image_in = s.in_c * s.in_h * s.in_w;
    let image_out = s.out_c * pq;
    if image_out == 0 {
        return;
    }
    y.par_chunks_mut(image_out * GROUP)
        .enumerate()
        .for_each_init(
            || {
                (
                    vec![0.0f32; k * pq * GROUP],
                    vec![0.0f32; s.out_c * pq * GROUP],
                    vec![0.0f32; image_in],
                    vec![0.0f32; pq],
                )
            },
            |(col, out, image, row), (g, y_g)| {
                let imgs = y_g.len() / image_out;
                let npq = imgs * pq;
                for m in 0..imgs {
                    let n = g * GROUP + m;
                    T::widen_slice(&x[n * image_in..(n + 1) * image_in], image);
                    im2col(s, image, col, npq, m * pq);
                }
                let w_op = Operand {
                    data: &w32,
                    rows: s.out_c,
                    cols: k,
                    transposed: false,
                };
                let col_op = Operand {
                    data: &col[..k * npq],
                    rows: k,
                    cols: npq,
                    transposed: false,
                };
                sgemm(w_op, col_op, 0.0, &mut out[..s.out_c * npq]);
                for (m, y_n) in y_g.chunks_mut(image_out).enumerate() {
                    for (o, dst) in y_n.chunks_mut(pq).enumerate() {
                        let b = bias.map_or(0.0, |b| b[o]);
                        let src = &out[o * npq + m * pq..o * npq + (m + 1) * pq];
                        for (r, v) in row.iter_mut().zip(src) {
                            let v = v + b;
                            *r = if relu { v.max(0.0) } else { v };
                        }
                        T::narrow_slice(row, dst);
                    }
                }
            },
        );
}

pub(super) fn backward_input<T: Precision>(s: &Conv2dShape, dy: &[T], w: &[T], dx: &mut [T]) {
    let k = s.in_c * s.k_h * s.k_w;
    let pq = s.out_h() * s.out_w();
    let w32 = widen(w);
    let image_in = s.in_c * s.in_h * s.in_w;
    if image_in == 0 {
        return;
    }
    dx.par_chunks_mut(image_in * GROUP)
        .enumerate()
        .for_each_init(
            || {
                (
                    vec![0.0f32; k * pq * GROUP],
                    vec![0.0f32; s.out_c * pq * GROUP],
                    vec![0.0f32; image_in],
                )
            },
            |(dcol, dyg, acc), (g, dx_g)| {
                let imgs = dx_g.len() / image_in;
                let npq = imgs * pq;
                let first = g * GROUP * s.out_c * pq;
                gather_dy(
                    &dy[first..first + imgs * s.out_c * pq],
                    s.out_c,
                    pq,
                    imgs,
                    dyg,
                );
                // wᵀ (K x O) · dy (O x imgs·PQ)
                let w_t = Operand {
                    data: &w32,
                    rows: k,
                    cols: s.out_c,
                    transposed: true,
                };
                let dy_op = Operand {
                    data: &dyg[..s.out_c * npq],
                    rows: s.out_c,
                    cols: npq,
                    transposed: false,
                };
                sgemm(w_t, dy_op, 0.0, &mut dcol[..k * npq]);
                for (m, dx_n) in dx_g.chunks_mut(image_in).enumerate() {
                    acc.fill(0.0);
                    col2im(s, dcol, npq, m * pq, acc);
                    T::narrow_slice(acc, dx_n);
                }
            },
        );
}

pub(super) fn backward_filter<T: Precision>(s: &Conv2dShape, x: &[T], dy: &[T], dw: &mut [f32]) {
    let k = s.in_c * s.k_h * s.k_w;
    let pq = s.out_h() * s.out_w();
    let image_in = s.in_c * s.in_h * s.in_w;
    let chunks: Vec<Vec<f32>> = (0..s.batch.div_ceil(FILTER_CHUNK))
        .into_par_iter()
        .map_init(
            // Reused per worker: im2col and gather_dy overwrite every element they cover.
            || {
                (
                    vec![0.0f32; k * pq * FILTER_CHUNK],
                    vec![0.0f32; s.out_c * pq * FILTER_CHUNK],
                    vec![0.0f32; image_in],
                )
            },
            |(col, dyg, image), chunk| {
                let mut partial = vec![0.0f32; s.out_c * k];
                let first = chunk * FILTER_CHUNK;
                let imgs = FILTER_CHUNK.min(s.batch - first);
                let npq = imgs * pq;
                let (col, dyg) = (&mut col[..k * npq], &mut dyg[..s.out_c * npq]);
                for m in 0..imgs {
                    let n = first + m;
                    T::widen_slice(&x[n * image_in..(n + 1) * image_in], image);
                    im2col(s, image, col, npq, m * pq);
                }
                gather_dy(
                    &dy[first * s.out_c * pq..(first + imgs) * s.out_c * pq],
                    s.out_c,
                    pq,
                    imgs,
                    dyg,
                );
                // dy (O x imgs·PQ) · colᵀ (imgs·PQ x K)
                let dy_op = Operand {
                    data: dyg,
                    rows: s.out_c,
                    cols: npq,
                    transposed: false,
                };
                let col_t = Operand {
                    data: col,
                    rows: npq,
                    cols: k,
                    transposed: true,
                };
                sgemm(dy_op, col_t, 0.0, &mut partial);
                partial
            },
        )
        .collect();
    dw.fill(0.0);
    for partial in chunks {
        dw.iter_mut().zip(&partial).for_each(|(d, p)| *d += p);
    }
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
        || vec![0.0f32; pq],
        |wide, (o, db)| {
            let mut acc = 0.0f32;
            for n in 0..s.batch {
                let plane = &dy[(n * s.out_c + o) * pq..(n * s.out_c + o + 1) * pq];
                T::widen_slice(plane, wide);
                acc += lane_sum(wide);
            }
            *db = acc;
        },
    );
}
