//! The SGD step and the finite check for mixed precision, over flat buffers.

use rayon::prelude::*;

use crate::backend::shapes::SgdStep;
use crate::backend::Precision;

const CHUNK: usize = 1 << 14;

/// Whether any value is infinite or NaN (its magnitude's bits at infinity's or above; a chunk
/// folded whole, without an exit per element, vectorizes).
pub(super) fn any_nonfinite<G: Precision>(grad: &[G]) -> bool {
    let nonfinite = |g: &G| (g.to_f32().to_bits() & 0x7fff_ffff) >= 0x7f80_0000;
    grad.par_chunks(CHUNK)
        .any(|c| c.iter().fold(false, |any, g| any | nonfinite(g)))
}

/// Same arithmetic, in the same order, as `sgd_step` in `kernels/optim.cu`.
pub(super) fn sgd_step<T: Precision>(
    w: &mut [f32],
    grad: &[f32],
    velocity: Option<&mut [f32]>,
    w_copy: Option<&mut [T]>,
    s: SgdStep,
) {
    let n = w.len();
    w.par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(split(velocity, n).into_par_iter())
        .zip(split(w_copy, n).into_par_iter())
        .for_each(|(((w, g), v), h)| update(w, g, v, h, s));
}

super::engine::multiversion!(
    /// One chunk of [`sgd_step`]. The fused multiply-adds must be single instructions (as
    /// `fmaf` is on the GPU): without FMA, `f32::mul_add` is a call into the math library per
    /// element, so the loop is compiled for the process's engine; the portable engine pays
    /// the calls.
    fn update<T: Precision>(
        w: &mut [f32],
        g: &[f32],
        v: Option<&mut [f32]>,
        h: Option<&mut [T]>,
        s: SgdStep,
    ) = update_body
);

#[inline(always)]
fn update_body<T: Precision>(
    w: &mut [f32],
    g: &[f32],
    mut v: Option<&mut [f32]>,
    h: Option<&mut [T]>,
    s: SgdStep,
) {
    for i in 0..w.len() {
        let mut grad = s.weight_decay.mul_add(w[i], g[i] * s.inv_scale);
        if let Some(v) = v.as_deref_mut() {
            grad = s.momentum.mul_add(v[i], grad);
            v[i] = grad;
        }
        w[i] = (-s.lr).mul_add(grad, w[i]);
    }
    // The half copy in one pass of vector conversions (a conversion per element inside the
    // loop above is a call into `half`'s software rounding).
    if let Some(h) = h {
        T::narrow_slice(w, h);
    }
}

/// Splits an optional buffer into the same chunks as the weights (all `None` when absent).
fn split<T>(buf: Option<&mut [T]>, n: usize) -> Vec<Option<&mut [T]>> {
    match buf {
        Some(b) => b.chunks_mut(CHUNK).map(Some).collect(),
        None => (0..n.div_ceil(CHUNK)).map(|_| None).collect(),
    }
}
