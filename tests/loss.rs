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

/// `Backend::softmax_head` (a linear layer, the loss, the shard's statistics and every
/// gradient, one launch on the kernel backends) against float64, from logits rounded to the
/// storage type as the layer's output is: `rows` not a multiple of the kernel's 32-row
/// blocks, one block and many (past 16: the two-level split sum), `hidden` not a multiple of
/// its 4-float loads,
/// `classes` past a warp (the kernels' unfused way), poisoned outputs, statistics added onto
/// what is there.
fn head_case<B: Backend, T: Precision>(
    dev: &B,
    seed: u64,
    (rows, hidden, classes): (usize, usize, usize),
    tol: Tol,
) -> Vec<u8> {
    use nanoddp::backend::op::HeadGradient;
    let mut g = rng(seed);
    // h is a ReLU's output: a third of it zero.
    let h: Vec<T> = (0..rows * hidden)
        .map(|_| T::from_f32(g.gen_range(-0.5f32..1.0).max(0.0)))
        .collect();
    let w: Vec<T> = (0..classes * hidden)
        .map(|_| T::from_f32(g.gen_range(-1.0f32..1.0)))
        .collect();
    let b: Vec<f32> = (0..classes).map(|_| g.gen_range(-1.0f32..1.0)).collect();
    let labels: Vec<u8> = (0..rows).map(|_| g.gen_range(0..classes as u8)).collect();
    let grad_scale = 128.0 / rows as f32;
    let (hw, ww) = (wide(&h), wide(&w));
    // Logits in float64, then rounded to T as the layer's output.
    let mut z = vec![0.0f64; rows * classes];
    for r in 0..rows {
        for c in 0..classes {
            let s: f64 = (0..hidden)
                .map(|k| hw[r * hidden + k] * ww[c * hidden + k])
                .sum();
            z[r * classes + c] = T::from_f32((s + b[c] as f64) as f32).to_f32() as f64;
        }
    }
    let (want_loss, want_dl, want_correct) =
        r::softmax_cross_entropy(classes, &z, &labels, grad_scale as f64);
    let (mut want_dw, mut dw_mag) = (vec![0.0; classes * hidden], vec![0.0; classes * hidden]);
    let (mut want_db, db_mag) = (
        vec![0.0; classes],
        vec![rows as f64 * grad_scale as f64; classes],
    );
    let (mut want_dh, mut dh_mag) = (vec![0.0; rows * hidden], vec![0.0; rows * hidden]);
    let (mut want_bias, mut bias_mag) = (vec![0.0; hidden], vec![0.0; hidden]);
    let scale = grad_scale as f64;
    for r in 0..rows {
        for c in 0..classes {
            let d = want_dl[r * classes + c];
            want_db[c] += d;
            for k in 0..hidden {
                want_dw[c * hidden + k] += d * hw[r * hidden + k];
                dw_mag[c * hidden + k] += scale * hw[r * hidden + k].abs();
                if hw[r * hidden + k] > 0.0 {
                    want_dh[r * hidden + k] += d * ww[c * hidden + k];
                    dh_mag[r * hidden + k] += scale * ww[c * hidden + k].abs();
                }
            }
        }
        for k in 0..hidden {
            want_bias[k] += want_dh[r * hidden + k];
            bias_mag[k] += dh_mag[r * hidden + k];
        }
    }

    let up = |v: &[T]| dev.upload(v).unwrap();
    let (dh_in, dw_in) = (up(&h), up(&w));
    let db_in = dev.upload(&b).unwrap();
    let dlab = dev.upload(&labels).unwrap();
    let poison = T::from_f32(f32::NAN);
    let mut logits = dev.upload(&vec![poison; rows * classes]).unwrap();
    let mut loss = dev.upload(&vec![f32::NAN; rows]).unwrap();
    let mut stats = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let mut d_logits = dev.upload(&vec![poison; rows * classes]).unwrap();
    let mut dw = dev.upload(&vec![f32::NAN; classes * hidden]).unwrap();
    let mut db = dev.upload(&vec![f32::NAN; classes]).unwrap();
    let mut dh = dev.upload(&vec![poison; rows * hidden]).unwrap();
    let mut dh_bias = dev.upload(&vec![f32::NAN; hidden]).unwrap();
    let grad = HeadGradient {
        grad_scale,
        at: None,
        d_logits: &mut d_logits,
        dw: &mut dw,
        db: &mut db,
        dh: &mut dh,
        dh_bias: &mut dh_bias,
    };
    dev.softmax_head(
        rows,
        hidden,
        classes,
        &dh_in,
        &dw_in,
        &db_in,
        &dlab,
        &mut logits,
        &mut loss,
        &mut stats,
        true,
        Some(grad),
    )
    .unwrap();
    let what = format!("{rows} rows x {hidden} inputs x {classes} classes");
    let got_logits = dev.download(&logits).unwrap();
    let z_mag: Vec<f64> = (0..rows * classes)
        .map(|i| {
            let (r, c) = (i / classes, i % classes);
            (0..hidden)
                .map(|k| (hw[r * hidden + k] * ww[c * hidden + k]).abs())
                .sum::<f64>()
                + (b[c] as f64).abs()
        })
        .collect();
    assert_close(&format!("logits, {what}"), &got_logits, &z, &z_mag, tol);
    let got_loss = dev.download(&loss).unwrap();
    let loss_mag: Vec<f64> = want_loss.iter().map(|l| l.abs() + 8.0).collect();
    assert_close(
        &format!("loss, {what}"),
        &got_loss,
        &want_loss,
        &loss_mag,
        tol,
    );
    let dl_mag = vec![scale; rows * classes];
    let got_dl = dev.download(&d_logits).unwrap();
    assert_close(
        &format!("d_logits, {what}"),
        &got_dl,
        &want_dl,
        &dl_mag,
        tol,
    );
    let got_dw = dev.download(&dw).unwrap();
    assert_close(&format!("dw, {what}"), &got_dw, &want_dw, &dw_mag, tol);
    let got_db = dev.download(&db).unwrap();
    assert_close(&format!("db, {what}"), &got_db, &want_db, &db_mag, tol);
    let got_dh = dev.download(&dh).unwrap();
    assert_close(&format!("dh, {what}"), &got_dh, &want_dh, &dh_mag, tol);
    for (i, (&got, &hv)) in got_dh.iter().zip(&hw).enumerate() {
        if hv <= 0.0 {
            assert_eq!(got.to_f32(), 0.0, "dh[{i}] where h is not positive, {what}");
        }
    }
    let got_bias = dev.download(&dh_bias).unwrap();
    assert_close(
        &format!("dh_bias, {what}"),
        &got_bias,
        &want_bias,
        &bias_mag,
        tol,
    );
    let got_stats = dev.download(&stats).unwrap();
    let loss_sum: f64 = want_loss.iter().sum();
    let sum_mag: f64 = loss_mag.iter().sum();
    assert_close(
        &format!("stats (added onto 1, 2, 3), {what}"),
        &got_stats,
        &[1.0 + loss_sum, 2.0 + want_correct as f64, 3.0 + rows as f64],
        &[sum_mag, 0.0, 0.0],
        F32,
    );

    // Evaluation: no gradient asked, none written; the statistics replaced.
    let mut fresh = dev.upload(&[f32::NAN; 3]).unwrap();
    let mut logits2 = dev.upload(&vec![poison; rows * classes]).unwrap();
    dev.softmax_head::<T>(
        rows,
        hidden,
        classes,
        &dh_in,
        &dw_in,
        &db_in,
        &dlab,
        &mut logits2,
        &mut loss,
        &mut fresh,
        false,
        None,
    )
    .unwrap();
    assert_eq!(dev.download(&logits2).unwrap().len(), rows * classes);
    let got_fresh = dev.download(&fresh).unwrap();
    assert_close(
        &format!("stats (replaced), {what}"),
        &got_fresh,
        &[loss_sum, want_correct as f64, rows as f64],
        &[sum_mag, 0.0, 0.0],
        F32,
    );
    let mut out = bytes(&got_stats);
    out.extend(bytes(&got_dw));
    out.extend(bytes(&got_bias));
    out
}

const HEAD_SHAPES: [(usize, usize, usize); 4] =
    [(37, 33, 10), (256, 128, 10), (601, 40, 7), (5, 20, 37)];

fn head_f32<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, shape) in HEAD_SHAPES.into_iter().enumerate() {
        out.extend(head_case::<B, f32>(dev, 40 + i as u64, shape, F32));
    }
    // A weight one short is refused before anything runs, naming the operation and buffer.
    let (h, w, b) = (
        dev.upload(&[0.5f32; 6]).unwrap(),
        dev.upload(&[0.5f32; 5]).unwrap(),
        dev.upload(&[0.0f32; 2]).unwrap(),
    );
    let labels = dev.upload(&[0u8, 1]).unwrap();
    let (mut logits, mut loss) = (
        dev.upload(&[0.0f32; 4]).unwrap(),
        dev.upload(&[0.0f32; 2]).unwrap(),
    );
    let mut stats = dev.upload(&[0.0f32; 3]).unwrap();
    let e = dev
        .softmax_head::<f32>(
            2,
            3,
            2,
            &h,
            &w,
            &b,
            &labels,
            &mut logits,
            &mut loss,
            &mut stats,
            false,
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("softmax_head") && e.contains("`w`"), "{e}");
    out
}

fn head_f16<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, shape) in HEAD_SHAPES.into_iter().enumerate() {
        out.extend(head_case::<B, f16>(dev, 50 + i as u64, shape, F16));
    }
    out
}

fn head_bf16<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, shape) in HEAD_SHAPES.into_iter().enumerate() {
        out.extend(head_case::<B, bf16>(dev, 60 + i as u64, shape, BF16));
    }
    out
}

per_backend!(
    approximate: head_f32,
    head_f16,
    head_bf16
);
