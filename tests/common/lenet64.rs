//! LeNet in float64, written for clarity and sharing no arithmetic with any backend: the
//! reference the trainer's gradients and trajectories are measured against. One image at a
//! time (images in parallel), per-image gradients summed in float64, whose rounding
//! (~1e-16 relative) is far below anything float32 can resolve.
//!
//! Shapes come from `nanoddp::model` (one home for them); the arithmetic is all here.

#![allow(dead_code)]

use nanoddp::backend::{Conv2dShape, Pool2dShape};
use nanoddp::model::{self, CLASSES, PARAMS};
use rayon::prelude::*;

/// y (O x P x Q) = conv(x (C x H x W), w) + b, stride 1, no padding.
fn conv(s: &Conv2dShape, x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    let (p_n, q_n) = (s.out_h(), s.out_w());
    let mut y = vec![0.0; s.out_c * p_n * q_n];
    for (o, plane) in y.chunks_mut(p_n * q_n).enumerate() {
        plane.fill(b[o]);
        for c in 0..s.in_c {
            for i in 0..s.k_h {
                for j in 0..s.k_w {
                    let wv = w[((o * s.in_c + c) * s.k_h + i) * s.k_w + j];
                    for p in 0..p_n {
                        let row = &x[(c * s.in_h + p + i) * s.in_w + j..][..q_n];
                        for (v, xv) in plane[p * q_n..(p + 1) * q_n].iter_mut().zip(row) {
                            *v += wv * xv;
                        }
                    }
                }
            }
        }
    }
    y
}

/// Adds the filter and bias gradients of [`conv`] for output gradient `dy` to `dw`, `db`,
/// and returns the input gradient when `want_dx`.
fn conv_backward(
    s: &Conv2dShape,
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    (dw, db): (&mut [f64], &mut [f64]),
    want_dx: bool,
) -> Vec<f64> {
    let (p_n, q_n) = (s.out_h(), s.out_w());
    let mut dx = vec![0.0; if want_dx { s.in_c * s.in_h * s.in_w } else { 0 }];
    for (o, plane) in dy.chunks(p_n * q_n).enumerate() {
        db[o] += plane.iter().sum::<f64>();
        for c in 0..s.in_c {
            for i in 0..s.k_h {
                for j in 0..s.k_w {
                    let at = ((o * s.in_c + c) * s.k_h + i) * s.k_w + j;
                    let mut acc = 0.0;
                    for p in 0..p_n {
                        let start = (c * s.in_h + p + i) * s.in_w + j;
                        let row = &x[start..start + q_n];
                        let d = &plane[p * q_n..(p + 1) * q_n];
                        acc += row.iter().zip(d).map(|(a, b)| a * b).sum::<f64>();
                        if want_dx {
                            for (t, dv) in dx[start..start + q_n].iter_mut().zip(d) {
                                *t += w[at] * dv;
                            }
                        }
                    }
                    dw[at] += acc;
                }
            }
        }
    }
    dx
}

/// Average pooling (k x k windows, stride k, trailing rows and columns dropped).
fn avg_pool(s: &Pool2dShape, x: &[f64], planes: usize) -> Vec<f64> {
    let (oh, ow) = (s.out_h(), s.out_w());
    let area = (s.k_h * s.k_w) as f64;
    let mut y = vec![0.0; planes * oh * ow];
    for pl in 0..planes {
        for a in 0..oh {
            for b in 0..ow {
                let mut v = 0.0;
                for u in 0..s.k_h {
                    for t in 0..s.k_w {
                        v += x[(pl * s.in_h + a * s.stride + u) * s.in_w + b * s.stride + t];
                    }
                }
                y[(pl * oh + a) * ow + b] = v / area;
            }
        }
    }
    y
}

/// The gradient through [`avg_pool`] and the ReLU before it (`act` is the ReLU's output).
fn avg_pool_relu_backward(s: &Pool2dShape, dy: &[f64], act: &[f64], planes: usize) -> Vec<f64> {
    let (oh, ow) = (s.out_h(), s.out_w());
    let area = (s.k_h * s.k_w) as f64;
    let mut dx = vec![0.0; planes * s.in_h * s.in_w];
    for pl in 0..planes {
        for a in 0..oh {
            for b in 0..ow {
                for u in 0..s.k_h {
                    for t in 0..s.k_w {
                        let at = (pl * s.in_h + a * s.stride + u) * s.in_w + b * s.stride + t;
                        if act[at] > 0.0 {
                            dx[at] += dy[(pl * oh + a) * ow + b] / area;
                        }
                    }
                }
            }
        }
    }
    dx
}

/// y = W·x + b (W: out x in).
fn linear(w: &[f64], b: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .zip(b)
        .map(|(row, b)| b + row.iter().zip(x).map(|(w, x)| w * x).sum::<f64>())
        .collect()
}

/// Adds dW += dy ⊗ x and db += dy; returns dx = Wᵀ·dy.
fn linear_backward(
    w: &[f64],
    x: &[f64],
    dy: &[f64],
    (dw, db): (&mut [f64], &mut [f64]),
) -> Vec<f64> {
    let mut dx = vec![0.0; x.len()];
    for (o, d) in dy.iter().enumerate() {
        db[o] += d;
        let row = &w[o * x.len()..(o + 1) * x.len()];
        for (((g, xv), t), wv) in dw[o * x.len()..].iter_mut().zip(x).zip(&mut dx).zip(row) {
            *g += d * xv;
            *t += d * wv;
        }
    }
    dx
}

fn relu(v: &mut [f64]) {
    v.iter_mut().for_each(|x| *x = x.max(0.0));
}

fn zeros() -> Vec<Vec<f64>> {
    PARAMS.iter().map(|p| vec![0.0; p.len()]).collect()
}

/// One image's loss, and (scaled by `scale`) its gradients added to `g`.
fn image(params: &[Vec<f64>], pixels: &[u8], label: u8, scale: f64, g: &mut [Vec<f64>]) -> f64 {
    let (c1s, p1s, c2s, p2s) = (
        model::conv1(1),
        model::pool1(1),
        model::conv2(1),
        model::pool2(1),
    );
    let [w1, b1, w2, b2, w3, b3, w4, b4] = params else {
        panic!("eight tensors")
    };
    let x: Vec<f64> = pixels.iter().map(|&p| p as f64 / 255.0).collect();
    let mut c1 = conv(&c1s, &x, w1, b1);
    relu(&mut c1);
    let p1 = avg_pool(&p1s, &c1, c1s.out_c);
    let mut c2 = conv(&c2s, &p1, w2, b2);
    relu(&mut c2);
    let p2 = avg_pool(&p2s, &c2, c2s.out_c);
    let mut h = linear(w3, b3, &p2);
    relu(&mut h);
    let z = linear(w4, b4, &h);
    // Softmax cross-entropy, shifted by the largest logit.
    let top = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = z.iter().map(|v| (v - top).exp()).sum();
    let loss = top + sum.ln() - z[label as usize];
    let dz: Vec<f64> = (0..CLASSES)
        .map(|k| scale * ((z[k] - top).exp() / sum - if k == label as usize { 1.0 } else { 0.0 }))
        .collect();

    let [g1, gb1, g2, gb2, g3, gb3, g4, gb4] = g else {
        panic!("eight tensors")
    };
    let mut dh = linear_backward(w4, &h, &dz, (g4, gb4));
    for (d, hv) in dh.iter_mut().zip(&h) {
        if *hv <= 0.0 {
            *d = 0.0;
        }
    }
    let dp2 = linear_backward(w3, &p2, &dh, (g3, gb3));
    let dc2 = avg_pool_relu_backward(&p2s, &dp2, &c2, c2s.out_c);
    let dp1 = conv_backward(&c2s, &p1, w2, &dc2, (g2, gb2), true);
    let dc1 = avg_pool_relu_backward(&p1s, &dp1, &c1, c1s.out_c);
    conv_backward(&c1s, &x, w1, &dc1, (g1, gb1), false);
    loss
}

/// The mean loss over the batch and its gradient with respect to every tensor of
/// [`PARAMS`].
pub fn loss_and_gradients(
    params: &[Vec<f64>],
    images: &[u8],
    labels: &[u8],
) -> (f64, Vec<Vec<f64>>) {
    let pixels = model::IMAGE * model::IMAGE;
    let scale = 1.0 / labels.len() as f64;
    let (loss, grads) = images
        .par_chunks(pixels)
        .zip(labels)
        .fold(
            || (0.0, zeros()),
            |(loss, mut g), (x, &y)| {
                let l = image(params, x, y, scale, &mut g);
                (loss + l, g)
            },
        )
        .reduce(
            || (0.0, zeros()),
            |(la, mut ga), (lb, gb)| {
                for (a, b) in ga.iter_mut().zip(&gb) {
                    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                }
                (la + lb, ga)
            },
        );
    (loss * scale, grads)
}

/// Widens f32 tensors.
pub fn widen(weights: &[Vec<f32>]) -> Vec<Vec<f64>> {
    weights
        .iter()
        .map(|w| w.iter().map(|&v| v as f64).collect())
        .collect()
}

/// ‖got − want‖ / ‖want‖ (L2).
pub fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        err += (*g as f64 - w).powi(2);
        norm += w * w;
    }
    (err / norm).sqrt()
}

/// A batch's convolution outputs before the ReLU (`s.batch` images, stride 1, no padding).
pub fn conv_forward(s: &Conv2dShape, x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    x.par_chunks(s.in_c * s.in_h * s.in_w)
        .flat_map_iter(|x| conv(s, x, w, b))
        .collect()
}

/// A batch's linear layer outputs before the ReLU: `y = x·Wᵀ + b` for each row of `x`.
pub fn linear_forward(w: &[f64], b: &[f64], x: &[f64], inputs: usize) -> Vec<f64> {
    x.par_chunks(inputs)
        .flat_map_iter(|x| linear(w, b, x))
        .collect()
}

/// A batch's convolution gradients (`s.batch` images, stride 1, no padding): the filter's,
/// the bias's (summed over the batch) and the input's.
pub fn conv_gradients(
    s: &Conv2dShape,
    x: &[f64],
    w: &[f64],
    dy: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (image_in, image_out) = (s.in_c * s.in_h * s.in_w, s.out_c * s.out_h() * s.out_w());
    let (dw_len, b_len) = (s.out_c * s.in_c * s.k_h * s.k_w, s.out_c);
    let per_image: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = x
        .par_chunks(image_in)
        .zip(dy.par_chunks(image_out))
        .map(|(x, dy)| {
            let (mut dw, mut db) = (vec![0.0; dw_len], vec![0.0; b_len]);
            let dx = conv_backward(s, x, w, dy, (&mut dw, &mut db), true);
            (dw, db, dx)
        })
        .collect();
    let (mut dw, mut db, mut dx) = (vec![0.0; dw_len], vec![0.0; b_len], Vec::new());
    for (w, b, x) in per_image {
        dw.iter_mut().zip(&w).for_each(|(a, v)| *a += v);
        db.iter_mut().zip(&b).for_each(|(a, v)| *a += v);
        dx.extend(x);
    }
    (dw, db, dx)
}
