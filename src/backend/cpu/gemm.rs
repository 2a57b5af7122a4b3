//! f32 GEMM through `matrixmultiply` (packed panels, SIMD micro-kernels, threads), with the
//! transposes expressed as strides and the epilogue applied after.

use rayon::prelude::*;

use crate::backend::ops::expect_len;
use crate::backend::shapes::{Epilogue, GemmShape};
use crate::backend::BackendError;

pub(super) fn check(
    shape: &GemmShape,
    a: usize,
    b: usize,
    c: usize,
    bias: Option<usize>,
) -> Result<(), BackendError> {
    shape.validate()?;
    expect_len("gemm", "a", a, shape.m * shape.k)?;
    expect_len("gemm", "b", b, shape.k * shape.n)?;
    expect_len("gemm", "c", c, shape.m * shape.n)?;
    if let Some(bias) = bias {
        expect_len("gemm", "bias", bias, shape.n)?;
    }
    Ok(())
}

pub(super) fn gemm_f32(
    shape: &GemmShape,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    c: &mut [f32],
    ep: Epilogue,
) {
    let (lda, ldb, ldc) = shape.leading_dims();
    let (rsa, csa) = if shape.trans_a { (1, lda) } else { (lda, 1) };
    let (rsb, csb) = if shape.trans_b { (1, ldb) } else { (ldb, 1) };
    // Big products are split by rows of C over rayon's threads, each a single-threaded
    // matrixmultiply call on its panel (matrixmultiply's own threads would fight rayon's when
    // the callers are already parallel, as the convolutions are).
    let rows_per_task = if shape.flops() < 4e6 {
        shape.m
    } else {
        shape.m.div_ceil(rayon::current_num_threads() * 2).max(16)
    };
    c.par_chunks_mut(rows_per_task * ldc)
        .enumerate()
        .for_each(|(t, c_rows)| {
            let row0 = t * rows_per_task;
            let m = c_rows.len() / ldc;
            // SAFETY: a holds M·K elements, b K·N, c's panel m·N (checked by the caller); the
            // panel's rows of op(A) start at row0, which the stride for rows (rsa) reaches inside
            // a; every (row stride, column stride) pair addresses inside its slice.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    shape.k,
                    shape.n,
                    ep.alpha,
                    a.as_ptr().add(row0 * rsa),
                    rsa as isize,
                    csa as isize,
                    b.as_ptr(),
                    rsb as isize,
                    csb as isize,
                    ep.beta,
                    c_rows.as_mut_ptr(),
                    ldc as isize,
                    1,
                );
            }
        });
    if bias.is_some() || ep.relu {
        c.par_chunks_mut(shape.n).for_each(|row| {
            if let Some(bias) = bias {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
            if ep.relu {
                row.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        });
    }
}
