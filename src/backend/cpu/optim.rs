//! The SGD step and the finite check for mixed precision, over flat buffers.

use half::f16;
use rayon::prelude::*;

use crate::backend::ops::Precision;
use crate::backend::shapes::SgdStep;

const CHUNK: usize = 1 << 14;

pub(super) fn any_nonfinite<G: Precision>(grad: &[G]) -> bool {
    grad.par_chunks(CHUNK)
        .any(|c| c.iter().any(|g| !g.to_f32().is_finite()))
}

/// Same arithmetic, in the same order, as `sgd_step` in `kernels/optim.cu`.
pub(super) fn sgd_step<G: Precision>(
    w: &mut [f32],
    grad: &[G],
    velocity: Option<&mut [f32]>,
    w_half: Option<&mut [f16]>,
    s: SgdStep,
) {
    let update = |w: &mut f32, g: &G, v: Option<&mut f32>, h: Option<&mut f16>| {
        let mut g = s.weight_decay.mul_add(*w, g.to_f32() * s.inv_scale);
        if let Some(v) = v {
            g = s.momentum.mul_add(*v, g);
            *v = g;
        }
        *w = (-s.lr).mul_add(g, *w);
        if let Some(h) = h {
            *h = f16::from_f32(*w);
        }
    };
    let n = w.len();
    w.par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(split(velocity, n).into_par_iter())
        .zip(split(w_half, n).into_par_iter())
        .for_each(|(((w, g), mut v), mut h)| {
            for i in 0..w.len() {
                update(
                    &mut w[i],
                    &g[i],
                    v.as_deref_mut().map(|v| &mut v[i]),
                    h.as_deref_mut().map(|h| &mut h[i]),
                );
            }
        });
}

/// Splits an optional buffer into the same chunks as the weights (all `None` when absent).
fn split<T>(buf: Option<&mut [T]>, n: usize) -> Vec<Option<&mut [T]>> {
    match buf {
        Some(b) => b.chunks_mut(CHUNK).map(Some).collect(),
        None => (0..n.div_ceil(CHUNK)).map(|_| None).collect(),
    }
}
