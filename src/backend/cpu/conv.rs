//! Convolution as im2col + GEMM, one image per rayon task.
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

/// Fills `col` ((C·KH·KW) x (P·Q), row-major) with image `x`'s taps; zero for padding.
fn im2col<T: Precision>(s: &Conv2dShape, x: &[T], col: &mut [f32]) {
    let (p_n, q_n) = (s.out_h(), s.out_w());
    let mut row = 0;
    for c in 0..s.in_c {
        let plane = &x[c * s.in_h * s.in_w..(c + 1) * s.in_h * s.in_w];
        for i in 0..s.k_h {
            for j in 0..s.k_w {
                let dst = &mut col[row * p_n * q_n..(row + 1) * p_n * q_n];
                for p in 0..p_n {
                    let ih = (p * s.stride + i) as isize - s.pad as isize;
                    for q in 0..q_n {
                        let iw = (q * s.stride + j) as isize - s.pad as isize;
                        dst[p * q_n + q] = if ih >= 0
                            && iw >= 0
                            && (ih as usize) < s.in_h
                            && (iw as usize) < s.in_w
                        {
                            plane[ih as usize * s.in_w + iw as usize].to_f32()
                        } else {
                            0.0
                        };
                    }
                }
                row += 1;
            }
        }
    }
}

fn widen<T: Precision>(v: &[T]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
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
    y.par_chunks_mut(s.out_c * pq).enumerate().for_each_init(
        || (vec![0.0f32; k * pq], vec![0.0f32; s.out_c * pq]),
        |(col, out), (n, y_n)| {
            im2col(s, &x[n * image_in..(n + 1) * image_in], col);
            let w_op = Operand {
                data: &w32,
                rows: s.out_c,
                cols: k,
                transposed: false,
            };
            sgemm(
                w_op,
                Operand {
                    data: col,
                    rows: k,
                    cols: pq,
                    transposed: false,
                },
                0.0,
                out,
            );
            for (o, (dst, src)) in y_n.chunks_mut(pq).zip(out.chunks(pq)).enumerate() {
                let b = bias.map_or(0.0, |b| b[o]);
                for (d, v) in dst.iter_mut().zip(src) {
                    let v = v + b;
                    *d = T::from_f32(if relu { v.max(0.0) } else { v });
                }
            }
        },
    );
}

pub(super) fn backward_input<T: Precision>(s: &Conv2dShape, dy: &[T], w: &[T], dx: &mut [T]) {
    let k = s.in_c * s.k_h * s.k_w;
    let (p_n, q_n) = (s.out_h(), s.out_w());
    let pq = p_n * q_n;
    let w32 = widen(w);
    let image_in = s.in_c * s.in_h * s.in_w;
    dx.par_chunks_mut(image_in).enumerate().for_each_init(
        || (vec![0.0f32; k * pq], vec![0.0f32; image_in]),
        |(dcol, acc), (n, dx_n)| {
            let dy_n = widen(&dy[n * s.out_c * pq..(n + 1) * s.out_c * pq]);
            // wᵀ (K x O) · dy_n (O x PQ)
            let w_t = Operand {
                data: &w32,
                rows: k,
                cols: s.out_c,
                transposed: true,
            };
            sgemm(
                w_t,
                Operand {
                    data: &dy_n,
                    rows: s.out_c,
                    cols: pq,
                    transposed: false,
                },
                0.0,
                dcol,
            );
            acc.fill(0.0);
            let mut row = 0;
            for c in 0..s.in_c {
                for i in 0..s.k_h {
                    for j in 0..s.k_w {
                        for p in 0..p_n {
                            let ih = (p * s.stride + i) as isize - s.pad as isize;
                            if ih < 0 || ih as usize >= s.in_h {
                                continue;
                            }
                            for q in 0..q_n {
                                let iw = (q * s.stride + j) as isize - s.pad as isize;
                                if iw >= 0 && (iw as usize) < s.in_w {
                                    acc[(c * s.in_h + ih as usize) * s.in_w + iw as usize] +=
                                        dcol[row * pq + p * q_n + q];
                                }
                            }
                        }
                        row += 1;
                    }
                }
            }
            dx_n.iter_mut()
                .zip(acc.iter())
                .for_each(|(d, v)| *d = T::from_f32(*v));
        },
    );
}

pub(super) fn backward_filter<T: Precision>(s: &Conv2dShape, x: &[T], dy: &[T], dw: &mut [f32]) {
    let k = s.in_c * s.k_h * s.k_w;
    let pq = s.out_h() * s.out_w();
    let image_in = s.in_c * s.in_h * s.in_w;
    let chunks: Vec<Vec<f32>> = (0..s.batch.div_ceil(FILTER_CHUNK))
        .into_par_iter()
        .map(|chunk| {
            let mut partial = vec![0.0f32; s.out_c * k];
            let mut col = vec![0.0f32; k * pq];
            for n in chunk * FILTER_CHUNK..((chunk + 1) * FILTER_CHUNK).min(s.batch) {
                im2col(s, &x[n * image_in..(n + 1) * image_in], &mut col);
                let dy_n = widen(&dy[n * s.out_c * pq..(n + 1) * s.out_c * pq]);
                let dy_op = Operand {
                    data: &dy_n,
                    rows: s.out_c,
                    cols: pq,
                    transposed: false,
                };
                sgemm(
                    dy_op,
                    Operand {
                        data: &col,
                        rows: pq,
                        cols: k,
                        transposed: true,
                    },
                    1.0,
                    &mut partial,
                );
            }
            partial
        })
        .collect();
    dw.fill(0.0);
    for partial in chunks {
        dw.iter_mut().zip(&partial).for_each(|(d, p)| *d += p);
    }
}

pub(super) fn backward_bias<T: Precision>(s: &Conv2dShape, dy: &[T], db: &mut [f32]) {
    let pq = s.out_h() * s.out_w();
    db.par_iter_mut().enumerate().for_each(|(o, db)| {
        let mut acc = 0.0f32;
        for n in 0..s.batch {
            let plane = &dy[(n * s.out_c + o) * pq..(n * s.out_c + o + 1) * pq];
            acc += plane.iter().map(|v| v.to_f32()).sum::<f32>();
        }
        *db = acc;
    });
}
