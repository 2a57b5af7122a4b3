//! Softmax cross-entropy, one row at a time (numerically stable: shifted by the row max).

use rayon::prelude::*;

use crate::backend::Precision;

/// Writes each row's loss (and the scaled gradient, if asked) and returns how many rows'
/// argmax (first on ties) equals the label. A label ≥ classes gives a NaN loss.
pub(super) fn softmax_cross_entropy<T: Precision>(
    classes: usize,
    logits: &[T],
    labels: &[u8],
    loss: &mut [f32],
    grad: Option<&mut [T]>,
    grad_scale: f32,
) -> i32 {
    let row = |r: usize, loss: &mut f32, grad: Option<&mut [T]>| -> i32 {
        let z: Vec<f32> = logits[r * classes..(r + 1) * classes]
            .iter()
            .map(|v| v.to_f32())
            .collect();
        let (mut best, mut arg) = (f32::NEG_INFINITY, classes);
        for (c, &v) in z.iter().enumerate() {
            if v > best || (v.is_nan() && !best.is_nan()) {
                best = v;
                arg = c;
            }
        }
        let sum: f32 = z.iter().map(|v| (v - best).exp()).sum();
        let label = labels[r] as usize;
        if let Some(grad) = grad {
            for (c, g) in grad.iter_mut().enumerate() {
                let p = (z[c] - best).exp() / sum;
                *g = T::from_f32((p - if c == label { 1.0 } else { 0.0 }) * grad_scale);
            }
        }
        if label < classes {
            *loss = best + sum.ln() - z[label];
            i32::from(arg == label)
        } else {
            *loss = f32::NAN;
            0
        }
    };
    match grad {
        Some(grad) => loss
            .par_iter_mut()
            .zip(grad.par_chunks_mut(classes))
            .enumerate()
            .map(|(r, (l, g))| row(r, l, Some(g)))
            .sum(),
        None => loss
            .par_iter_mut()
            .enumerate()
            .map(|(r, l)| row(r, l, None))
            .sum(),
    }
}
