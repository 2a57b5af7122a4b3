//! Every backward pass of the float64 reference against central finite differences of its
//! forward pass, in float64. The backends' backward passes are checked against these same
//! reference functions (tests/conv.rs, pool.rs, loss.rs, gemm.rs), so each backward kernel
//! is tied to the derivative of its forward, not just to another implementation.
//!
//! For an op y = f(x) and random weights r, L(x) = Σ r·f(x) has ∂L/∂x = backward(dy = r).

mod common;

use common::reference as r;
use common::{conv_shape, pool_shape, rng};
use nanoddp::backend::Epilogue;
use rand::Rng;

fn random(g: &mut impl Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| g.gen_range(-1.0..1.0)).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// ∂f/∂x_i by central differences, h = 1e-5: truncation error O(h²) ≈ 1e-10 relative.
fn numeric_gradient(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-5;
    (0..x.len())
        .map(|i| {
            let (mut up, mut down) = (x.to_vec(), x.to_vec());
            up[i] += h;
            down[i] -= h;
            (f(&up) - f(&down)) / (2.0 * h)
        })
        .collect()
}

fn assert_matches(what: &str, analytic: &[f64], numeric: &[f64]) {
    assert_eq!(analytic.len(), numeric.len());
    for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
        assert!(
            (a - n).abs() <= 1e-7 * (1.0 + n.abs()),
            "{what}[{i}]: backward {a} vs finite difference {n}"
        );
    }
}

#[test]
fn conv_backward_passes_are_the_derivatives_of_the_forward() {
    let shapes = [
        conv_shape(2, 2, (6, 5), 3, (3, 3), 1, 1),
        conv_shape(1, 3, (7, 7), 2, (5, 5), 2, 2),
        conv_shape(2, 1, (8, 8), 2, (5, 5), 1, 0),
    ];
    let mut g = rng(50);
    for s in shapes {
        let (xs, ws, ys) = s.sizes();
        let (x, w, b, dy) = (
            random(&mut g, xs),
            random(&mut g, ws),
            random(&mut g, s.out_c),
            random(&mut g, ys),
        );
        let loss = |x: &[f64], w: &[f64], b: &[f64]| {
            dot(&dy, &r::conv_forward(&s, x, w, Some(b), false).value)
        };
        assert_matches(
            "dx",
            &r::conv_backward_input(&s, &dy, &w).value,
            &numeric_gradient(&x, |x| loss(x, &w, &b)),
        );
        assert_matches(
            "dw",
            &r::conv_backward_filter(&s, &x, &dy).value,
            &numeric_gradient(&w, |w| loss(&x, w, &b)),
        );
        assert_matches(
            "db",
            &r::conv_backward_bias(&s, &dy).value,
            &numeric_gradient(&b, |b| loss(&x, &w, b)),
        );
    }
}

#[test]
fn linear_layer_backward_gemms_are_the_derivatives_of_the_forward() {
    // y = x·Wᵀ + b with x: batch x in, W: out x in. Backward: dx = dy·W, dW = dyᵀ·x, db = Σ dy.
    let (batch, inp, out) = (3, 5, 4);
    let mut g = rng(51);
    let (x, w, b, dy) = (
        random(&mut g, batch * inp),
        random(&mut g, out * inp),
        random(&mut g, out),
        random(&mut g, batch * out),
    );
    // The model's own products for a linear layer (what fc1 and fc2 run).
    let layer = nanoddp::model::Linear {
        batch,
        inputs: inp,
        outputs: out,
    };
    let fwd = layer.forward();
    let loss = |x: &[f64], w: &[f64], b: &[f64]| {
        dot(
            &dy,
            &r::gemm(&fwd, x, w, Some(b), &[], Epilogue::default()).value,
        )
    };
    let dx = r::gemm(
        &layer.input_gradient(),
        &dy,
        &w,
        None,
        &[],
        Epilogue::default(),
    );
    assert_matches("dx", &dx.value, &numeric_gradient(&x, |x| loss(x, &w, &b)));
    let dw = r::gemm(
        &layer.weight_gradient(),
        &dy,
        &x,
        None,
        &[],
        Epilogue::default(),
    );
    assert_matches("dW", &dw.value, &numeric_gradient(&w, |w| loss(&x, w, &b)));
    let db: Vec<f64> = (0..out)
        .map(|j| (0..batch).map(|i| dy[i * out + j]).sum())
        .collect();
    assert_matches("db", &db, &numeric_gradient(&b, |b| loss(&x, &w, b)));
}

#[test]
fn pooling_backward_passes_are_the_derivatives_of_the_forward() {
    let shapes = [
        pool_shape(2, (6, 6), (2, 2), 2),
        pool_shape(1, (7, 8), (3, 3), 2), // overlapping windows
        pool_shape(1, (5, 5), (3, 2), 1),
    ];
    let mut g = rng(52);
    for s in shapes {
        let (xs, ys) = s.sizes();
        // Distinct values: no ties, so the max is differentiable at x.
        let x: Vec<f64> = (0..xs)
            .map(|i| i as f64 * 0.37 % 1.0 + g.gen_range(0.0..1e-3))
            .collect();
        let dy = random(&mut g, ys);
        let (_, argmax) = r::max_pool_forward(&s, &x);
        let max_loss = |x: &[f64]| dot(&dy, &r::max_pool_forward(&s, x).0);
        assert_matches(
            "max dx",
            &r::max_pool_backward(&s, &dy, &argmax).value,
            &numeric_gradient(&x, max_loss),
        );
        let avg_loss = |x: &[f64]| dot(&dy, &r::avg_pool_forward(&s, x).value);
        assert_matches(
            "avg dx",
            &r::avg_pool_backward(&s, &dy).value,
            &numeric_gradient(&x, avg_loss),
        );
    }
}

#[test]
fn softmax_cross_entropy_gradient_is_the_derivative_of_the_loss() {
    for (rows, classes) in [(4, 10), (1, 37), (3, 2)] {
        let mut g = rng(53 + rows as u64);
        let logits: Vec<f64> = (0..rows * classes)
            .map(|_| g.gen_range(-3.0..3.0))
            .collect();
        let labels: Vec<u8> = (0..rows).map(|_| g.gen_range(0..classes as u8)).collect();
        let scale = 1.0 / rows as f64; // the mean loss
        let (_, grad, _) = r::softmax_cross_entropy(classes, &logits, &labels, scale);
        let mean_loss = |z: &[f64]| {
            r::softmax_cross_entropy(classes, z, &labels, scale)
                .0
                .iter()
                .sum::<f64>()
                * scale
        };
        assert_matches("dlogits", &grad, &numeric_gradient(&logits, mean_loss));
    }
}

#[test]
fn relu_backward_is_the_derivative_of_relu() {
    let mut g = rng(54);
    // Away from the kink at 0, where the derivative is undefined.
    let x: Vec<f64> = (0..50)
        .map(|_| g.gen_range(0.01..1.0) * if g.gen() { 1.0 } else { -1.0 })
        .collect();
    let dy = random(&mut g, 50);
    let relu_loss = |x: &[f64]| x.iter().zip(&dy).map(|(x, d)| x.max(0.0) * d).sum::<f64>();
    // The backends compute dx = dy where the forward *output* y > 0.
    let analytic: Vec<f64> = x
        .iter()
        .zip(&dy)
        .map(|(x, d)| if x.max(0.0) > 0.0 { *d } else { 0.0 })
        .collect();
    assert_matches("relu dx", &analytic, &numeric_gradient(&x, relu_loss));
}
