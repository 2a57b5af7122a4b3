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
    // SAFETY: the slices hold exactly M·K, K·N and M·N elements (checked by the caller), and
    // every (row stride, column stride) pair addresses inside them; C is exclusively ours.
    unsafe {
        matrixmultiply::sgemm(
            shape.m,
            shape.k,
            shape.n,
            ep.alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            ep.beta,
            c.as_mut_ptr(),
            ldc as isize,
            1,
        );
    }
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
