//! The float64 reference of every operation: naive loops written for clarity, sharing no
//! code with any backend. Each function returns the values and, for sums, the magnitude
//! `Σ |term|` that bounds their rounding error (tolerances scale with it: a sum with
//! cancellation can be tiny while its rounding error is not).

#![allow(dead_code)]

use nanoddp::backend::{Conv2dShape, Epilogue, GemmShape, Pool2dShape};

/// Values and their magnitudes.
pub struct Ref {
    pub value: Vec<f64>,
    pub mag: Vec<f64>,
}

impl Ref {
    fn zeros(n: usize) -> Self {
        Ref {
            value: vec![0.0; n],
            mag: vec![0.0; n],
        }
    }
}

/// op(A)[m][k] for packed row-major storage.
fn at(x: &[f64], transposed: bool, rows: usize, cols: usize, r: usize, c: usize) -> f64 {
    if transposed {
        x[c * rows + r]
    } else {
        x[r * cols + c]
    }
}

pub fn gemm(
    s: &GemmShape,
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
    c_in: &[f64],
    ep: Epilogue,
) -> Ref {
    let (alpha, beta, relu) = (ep.alpha as f64, ep.beta as f64, ep.relu);
    let mut out = Ref::zeros(s.m * s.n);
    for i in 0..s.m {
        for j in 0..s.n {
            let (mut v, mut mag) = (0.0, 0.0);
            for k in 0..s.k {
                let t = at(a, s.trans_a, s.m, s.k, i, k) * at(b, s.trans_b, s.k, s.n, k, j);
                v += t;
                mag += t.abs();
            }
            let (mut v, mut mag) = (alpha * v, alpha.abs() * mag);
            if beta != 0.0 {
                v += beta * c_in[i * s.n + j];
                mag += (beta * c_in[i * s.n + j]).abs();
            }
            if let Some(bias) = bias {
                v += bias[j];
                mag += bias[j].abs();
            }
            out.value[i * s.n + j] = if relu { v.max(0.0) } else { v };
            out.mag[i * s.n + j] = mag;
        }
    }
    out
}

/// One multiply of a convolution: the flat indices of the output, the filter tap and the
/// input pixel it reads (`None` where that pixel is padding).
struct Tap {
    y: usize,
    w: usize,
    x: Option<usize>,
}

/// Calls `f` on every (output, filter tap) pair of the convolution, in output order (and
/// within an output in the filter's order). Plain nested loops: the tests' profile compiles
/// at opt-level 1, where an iterator of iterators runs several times slower.
fn for_each_tap(s: &Conv2dShape, mut f: impl FnMut(Tap)) {
    let (oh, ow, window) = (s.out_h(), s.out_w(), s.k_h * s.k_w);
    let input = |p: usize, i: usize, size: usize| {
        (p * s.stride + i).checked_sub(s.pad).filter(|&r| r < size)
    };
    let mut y = 0;
    for n in 0..s.batch {
        for o in 0..s.out_c {
            for p in 0..oh {
                for q in 0..ow {
                    for c in 0..s.in_c {
                        for i in 0..s.k_h {
                            let row = input(p, i, s.in_h).map(|ih| (n * s.in_c + c) * s.in_h + ih);
                            for j in 0..s.k_w {
                                let x = row.zip(input(q, j, s.in_w)).map(|(r, iw)| r * s.in_w + iw);
                                let w = (o * s.in_c + c) * window + i * s.k_w + j;
                                f(Tap { y, w, x });
                            }
                        }
                    }
                    y += 1;
                }
            }
        }
    }
}

impl Ref {
    /// Adds the term `t` to element `at`.
    fn add(&mut self, at: usize, t: f64) {
        self.value[at] += t;
        self.mag[at] += t.abs();
    }
}

pub fn conv_forward(
    s: &Conv2dShape,
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    relu: bool,
) -> Ref {
    let mut out = Ref::zeros(s.sizes().2);
    let plane = s.out_h() * s.out_w();
    if let Some(b) = bias {
        for at in 0..out.value.len() {
            out.add(at, b[at / plane % s.out_c]);
        }
    }
    for_each_tap(s, |t| {
        if let Some(xi) = t.x {
            out.add(t.y, x[xi] * w[t.w]);
        }
    });
    if relu {
        out.value.iter_mut().for_each(|v| *v = v.max(0.0));
    }
    out
}

/// dx: every (output, tap) pair that read x[n][c][ih][iw] contributes dy · w.
pub fn conv_backward_input(s: &Conv2dShape, dy: &[f64], w: &[f64]) -> Ref {
    let mut out = Ref::zeros(s.sizes().0);
    for_each_tap(s, |t| {
        if let Some(xi) = t.x {
            out.add(xi, dy[t.y] * w[t.w]);
        }
    });
    out
}

pub fn conv_backward_filter(s: &Conv2dShape, x: &[f64], dy: &[f64]) -> Ref {
    let mut out = Ref::zeros(s.sizes().1);
    for_each_tap(s, |t| {
        if let Some(xi) = t.x {
            out.add(t.w, dy[t.y] * x[xi]);
        }
    });
    out
}

pub fn conv_backward_bias(s: &Conv2dShape, dy: &[f64]) -> Ref {
    let mut out = Ref::zeros(s.out_c);
    let plane = s.out_h() * s.out_w();
    for (at, &t) in dy.iter().enumerate() {
        out.add(at / plane % s.out_c, t);
    }
    out
}

/// Every (output, window element) pair of the pooling: the output's flat index, the input's
/// flat index, and the element's index within its input plane (what argmax records).
fn windows(s: &Pool2dShape) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let (oh, ow, plane) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    (0..s.planes * oh * ow).flat_map(move |y| {
        let (q, p, pl) = (y % ow, y / ow % oh, y / (ow * oh));
        (0..s.k_h * s.k_w).map(move |t| {
            let (i, j) = (t / s.k_w, t % s.k_w);
            let idx = (p * s.stride + i) * s.in_w + q * s.stride + j;
            (y, pl * plane + idx, idx)
        })
    })
}

/// Max pooling: values and the argmax within each plane (first maximum; NaN wins).
pub fn max_pool_forward(s: &Pool2dShape, x: &[f64]) -> (Vec<f64>, Vec<i32>) {
    let outputs = s.sizes().1;
    let mut best: Vec<Option<(f64, usize)>> = vec![None; outputs];
    for (y, at, idx) in windows(s) {
        let v = x[at];
        best[y] = match best[y] {
            None => Some((v, idx)),
            Some((b, _)) if v > b || (v.is_nan() && !b.is_nan()) => Some((v, idx)),
            keep => keep,
        };
    }
    best.into_iter()
        .map(|b| {
            let (v, idx) = b.expect("non-empty window");
            (v, idx as i32)
        })
        .unzip()
}

pub fn max_pool_backward(s: &Pool2dShape, dy: &[f64], argmax: &[i32]) -> Ref {
    let mut out = Ref::zeros(s.sizes().0);
    let (plane, out_plane) = (s.in_h * s.in_w, s.out_h() * s.out_w());
    for (y, &g) in dy.iter().enumerate() {
        out.add(y / out_plane * plane + argmax[y] as usize, g);
    }
    out
}

pub fn avg_pool_forward(s: &Pool2dShape, x: &[f64]) -> Ref {
    let mut out = Ref::zeros(s.sizes().1);
    let area = (s.k_h * s.k_w) as f64;
    for (y, at, _) in windows(s) {
        out.add(y, x[at] / area);
    }
    out
}

pub fn avg_pool_backward(s: &Pool2dShape, dy: &[f64]) -> Ref {
    let mut out = Ref::zeros(s.sizes().0);
    let area = (s.k_h * s.k_w) as f64;
    for (y, at, _) in windows(s) {
        out.add(at, dy[y] / area);
    }
    out
}

/// Per-row loss, the gradient of the mean loss times `grad_scale`, and the correct count.
pub fn softmax_cross_entropy(
    classes: usize,
    logits: &[f64],
    labels: &[u8],
    grad_scale: f64,
) -> (Vec<f64>, Vec<f64>, i32) {
    let rows = labels.len();
    let (mut loss, mut grad, mut correct) = (vec![0.0; rows], vec![0.0; rows * classes], 0);
    for r in 0..rows {
        let z = &logits[r * classes..(r + 1) * classes];
        let label = labels[r] as usize;
        let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = z.iter().map(|v| (v - max).exp()).sum();
        loss[r] = if label < classes {
            max + sum.ln() - z[label]
        } else {
            f64::NAN
        };
        for c in 0..classes {
            let p = (z[c] - max).exp() / sum;
            grad[r * classes + c] = (p - if c == label { 1.0 } else { 0.0 }) * grad_scale;
        }
        let first_max = (0..classes).find(|&c| z[c] == max);
        if label < classes && first_max == Some(label) {
            correct += 1;
        }
    }
    (loss, grad, correct)
}
