//! Convolution (`kernels/conv.cu` and the CPU backend) against the float64 reference:
//! forward with and without the fused bias + ReLU, and the three backward passes, for
//! the trained model's layers and the classic LeNet-5's, 3x3 windows with padding and stride, batch 1 and 257, fp32 and half; and
//! the fused calls the trainer uses.

mod common;

use common::reference as r;
use common::{
    assert_close, bytes, check_and_record, check_download, conv_shape as shape, per_backend,
    random, rng, wide, Tol, BF16, F16, F32, F32_LONG,
};
use half::{bf16, f16};
use nanoddp::backend::{Backend, Conv2dShape, Pool2dShape, Precision};

fn shapes() -> Vec<Conv2dShape> {
    vec![
        // The classic LeNet-5's conv1 and conv2 (6 and 16 channels, 5x5): not the model
        // trained here, whose conv2 and conv1 come below.
        shape(3, 1, (28, 28), 6, (5, 5), 1, 0),
        shape(2, 6, (12, 12), 16, (5, 5), 1, 0),
        shape(1, 3, (7, 9), 5, (3, 3), 1, 1), // 3x3, padded, batch 1, non-square
        shape(2, 2, (11, 10), 3, (3, 3), 2, 1), // stride 2: taps that skip input pixels
        shape(1, 1, (1, 1), 1, (1, 1), 1, 0), // the degenerate 1x1
        shape(2, 45, (6, 6), 2, (5, 5), 1, 2), // 45·25 = 1125 filter taps: two shared-memory passes
        shape(257, 1, (6, 5), 2, (3, 2), 1, 0), // batch 257
        // The trained conv2 (20→50 channels, 5x5, on 13x13) at a batch of two image groups
        // and one image: the CPU's 10-row register tiles, masked column edges and partial
        // filter-gradient chunks. (Batch 2 and 6 output channels on the PTX executor: see
        // `common::Lean`.)
        Conv2dShape {
            batch: common::sized(17, 2),
            out_c: common::sized(50, 6),
            ..nanoddp::model::conv2(17)
        },
        shape(9, 3, (10, 11), 13, (3, 3), 1, 0), // 13 output channels: a 3-row tile
        // 72 taps (the CPU reads the images in place from 64): strided and padded windows,
        // and 70 channels (a full and a 6-channel chunk of its window tile).
        shape(3, 8, (9, 7), 70, (3, 3), 2, 1),
        // The trained conv1 (1→20 channels, 3x3, on 28x28); last, so that the cases above
        // keep their random inputs.
        nanoddp::model::conv1(3),
    ]
}

fn conv_all<B: Backend, T: Precision>(dev: &B, seed: u64, tol: Tol, tol_reduce: Tol) -> Vec<u8> {
    let mut out = Vec::new();
    let mut g = rng(seed);
    for (i, s) in shapes().into_iter().enumerate() {
        let (xs, ws, ys) = s.sizes();
        let x: Vec<T> = random(&mut g, xs);
        let w: Vec<T> = random(&mut g, ws);
        let bias: Vec<f32> = random(&mut g, s.out_c);
        let dy: Vec<T> = random(&mut g, ys);
        let (dx_, dw_, dy_) = (
            dev.upload(&x).unwrap(),
            dev.upload(&w).unwrap(),
            dev.upload(&dy).unwrap(),
        );
        let dbias = dev.upload(&bias).unwrap();
        let poison = |n| vec![T::from_f32(f32::NAN); n];

        let with_bias = i % 2 == 0;
        let relu = i % 3 != 1;
        let mut y = dev.upload(&poison(ys)).unwrap();
        dev.conv2d_forward(&s, &dx_, &dw_, with_bias.then_some(&dbias), &mut y, relu)
            .unwrap();
        let want = r::conv_forward(
            &s,
            &wide(&x),
            &wide(&w),
            with_bias.then(|| wide(&bias)).as_deref(),
            relu,
        );
        let what = format!("forward {s:?} bias {with_bias} relu {relu}");
        check_download(dev, &y, &what, &want, tol, &mut out);

        let mut dx = dev.upload(&poison(xs)).unwrap();
        dev.conv2d_backward_input(&s, &dy_, &dw_, &mut dx).unwrap();
        let want = r::conv_backward_input(&s, &wide(&dy), &wide(&w));
        let what = format!("backward input {s:?}");
        check_download(dev, &dx, &what, &want, tol, &mut out);

        let mut dw = dev.upload(&vec![f32::NAN; ws]).unwrap();
        dev.conv2d_backward_filter(&s, &dx_, &dy_, &mut dw).unwrap();
        let want = r::conv_backward_filter(&s, &wide(&x), &wide(&dy));
        let what = format!("backward filter {s:?}");
        check_download(dev, &dw, &what, &want, tol_reduce, &mut out);

        let mut db = dev.upload(&vec![f32::NAN; s.out_c]).unwrap();
        dev.conv2d_backward_bias(&s, &dy_, &mut db).unwrap();
        let want = r::conv_backward_bias(&s, &wide(&dy));
        let what = format!("backward bias {s:?}");
        check_download(dev, &db, &what, &want, tol_reduce, &mut out);
    }
    out
}

fn conv_f32<B: Backend>(dev: &B) -> Vec<u8> {
    conv_all::<B, f32>(dev, 10, F32, F32_LONG)
}

fn conv_f16<B: Backend>(dev: &B) -> Vec<u8> {
    // Weight and bias gradients are f32 sums of exact half products: f32 tolerance.
    conv_all::<B, f16>(dev, 11, F16, F32_LONG)
}

fn conv_bf16<B: Backend>(dev: &B) -> Vec<u8> {
    // As for f16: the f32 gradients of exact bf16 products keep the f32 tolerance.
    conv_all::<B, bf16>(dev, 14, BF16, F32_LONG)
}

fn bad_conv_shapes_are_errors<B: Backend>(dev: &B) -> Vec<u8> {
    let s = shape(1, 1, (4, 4), 1, (5, 5), 1, 0); // the window does not fit
    let x = dev.upload(&[0.0f32; 16]).unwrap();
    let w = dev.upload(&[0.0f32; 25]).unwrap();
    let mut y = dev.upload(&[0.0f32; 1]).unwrap();
    let e = dev
        .conv2d_forward(&s, &x, &w, None, &mut y, false)
        .unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    let zero_stride = Conv2dShape {
        stride: 0,
        ..shape(1, 1, (4, 4), 1, (3, 3), 1, 0)
    };
    assert!(dev
        .conv2d_forward(&zero_stride, &x, &w, None, &mut y, false)
        .is_err());
    let ok = shape(1, 1, (4, 4), 1, (3, 3), 1, 0);
    let e = dev
        .conv2d_forward(&ok, &x, &w, None, &mut y, false)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("buffer `w` holds 25 elements, the shape needs 9"),
        "{e}"
    );
    Vec::new()
}

/// The fused calls against the float64 reference of the separate operations:
/// convolution + ReLU + average pool forward, average pool + ReLU backward, the filter and
/// bias gradients together, the whole backward pass (filter, bias, input), and a first
/// and a later layer's backward from its pool's output gradient. Pools that tile the plane, that leave its last row and column
/// uncovered (9x9 by 2), and that overlap (3 by 2). (Batch 2, and conv2's case with 6 output
/// channels, on the PTX executor: see `common::Lean`.)
/// Which pixels of a plane some window of `pool` reads, row by row.
fn pool_reads(pool: &Pool2dShape) -> Vec<bool> {
    let covered = |at: usize, windows: usize, k: usize| {
        (0..windows).any(|a| (a * pool.stride..a * pool.stride + k).contains(&at))
    };
    (0..pool.in_h * pool.in_w)
        .map(|i| {
            covered(i / pool.in_w, pool.out_h(), pool.k_h)
                && covered(i % pool.in_w, pool.out_w(), pool.k_w)
        })
        .collect()
}

/// A first layer's passes without `y` against the passes that keep it, on the forward's own
/// `y`: the pooled-only forward gives the forward's pooled output, and the backward that
/// recomputes the ReLU's output gives the same filter and bias gradients as the backward
/// reading `y`, bit for bit (the forward rounds `y` to T, the recompute rounds it the same
/// way). The recomputed gradients are also checked against float64 with the ReLU's mask
/// taken from `y`. Returns the recomputed results' bytes.
fn recomputed_matches_kept<B: Backend, T: Precision>(
    dev: &B,
    (s, pool): (&Conv2dShape, &Pool2dShape),
    (x, w, bias): (&[T], &[T], &[f32]),
    d_pooled: &[T],
    tol: Tol,
) -> Vec<u8> {
    let (_, ws, ys) = s.sizes();
    let ps = pool.sizes().1;
    // Channel 0 outputs its bias alone, 1e-9: above zero in f32 and bf16, zero once rounded
    // to f16, so a recompute that skipped the forward's rounding would pass gradients that
    // the kept `y` stops.
    let (mut w, mut bias) = (w.to_vec(), bias.to_vec());
    w[..ws / s.out_c].fill(T::from_f32(0.0));
    bias[0] = 1e-9;
    let up = |v: &[T]| dev.upload(v).unwrap();
    let poison = |n| vec![T::from_f32(f32::NAN); n];
    let (x_, w_, b_, dp_) = (up(x), up(&w), dev.upload(&bias).unwrap(), up(d_pooled));
    let (mut y, mut pooled, mut pooled_only) = (up(&poison(ys)), up(&poison(ps)), up(&poison(ps)));
    dev.conv2d_relu_avg_pool_forward(s, pool, &x_, &w_, Some(&b_), &mut y, &mut pooled)
        .unwrap();
    dev.conv2d_relu_avg_pool_forward_pooled(s, pool, &x_, &w_, Some(&b_), &mut pooled_only)
        .unwrap();
    let pooled_only = dev.download(&pooled_only).unwrap();
    assert_eq!(
        bytes(&pooled_only),
        bytes(&dev.download(&pooled).unwrap()),
        "pooled-only forward {s:?}"
    );
    let nan = |n| dev.upload(&vec![f32::NAN; n]).unwrap();
    let (mut dw, mut db, mut workspace) = (nan(ws), nan(s.out_c), up(&poison(ys)));
    dev.conv2d_relu_avg_pool_backward(
        s,
        pool,
        &x_,
        &y,
        &dp_,
        &mut dw,
        &mut db,
        None,
        &mut workspace,
    )
    .unwrap();
    let (mut dw_re, mut db_re) = (nan(ws), nan(s.out_c));
    dev.conv2d_relu_avg_pool_backward_recomputed(
        s,
        pool,
        &x_,
        &w_,
        Some(&b_),
        &dp_,
        &mut dw_re,
        &mut db_re,
    )
    .unwrap();
    let mut out = bytes(&pooled_only);
    for (what, kept, re) in [("filter", &dw, &dw_re), ("bias", &db, &db_re)] {
        let re = dev.download(re).unwrap();
        let kept = dev.download(kept).unwrap();
        assert_eq!(bytes(&re), bytes(&kept), "recomputed {what} gradient {s:?}");
        out.extend(bytes(&re));
    }
    let (y, spread) = (
        dev.download(&y).unwrap(),
        r::avg_pool_backward(pool, &wide(d_pooled)),
    );
    let dy: Vec<f64> = (0..ys)
        .map(|i| {
            if y[i].to_f32() > 0.0 {
                spread.value[i]
            } else {
                0.0
            }
        })
        .collect();
    let want = r::conv_backward_filter(s, &wide(x), &dy);
    check_download(dev, &dw_re, "recomputed filter", &want, tol, &mut out);
    let want = r::conv_backward_bias(s, &dy);
    check_download(dev, &db_re, "recomputed bias", &want, tol, &mut out);
    out
}

fn fused_all<B: Backend, T: Precision>(dev: &B, seed: u64, tol: Tol, tol_reduce: Tol) -> Vec<u8> {
    let mut out = Vec::new();
    let mut g = rng(seed);
    let (batch, channels) = (|full| common::sized(full, 2), common::sized(50, 6));
    let cases = [
        (shape(batch(9), 1, (28, 28), 20, (3, 3), 1, 0), 2, 2),
        (shape(batch(17), 20, (13, 13), channels, (5, 5), 1, 0), 2, 2),
        (shape(3, 2, (9, 10), 7, (3, 3), 1, 1), 3, 2),
        // A one-channel layer of few taps (the kernels' direct convolution where they have
        // one), padded, with odd planes (11x9: the pool's windows leave the last row and
        // column) and 6 channels (a partial group of the filter gradient's four).
        (shape(5, 1, (11, 9), 6, (3, 3), 1, 1), 2, 2),
    ];
    for (s, k, stride) in cases {
        let pool = Pool2dShape {
            planes: s.batch * s.out_c,
            in_h: s.out_h(),
            in_w: s.out_w(),
            k_h: k,
            k_w: k,
            stride,
        };
        let (xs, ws, ys) = s.sizes();
        let ps = pool.sizes().1;
        let x: Vec<T> = random(&mut g, xs);
        let w: Vec<T> = random(&mut g, ws);
        let bias: Vec<f32> = random(&mut g, s.out_c);
        let (x_, w_, b_) = (
            dev.upload(&x).unwrap(),
            dev.upload(&w).unwrap(),
            dev.upload(&bias).unwrap(),
        );
        let poison = |n| vec![T::from_f32(f32::NAN); n];

        let mut y = dev.upload(&poison(ys)).unwrap();
        let mut pooled = dev.upload(&poison(ps)).unwrap();
        dev.conv2d_relu_avg_pool_forward(&s, &pool, &x_, &w_, Some(&b_), &mut y, &mut pooled)
            .unwrap();
        let want_y = r::conv_forward(&s, &wide(&x), &wide(&w), Some(&wide(&bias)), true);
        let got_y = dev.download(&y).unwrap();
        // y is defined where a window of the pool reads it (what the backward needs): a fused
        // 2x2 pool leaves the last row and column of an odd plane unwritten.
        let read = pool_reads(&pool);
        let (got_read, want_read): (Vec<T>, Vec<f64>) = got_y
            .iter()
            .zip(&want_y.value)
            .enumerate()
            .map(|(i, (&g, &w))| match read[i % read.len()] {
                true => (g, w),
                false => (T::from_f32(0.0), 0.0),
            })
            .unzip();
        assert_close(
            &format!("fused forward y {s:?}"),
            &got_read,
            &want_read,
            &want_y.mag,
            tol,
        );
        let want_p = r::avg_pool_forward(&pool, &want_y.value);
        let mag_p = r::avg_pool_forward(&pool, &want_y.mag).value;
        let got_p = dev.download(&pooled).unwrap();
        assert_close(
            &format!("fused forward pooled {s:?} {pool:?}"),
            &got_p,
            &want_p.value,
            &mag_p,
            tol,
        );
        out.extend(bytes(&got_y));
        out.extend(bytes(&got_p));

        // Backward through the pool and the ReLU whose output is a random y (half negative),
        // with exact zeros of both signs among it, as a ReLU's output has.
        let mut act: Vec<T> = random(&mut g, ys);
        for (i, a) in act.iter_mut().enumerate().filter(|(i, _)| i % 5 == 2) {
            *a = T::from_f32(if i % 2 == 0 { 0.0 } else { -0.0 });
        }
        let d_pooled: Vec<T> = random(&mut g, ps);
        let (act_, dp_) = (dev.upload(&act).unwrap(), dev.upload(&d_pooled).unwrap());
        let mut dx = dev.upload(&poison(ys)).unwrap();
        dev.avg_pool_relu_backward(&pool, &dp_, &act_, &mut dx)
            .unwrap();
        let spread = r::avg_pool_backward(&pool, &wide(&d_pooled));
        let keep = |i: usize, v: f64| if act[i].to_f32() > 0.0 { v } else { 0.0 };
        let want: Vec<f64> = (0..ys).map(|i| keep(i, spread.value[i])).collect();
        let mag: Vec<f64> = (0..ys).map(|i| keep(i, spread.mag[i])).collect();
        let got = dev.download(&dx).unwrap();
        assert_close(
            &format!("fused pool+relu backward {pool:?}"),
            &got,
            &want,
            &mag,
            tol,
        );
        out.extend(bytes(&got));

        // The first layer's backward from the pool's output gradient: filter and bias
        // gradients through the pool and the ReLU. The default rounds the convolution's
        // output gradient to T on the way (one half rounding per term in fp16), a fused
        // backend keeps it in f32: the looser of the two tolerances.
        // Then a later layer's: the input gradient too, from the same output gradient.
        let loose = Tol {
            atol: tol.atol.max(tol_reduce.atol),
            rtol: tol.rtol.max(tol_reduce.rtol),
        };
        let want_w = r::conv_backward_filter(&s, &wide(&x), &want);
        let want_b = r::conv_backward_bias(&s, &want);
        let want_x = r::conv_backward_input(&s, &want, &wide(&w));
        let operands = (&x[..], &w[..], &bias[..]);
        let layer = (&s, &pool);
        out.extend(recomputed_matches_kept(
            dev, layer, operands, &d_pooled, loose,
        ));
        for layer in ["first-layer", "later-layer"] {
            let mut dw = dev.upload(&vec![f32::NAN; ws]).unwrap();
            let mut db = dev.upload(&vec![f32::NAN; s.out_c]).unwrap();
            let mut dx = dev.upload(&poison(xs)).unwrap();
            let mut workspace = dev.upload(&poison(ys)).unwrap();
            let input = (layer == "later-layer").then_some((&w_, &mut dx));
            dev.conv2d_relu_avg_pool_backward(
                &s,
                &pool,
                &x_,
                &act_,
                &dp_,
                &mut dw,
                &mut db,
                input,
                &mut workspace,
            )
            .unwrap();
            let what = format!("{layer} backward filter {s:?}");
            check_download(dev, &dw, &what, &want_w, loose, &mut out);
            let what = format!("{layer} backward bias {s:?}");
            check_download(dev, &db, &what, &want_b, loose, &mut out);
            if layer == "later-layer" {
                // Unfused, the output gradient is rounded to T before the input gradient
                // sums it, and that sum is rounded again: two roundings of T, not one.
                let twice = Tol {
                    atol: loose.atol,
                    rtol: 2.0 * loose.rtol,
                };
                let what = format!("{layer} backward input {s:?}");
                check_download(dev, &dx, &what, &want_x, twice, &mut out);
            }
        }

        let dy: Vec<T> = random(&mut g, ys);
        let dy_ = dev.upload(&dy).unwrap();
        let mut dw = dev.upload(&vec![f32::NAN; ws]).unwrap();
        let mut db = dev.upload(&vec![f32::NAN; s.out_c]).unwrap();
        dev.conv2d_backward_filter_bias(&s, &x_, &dy_, &mut dw, &mut db)
            .unwrap();
        let want = r::conv_backward_filter(&s, &wide(&x), &wide(&dy));
        let what = format!("fused filter {s:?}");
        check_download(dev, &dw, &what, &want, tol_reduce, &mut out);
        let want = r::conv_backward_bias(&s, &wide(&dy));
        let what = format!("fused bias {s:?}");
        check_download(dev, &db, &what, &want, tol_reduce, &mut out);

        // The whole backward pass in one call: filter, bias and input gradients.
        let mut dw = dev.upload(&vec![f32::NAN; ws]).unwrap();
        let mut db = dev.upload(&vec![f32::NAN; s.out_c]).unwrap();
        let mut dx = dev.upload(&poison(xs)).unwrap();
        dev.conv2d_backward(&s, &x_, &w_, &dy_, &mut dw, &mut db, &mut dx)
            .unwrap();
        let checks = [
            (
                "filter",
                wide(&dev.download(&dw).unwrap()),
                r::conv_backward_filter(&s, &wide(&x), &wide(&dy)),
                tol_reduce,
            ),
            (
                "bias",
                wide(&dev.download(&db).unwrap()),
                r::conv_backward_bias(&s, &wide(&dy)),
                tol_reduce,
            ),
            (
                "input",
                wide(&dev.download(&dx).unwrap()),
                r::conv_backward_input(&s, &wide(&dy), &wide(&w)),
                tol,
            ),
        ];
        for (what, got, want, tol) in checks {
            let got: Vec<f32> = got.iter().map(|v| *v as f32).collect();
            check_and_record(
                &format!("whole backward, {what} {s:?}"),
                &got,
                &want,
                tol,
                &mut out,
            );
        }
    }

    // A pool that does not match the convolution's output is an error, not a wrong answer.
    let s = shape(1, 1, (6, 6), 2, (3, 3), 1, 0);
    let bad = Pool2dShape {
        planes: 2,
        in_h: 5,
        in_w: 4,
        k_h: 2,
        k_w: 2,
        stride: 2,
    };
    let x = dev.upload(&[T::from_f32(0.0); 36]).unwrap();
    let w = dev.upload(&[T::from_f32(0.0); 18]).unwrap();
    let mut y = dev.upload(&[T::from_f32(0.0); 32]).unwrap();
    let mut p = dev.upload(&[T::from_f32(0.0); 8]).unwrap();
    let e = dev
        .conv2d_relu_avg_pool_forward(&s, &bad, &x, &w, None, &mut y, &mut p)
        .unwrap_err();
    assert!(
        e.to_string().contains("is not the convolution's output"),
        "{e}"
    );
    out
}

/// A first layer's filter and bias gradients through the pool and ReLU when the batch has
/// more pieces than the scratch area holds partial sums: 128 channels (1,280 floats a
/// partial) over 1,040 images (the kernels' direct convolution then sums several images'
/// bands a block, restaging the image between them), reading the ReLU's output and
/// recomputing it.
fn first_layer_over_a_long_batch<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = Vec::new();
    let mut g = rng(16);
    let s = shape(1040, 1, (4, 4), 128, (3, 3), 1, 1);
    let pool = Pool2dShape {
        planes: s.batch * s.out_c,
        in_h: s.out_h(),
        in_w: s.out_w(),
        k_h: 2,
        k_w: 2,
        stride: 2,
    };
    let (xs, ws, ys) = s.sizes();
    let ps = pool.sizes().1;
    let (x, act, d_pooled): (Vec<f32>, Vec<f32>, Vec<f32>) =
        (random(&mut g, xs), random(&mut g, ys), random(&mut g, ps));
    let spread = r::avg_pool_backward(&pool, &wide(&d_pooled));
    let dy: Vec<f64> = (0..ys)
        .map(|i| if act[i] > 0.0 { spread.value[i] } else { 0.0 })
        .collect();
    let up = |v: &[f32]| dev.upload(v).unwrap();
    let (x_, act_, dp_) = (up(&x), up(&act), up(&d_pooled));
    let (mut dw, mut db, mut workspace) = (
        up(&vec![f32::NAN; ws]),
        up(&vec![f32::NAN; s.out_c]),
        up(&vec![f32::NAN; ys]),
    );
    dev.conv2d_relu_avg_pool_backward(
        &s,
        &pool,
        &x_,
        &act_,
        &dp_,
        &mut dw,
        &mut db,
        None,
        &mut workspace,
    )
    .unwrap();
    let want = r::conv_backward_filter(&s, &wide(&x), &dy);
    check_download(dev, &dw, "long-batch filter", &want, F32_LONG, &mut out);
    let want = r::conv_backward_bias(&s, &dy);
    check_download(dev, &db, "long-batch bias", &want, F32_LONG, &mut out);
    // Recomputing the ReLU's output: the filter and biases staged once for a block's pieces.
    let (w, bias): (Vec<f32>, Vec<f32>) = (random(&mut g, ws), random(&mut g, s.out_c));
    let operands = (&x[..], &w[..], &bias[..]);
    out.extend(recomputed_matches_kept(
        dev,
        (&s, &pool),
        operands,
        &d_pooled,
        F32_LONG,
    ));
    out
}

fn fused_f32<B: Backend>(dev: &B) -> Vec<u8> {
    fused_all::<B, f32>(dev, 12, F32, F32_LONG)
}

fn fused_f16<B: Backend>(dev: &B) -> Vec<u8> {
    fused_all::<B, f16>(dev, 13, F16, F32_LONG)
}

fn fused_bf16<B: Backend>(dev: &B) -> Vec<u8> {
    fused_all::<B, bf16>(dev, 15, BF16, F32_LONG)
}

/// The kernel backends recompute LeNet's conv1's ReLU output in its backward, so the trainer
/// keeps no tensor of conv1's output size between the passes; the CPU backend keeps it.
#[test]
fn the_kernel_backends_recompute_conv1s_relu() {
    let (conv1, pool1) = (nanoddp::model::conv1(256), nanoddp::model::pool1(256));
    let cpu = nanoddp::backend::cpu::CpuDevice::new();
    assert!(!cpu.recomputes_relu(&conv1, &pool1), "CPU backend");
    if cfg!(simt_emulator) {
        let simt = nanoddp::backend::simt::SimtDevice::new(0);
        assert!(simt.recomputes_relu(&conv1, &pool1), "SIMT");
        let cuda = common::cuda_device(0);
        assert!(cuda.recomputes_relu(&conv1, &pool1), "CUDA");
        // conv2 (20 channels in) is not the direct kernels' shape.
        let (conv2, pool2) = (nanoddp::model::conv2(256), nanoddp::model::pool2(256));
        assert!(!cuda.recomputes_relu(&conv2, &pool2), "CUDA, conv2");
    }
}

/// On the emulators (the SIMT backend, both executors of the CUDA stand-in) a tensor core
/// adds a 16-step slice's products in step order onto the fragment it is given, and 16-bit
/// products are exact in f32: so the 16-bit filter and bias gradients (tensor cores, a fresh
/// fragment a slice added through Kahan carries, the pool's 1/4 after the sums) must equal
/// the f32 kernel's (CUDA cores, fresh registers a slice, the same carries) on the same values
/// bit for bit, with and without the pool. A GPU's tensor cores add in an order of their own
/// (the float64 checks above hold there).
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn tensor_cores_sum_the_filter_gradient_as_cuda_cores() {
    fn gradients<B: Backend, T: Precision>(
        dev: &B,
        s: &Conv2dShape,
        x: &[f32],
        dy: &[f32],
        pooled: Option<(&[f32], &[f32])>,
    ) -> Vec<u8> {
        let up = |v: &[f32]| {
            dev.upload(&v.iter().map(|&e| T::from_f32(e)).collect::<Vec<T>>())
                .unwrap()
        };
        let (xs, ws, ys) = s.sizes();
        let (mut dw, mut db) = (
            dev.upload(&vec![f32::NAN; ws]).unwrap(),
            dev.upload(&vec![f32::NAN; s.out_c]).unwrap(),
        );
        let x = up(&x[..xs]);
        match pooled {
            None => dev
                .conv2d_backward_filter_bias(s, &x, &up(&dy[..ys]), &mut dw, &mut db)
                .unwrap(),
            Some((y, d_pooled)) => {
                let pool = nanoddp::model::pool2(s.batch);
                let mut workspace = dev.upload(&vec![T::from_f32(f32::NAN); ys]).unwrap();
                dev.conv2d_relu_avg_pool_backward(
                    s,
                    &pool,
                    &x,
                    &up(y),
                    &up(d_pooled),
                    &mut dw,
                    &mut db,
                    None,
                    &mut workspace,
                )
                .unwrap();
            }
        }
        [dev.download(&dw).unwrap(), dev.download(&db).unwrap()]
            .concat()
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect()
    }
    /// The 16-bit gradients against the f32 kernel's on fresh values exact in `T`.
    fn same_bits_in<B: Backend, T: Precision>(dev: &B, what: &str, g: &mut impl rand::Rng) {
        let s = nanoddp::model::conv2(common::sized(64, 4));
        let (xs, _, ys) = s.sizes();
        let mut exact = |n| -> Vec<f32> { random::<T>(g, n).iter().map(|v| v.to_f32()).collect() };
        let (x, dy) = (exact(xs), exact(ys));
        let d_pooled = exact(nanoddp::model::pool2(s.batch).sizes().1);
        for pooled in [None, Some((&dy[..], &d_pooled[..]))] {
            let want = gradients::<B, f32>(dev, &s, &x, &dy, pooled);
            assert!(
                gradients::<B, T>(dev, &s, &x, &dy, pooled) == want,
                "{what}: {:?} filter gradient (pool: {}) differs from f32's",
                T::DTYPE,
                pooled.is_some()
            );
        }
    }
    fn same_bits<B: Backend>(dev: &B, what: &str) {
        let _lean = common::Lean::on_the_ptx_executor();
        let mut g = rng(17);
        same_bits_in::<B, bf16>(dev, what, &mut g);
        same_bits_in::<B, f16>(dev, what, &mut g);
    }
    if cfg!(simt_emulator) {
        same_bits(&nanoddp::backend::simt::SimtDevice::new(0), "SIMT backend");
        common::cuda_driver(); // loads the stand-in where the machine has no driver
                               // On a real GPU the tensor cores' order is their own: the float64 checks hold there.
        if nanoddp::backend::cuda::is_standin() {
            same_bits(&common::cuda_device(0), "CUDA stand-in");
        }
    }
}

per_backend!(
    conv_f32,
    conv_f16,
    conv_bf16,
    bad_conv_shapes_are_errors,
    fused_f32,
    fused_f16,
    fused_bf16,
    first_layer_over_a_long_batch
);

/// A device given a level computes with it, whatever the process uses: the portable engine
/// multiplies and adds unfused, so conv2's forward differs in the last bits from the fused
/// engines'; and every level this CPU runs passes `conv_f32`'s float64 checks (above,
/// `conv_f32::cpu`). Unknown names and levels the CPU lacks are refused.
#[test]
fn a_cpu_device_computes_with_its_own_level() {
    use nanoddp::backend::cpu::{isa, CpuDevice};
    use nanoddp::backend::Memory;
    assert!(CpuDevice::with_level("avx3").is_err(), "an unknown name");
    let levels = isa::levels();
    assert_eq!(levels[0].0, "portable");
    let fused = levels
        .iter()
        .find(|(_, level)| level.engine() != isa::EngineKind::Portable);
    let Some(&(fused, _)) = fused else {
        println!("this CPU runs only the portable engine");
        return;
    };
    let forward = |level: &str| -> Vec<u32> {
        let dev = CpuDevice::with_level(level).expect("a level this CPU runs");
        assert_eq!(dev.isa(), isa::level(level).unwrap(), "{level}");
        let s = Conv2dShape {
            batch: 5,
            in_c: 20,
            in_h: 13,
            in_w: 13,
            out_c: 50,
            k_h: 5,
            k_w: 5,
            stride: 1,
            pad: 0,
        };
        let (xs, ws, ys) = s.sizes();
        let mut g = rng(77);
        let x = dev.upload(&random::<f32>(&mut g, xs)).unwrap();
        let w = dev.upload(&random::<f32>(&mut g, ws)).unwrap();
        let mut y = dev.alloc_zeros::<f32>(ys).unwrap();
        dev.conv2d_forward(&s, &x, &w, None, &mut y, false).unwrap();
        dev.download(&y)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    let (unfused, fused_bits) = (forward("portable"), forward(fused));
    let differ = unfused
        .iter()
        .zip(&fused_bits)
        .filter(|(a, b)| a != b)
        .count();
    println!(
        "portable and {fused}: {differ} of {} outputs differ",
        unfused.len()
    );
    assert!(differ > 0, "portable and {fused} computed the same bits");
}
