//! Fused softmax cross-entropy (`kernels/loss.cu` and the CPU backend) against the float64
//! reference: per-row loss, the logits' gradient (scaled), and the correct count; 10 classes
//! (LeNet) and 37 (more than a warp's lanes), 1 and 257 rows, large logits (no overflow),
//! fp32, fp16 and bf16, and an out-of-range label.

mod common;

use common::reference as r;
use common::{assert_close, bytes, per_backend, rng, wide, Tol, BF16, F16, F32};
use half::{bf16, f16};
use nanoddp::backend::{Backend, Precision};
use rand::Rng;

fn loss_case<B: Backend, T: Precision>(
    dev: &B,
    seed: u64,
    rows: usize,
    classes: usize,
    spread: f32,
    grad_tol: Tol,
) -> Vec<u8> {
    let mut g = rng(seed);
    let logits: Vec<T> = (0..rows * classes)
        .map(|_| T::from_f32(g.gen_range(-spread..spread)))
        .collect();
    let labels: Vec<u8> = (0..rows).map(|_| g.gen_range(0..classes as u8)).collect();
    let grad_scale = 1.0 / rows as f32 * 128.0; // mean loss, times a loss scale
    let (dl, dlab) = (dev.upload(&logits).unwrap(), dev.upload(&labels).unwrap());
    let mut loss = dev.upload(&vec![f32::NAN; rows]).unwrap();
    let mut grad = dev
        .upload(&vec![T::from_f32(f32::NAN); rows * classes])
        .unwrap();
    let mut correct = dev.upload(&[5i32]).unwrap(); // accumulates onto what is there
    dev.softmax_cross_entropy(
        rows,
        classes,
        &dl,
        &dlab,
        &mut loss,
        Some(&mut grad),
        &mut correct,
        grad_scale,
        None,
    )
    .unwrap();
    let (want_loss, want_grad, want_correct) =
        r::softmax_cross_entropy(classes, &wide(&logits), &labels, grad_scale as f64);
    let got_loss = dev.download(&loss).unwrap();
    let got_grad = dev.download(&grad).unwrap();
    let what = format!("{rows} rows x {classes} classes, logits ±{spread}");
    // The loss is a difference of O(spread) terms: scale the tolerance by the largest.
    let loss_mag: Vec<f64> = want_loss
        .iter()
        .map(|l| l.abs() + 2.0 * spread as f64)
        .collect();
    assert_close(
        &format!("loss, {what}"),
        &got_loss,
        &want_loss,
        &loss_mag,
        F32,
    );
    let grad_mag = vec![grad_scale as f64; want_grad.len()];
    assert_close(
        &format!("gradient, {what}"),
        &got_grad,
        &want_grad,
        &grad_mag,
        grad_tol,
    );
    assert_eq!(
        dev.download(&correct).unwrap()[0],
        5 + want_correct,
        "correct count, {what}"
    );

    // Without a gradient buffer: the same loss, the count added again.
    dev.softmax_cross_entropy::<T>(
        rows,
        classes,
        &dl,
        &dlab,
        &mut loss,
        None,
        &mut correct,
        grad_scale,
        None,
    )
    .unwrap();
    assert_eq!(dev.download(&correct).unwrap()[0], 5 + 2 * want_correct);
    let mut out = bytes(&got_loss);
    out.extend(bytes(&got_grad));
    out
}

fn loss_f32<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = loss_case::<B, f32>(dev, 30, 257, 10, 4.0, F32);
    out.extend(loss_case::<B, f32>(dev, 31, 1, 37, 4.0, F32));
    out.extend(loss_case::<B, f32>(dev, 32, 33, 10, 80.0, F32)); // exp(80) overflows f32 unshifted
    out
}

fn loss_f16<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = loss_case::<B, f16>(dev, 33, 257, 10, 4.0, F16);
    out.extend(loss_case::<B, f16>(dev, 34, 3, 37, 8.0, F16));
    out
}

fn loss_bf16<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = loss_case::<B, bf16>(dev, 35, 257, 10, 4.0, BF16);
    out.extend(loss_case::<B, bf16>(dev, 36, 3, 37, 8.0, BF16));
    out
}

fn out_of_range_label_gives_nan_loss<B: Backend>(dev: &B) -> Vec<u8> {
    let logits = dev.upload(&[0.0f32, 1.0, 2.0, 3.0, 2.0, 1.0]).unwrap();
    let labels = dev.upload(&[2u8, 7]).unwrap(); // 7 >= 3 classes
    let mut loss = dev.upload(&[0.0f32; 2]).unwrap();
    let mut correct = dev.upload(&[0i32]).unwrap();
    dev.softmax_cross_entropy::<f32>(
        2,
        3,
        &logits,
        &labels,
        &mut loss,
        None,
        &mut correct,
        1.0,
        None,
    )
    .unwrap();
    let loss = dev.download(&loss).unwrap();
    assert!(loss[0].is_finite() && loss[1].is_nan(), "{loss:?}");
    assert_eq!(
        dev.download(&correct).unwrap()[0],
        1,
        "only the valid row counts"
    );
    bytes(&loss)
}

// The softmax's expf and logf: within tolerance of float64 on every executor, not bit for
// bit between the two (common::per_backend).
per_backend!(
    approximate: loss_f32,
    loss_f16,
    loss_bf16
);
per_backend!(out_of_range_label_gives_nan_loss);
