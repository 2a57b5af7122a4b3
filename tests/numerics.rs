//! Numerical accuracy against float64, measured the way a user checking the trainer against
//! PyTorch would: gradients at LeNet's real sizes with cancellation, reductions long enough
//! that a running float sum loses digits, and a dozen training steps from fixed weights.
//!
//! Errors are relative to the *result's* norm, ‖got − want‖ / ‖want‖ over a tensor, so a
//! gradient that is a small difference of large terms must be right to the digits it has,
//! not only to the terms' magnitude. The bounds are at or below what PyTorch's float32 CPU
//! path reaches on the same inputs (measured with torch 2.15: see each bound).

mod common;

use common::lenet64::{self, relative_error, widen};
use common::{per_backend, rng};
use nanoddp::backend::cpu::isa::levels;
use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::{Backend, Conv2dShape, Epilogue, GemmShape};
use nanoddp::comm::communicator::CommConfig;
use nanoddp::data::locate;
use nanoddp::dtype::DType;
use nanoddp::model::{self, PARAMS};
use nanoddp::train::{from_weights, initial_weights, train, Event, Recipe, TrainConfig};
use rand::Rng;

fn uniform(g: &mut impl Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| g.gen_range(lo..hi)).collect()
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn check(what: &str, got: &[f32], want: &[f64], bound: f64) {
    let err = relative_error(got, want);
    println!("{what}: relative error {err:.2e} (bound {bound:.1e})"); // shown with --nocapture
    assert!(
        err <= bound,
        "{what}: relative error {err:.2e} > {bound:.1e} (NaN: an element was not written)"
    );
}

/// A design of output gradients with cancellation: how each image's plane is offset before
/// uniform noise in [-1, 1) is added, and the bound on the relative error of the filter and
/// bias gradients (the input gradient sums only O·KH·KW terms: 1e-6 in every case).
struct Design {
    name: &'static str,
    /// The offset of image n's plane in a batch of `batch`.
    offset: fn(n: usize, batch: usize) -> f32,
    bound: f64,
}

const DESIGNS: [Design; 3] = [
    // Zero mean: results ~√N of terms ~1. PyTorch float32: 5.1e-6 (conv1 dw), 4.7e-6 (db).
    Design {
        name: "zero-mean",
        offset: |_, _| 0.0,
        bound: 1e-6,
    },
    // Same sign: a running sum's partials grow to the total. PyTorch: 3.1e-6, 2.9e-6.
    Design {
        name: "same-sign",
        offset: |_, _| 2.0,
        bound: 2e-7,
    },
    // The first half of the batch +1, the second -1: partial sums reach N/2 while the
    // result is ~√N, so an uncompensated sum's last roundings alone are ε·N/2 / √N of the
    // result (~1e-5 for conv1): the CPU's tree reaches 1-3e-5, the kernels' compensated
    // sums 1e-7. PyTorch: 1.6e-3 (conv1 dw), 3.5e-3 (db).
    Design {
        name: "split-batch",
        offset: |n, batch| if n < batch / 2 { 1.0 } else { -1.0 },
        bound: 5e-5,
    },
];

/// conv1's and conv2's filter, bias and input gradients at batch 256 (x in [0, 1) as the
/// images and pooled ReLU outputs are), each output-gradient design. (Batch 8, and conv2
/// with 6 output channels, on the PTX executor, whose pass checks the emitted code bit for
/// bit: see `common::Lean`.)
fn conv_gradients_at_batch_256<B: Backend>(dev: &B) -> Vec<u8> {
    let mut g = rng(160);
    let mut out = Vec::new();
    let batch = common::sized(256, 8);
    let conv2 = Conv2dShape {
        out_c: common::sized(50, 6),
        ..model::conv2(batch)
    };
    for (name, s) in [("conv1", model::conv1(batch)), ("conv2", conv2)] {
        let (xs, ws, ys) = s.sizes();
        let (x, w) = (
            uniform(&mut g, xs, 0.0, 1.0),
            uniform(&mut g, ws, -1.0, 1.0),
        );
        for Design {
            name: design,
            offset,
            bound,
        } in DESIGNS
        {
            let mut dy = uniform(&mut g, ys, -1.0, 1.0);
            for (n, plane) in dy.chunks_mut(ys / s.batch).enumerate() {
                plane.iter_mut().for_each(|v| *v += offset(n, s.batch));
            }
            let (rw, rb, rx) = lenet64::conv_gradients(&s, &wide(&x), &wide(&w), &wide(&dy));
            let up = |v: &[f32]| dev.upload(v).expect("upload");
            let (bx, bw, bdy) = (up(&x), up(&w), up(&dy));
            let (mut dw, mut db, mut dx) = (
                up(&vec![f32::NAN; ws]),
                up(&vec![f32::NAN; s.out_c]),
                up(&vec![f32::NAN; xs]),
            );
            dev.conv2d_backward(&s, &bx, &bw, &bdy, &mut dw, &mut db, &mut dx)
                .expect("conv2d_backward");
            let down = |b| dev.download(b).expect("download");
            let (dw, db, dx) = (down(&dw), down(&db), down(&dx));
            check(&format!("{name} dw, {design}"), &dw, &rw, bound);
            check(&format!("{name} db, {design}"), &db, &rb, bound);
            check(&format!("{name} dx, {design}"), &dx, &rx, 1e-6);
            for v in [dw, db, dx] {
                out.extend(common::bytes(&v));
            }
        }
    }
    out
}

/// A linear layer's weight and bias gradients, dW = dyᵀ·x (the GEMM the model runs) and
/// db = Σ dy (a bias gradient over 1x1 "pixels"), for x (batch x in) and dy (batch x out).
fn linear_gradients<B: Backend>(dev: &B, x: &[f32], dy: &[f32], (inp, outp): (usize, usize)) {
    let batch = dy.len() / outp;
    let (mut rw, mut rb) = (vec![0.0f64; outp * inp], vec![0.0f64; outp]);
    for (x, dy) in x.chunks(inp).zip(dy.chunks(outp)) {
        for (o, &d) in dy.iter().enumerate() {
            rb[o] += d as f64;
            for (r, &xv) in rw[o * inp..(o + 1) * inp].iter_mut().zip(x) {
                *r += d as f64 * xv as f64;
            }
        }
    }
    let up = |v: &[f32]| dev.upload(v).expect("upload");
    let (bx, bdy) = (up(x), up(dy));
    let (mut dw, mut db) = (up(&vec![f32::NAN; outp * inp]), up(&vec![f32::NAN; outp]));
    let s = GemmShape {
        m: outp,
        n: inp,
        k: batch,
        trans_a: true,
        trans_b: false,
    };
    dev.gemm(&s, &bdy, &bx, None, &mut dw, Epilogue::default())
        .expect("gemm");
    let columns = Conv2dShape {
        batch,
        in_c: 1,
        in_h: 1,
        in_w: 1,
        out_c: outp,
        k_h: 1,
        k_w: 1,
        stride: 1,
        pad: 0,
    };
    dev.conv2d_backward_bias(&columns, &bdy, &mut db)
        .expect("bias gradient");
    let what = format!("linear {inp}->{outp}, batch {batch}");
    // PyTorch float32 at batch 256 with zero-mean dy: 2.2e-7 (dW), 1.1e-7 (db). A dot
    // product of 256 terms summed in one chain: 2.5e-7 to 2.9e-7 (dW), 2.6e-7 (db).
    check(
        &format!("{what}: dW"),
        &dev.download(&dw).expect("dW"),
        &rw,
        2e-7,
    );
    check(
        &format!("{what}: db"),
        &dev.download(&db).expect("db"),
        &rb,
        1e-7,
    );
}

/// fc1's and fc2's gradients at batch 256, zero-mean output gradients.
fn linear_gradients_at_batch_256<B: Backend>(dev: &B) -> Vec<u8> {
    let mut g = rng(161);
    for (inp, outp) in [(800, 128), (128, 10)] {
        let x = uniform(&mut g, 256 * inp, 0.0, 1.0);
        let dy = uniform(&mut g, 256 * outp, -1.0, 1.0);
        linear_gradients(dev, &x, &dy, (inp, outp));
    }
    Vec::new()
}

/// Reductions long enough that a running float32 sum's error (growing like N·ε) shows: a
/// bias and weight gradient over 60,000 images (the batch limit is 65,535) and 16,384, and a filter and bias
/// gradient over 2,048 images of 26x26 pixels (1.4M terms), all of one sign. A blocked,
/// tree or compensated sum stays near 1e-7 however long the reduction. (The filter gradient
/// over 256 images on the PTX executor: see `common::Lean`.)
fn long_reductions<B: Backend>(dev: &B) -> Vec<u8> {
    let mut g = rng(162);
    let (batch, features) = (60_000, 10); // the training set in one batch
    let x = uniform(&mut g, batch * 4, 0.0, 1.0);
    let dy = uniform(&mut g, batch * features, 0.5, 1.5);
    linear_gradients(
        dev,
        &x[..(1 << 14) * 4],
        &dy[..(1 << 14) * features],
        (4, features),
    );
    linear_gradients(dev, &x, &dy, (4, features));
    let batch = common::sized(2048, 256);
    let s = Conv2dShape {
        batch,
        out_c: 2,
        ..model::conv1(batch)
    };
    let (xs, ws, ys) = s.sizes();
    let (x, w, dy) = (
        uniform(&mut g, xs, 0.0, 1.0),
        uniform(&mut g, ws, -1.0, 1.0),
        uniform(&mut g, ys, 0.5, 1.5),
    );
    let (rw, rb, _) = lenet64::conv_gradients(&s, &wide(&x), &wide(&w), &wide(&dy));
    let up = |v: &[f32]| dev.upload(v).expect("upload");
    let (bx, bdy) = (up(&x), up(&dy));
    let (mut dw, mut db) = (up(&vec![f32::NAN; ws]), up(&vec![f32::NAN; s.out_c]));
    dev.conv2d_backward_filter_bias(&s, &bx, &bdy, &mut dw, &mut db)
        .expect("filter and bias gradients");
    let (dw, db) = (
        dev.download(&dw).expect("dw"),
        dev.download(&db).expect("db"),
    );
    check(&format!("dw over {batch} images of 26x26"), &dw, &rw, 5e-7);
    check(&format!("db over {batch} images of 26x26"), &db, &rb, 5e-7);
    [common::bytes(&dw), common::bytes(&db)].concat()
}

/// The largest error of one element, as a fraction of the outputs' RMS: what decides whether
/// a ReLU sees the sign float64 sees for an output near zero (a flipped decision sends a whole
/// gradient term the other way, and is what a float32 training trajectory first departs on).
fn worst_element(got: &[f32], want: &[f64]) -> f64 {
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len() as f64).sqrt();
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(
            0.0,
            |a: f64, e| if e.is_nan() { f64::INFINITY } else { a.max(e) },
        );
    worst / rms
}

/// The forward products at batch 256 with He-scaled weights (N(0, 2/fan_in), zero-mean, so
/// outputs cancel) on inputs in [0, 1): conv1, conv2 and fc1's pre-activations, against
/// float64, as a relative L2 error and as the worst element over the RMS. Bounds are
/// PyTorch float32's on the same distributions (torch 2.15, 2 threads): conv1 6e-8 and
/// 8e-7, conv2 3.4e-7 and 3.2e-6, fc1 2.7e-7 and 2.0e-6. (Batch 8, and 65 rows of fc1, on the
/// PTX executor: see `common::Lean`.)
fn forward_at_batch_256<B: Backend>(dev: &B) -> Vec<u8> {
    let mut g = rng(163);
    let mut out = Vec::new();
    let he = |g: &mut rand::rngs::StdRng, n: usize, fan_in: usize| -> Vec<f32> {
        let sd = (2.0 / fan_in as f64).sqrt();
        (0..n)
            .map(|_| {
                // Box-Muller: the crate's rand has no normal distribution without rand_distr.
                let (u, v): (f64, f64) = (g.gen_range(f64::EPSILON..1.0), g.gen());
                (sd * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect()
    };
    let up = |v: &[f32]| dev.upload(v).expect("upload");
    let batch = common::sized(256, 8);
    for (name, s, bounds) in [
        ("conv1", model::conv1(batch), (1e-7, 1.5e-6)),
        ("conv2", model::conv2(batch), (3.5e-7, 3.5e-6)),
    ] {
        let (xs, ws, ys) = s.sizes();
        let x = uniform(&mut g, xs, 0.0, 1.0);
        let w = he(&mut g, ws, s.in_c * s.k_h * s.k_w);
        let want = lenet64::conv_forward(&s, &wide(&x), &wide(&w), &vec![0.0; s.out_c]);
        let mut y = up(&vec![f32::NAN; ys]);
        dev.conv2d_forward(&s, &up(&x), &up(&w), None, &mut y, false)
            .expect("conv2d_forward");
        let y = dev.download(&y).expect("download");
        check(&format!("{name} forward"), &y, &want, bounds.0);
        let worst = worst_element(&y, &want);
        println!("{name} forward: worst element {worst:.2e} of the RMS");
        assert!(
            worst <= bounds.1,
            "{name} forward: worst element {worst:.2e} of the RMS"
        );
        out.extend(common::bytes(&y));
    }
    let (inputs, outputs, rows) = (800, 128, common::sized(256, 65));
    let x = uniform(&mut g, rows * inputs, 0.0, 1.0);
    let w = he(&mut g, outputs * inputs, inputs);
    let want = lenet64::linear_forward(&wide(&w), &vec![0.0; outputs], &wide(&x), inputs);
    let mut y = up(&vec![f32::NAN; rows * outputs]);
    let shape = GemmShape {
        m: rows,
        n: outputs,
        k: inputs,
        trans_a: false,
        trans_b: true,
    };
    dev.gemm(&shape, &up(&x), &up(&w), None, &mut y, Epilogue::default())
        .expect("gemm");
    let y = dev.download(&y).expect("download");
    check("fc1 forward", &y, &want, 2.7e-7);
    let worst = worst_element(&y, &want);
    println!("fc1 forward: worst element {worst:.2e} of the RMS");
    assert!(
        worst <= 2e-6,
        "fc1 forward: worst element {worst:.2e} of the RMS"
    );
    out.extend(common::bytes(&y));
    out
}

per_backend!(
    forward_at_batch_256,
    conv_gradients_at_batch_256,
    linear_gradients_at_batch_256,
    long_reductions
);

/// Twelve plain SGD steps (lr 0.1, He-scaled weights, file order, batch 250: the shipped
/// subset's 3,000 images once) on 1 and 4 devices, against the float64 model taking the
/// same steps: every step's loss within 1e-5 (relative) and every final tensor within 1e-4.
/// PyTorch float32 on the full set's first 12 batches of 256 reaches 2.0e-7 on the loss
/// (`tools/torch_crosscheck.py`). One device on every level of the CPU backend this CPU
/// runs (each engine), in this process; four devices on the highest.
#[test]
fn twelve_sgd_steps_stay_on_the_float64_trajectory() {
    let data = locate::load(&locate::shipped_subset()).expect("the shipped subset loads");
    let (batch, steps, lr) = (250, 12, 0.1);
    let start = initial_weights(Recipe::Default, 16);

    // The float64 model's trajectory.
    let pixels = model::IMAGE * model::IMAGE;
    let mut w64 = widen(&start);
    let mut losses64 = Vec::new();
    for step in 0..steps {
        let images = &data.train_images.pixels[step * batch * pixels..(step + 1) * batch * pixels];
        let labels = &data.train_labels[step * batch..(step + 1) * batch];
        let (loss, grads) = lenet64::loss_and_gradients(&w64, images, labels);
        losses64.push(loss);
        for (w, g) in w64.iter_mut().zip(&grads) {
            w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g);
        }
    }

    let cfg = TrainConfig {
        recipe: Recipe::Chapter, // a constant learning rate
        epochs: 1,
        batch,
        lr: lr as f32,
        momentum: 0.0,
        weight_decay: 0.0,
        seed: 16,
        shuffle: false,
        max_steps: Some(steps),
        algorithm: None,
        bucket_bytes: 64 << 10,
        stop_after: None,
        precision: DType::F32,
        comm: CommConfig::default(),
        cuda_graph: true,
    };
    // One device on every level; four (the shards' all-reduce and their ragged shares of
    // the batch) on the highest, the one the process computes with. (Each engine's products
    // at ragged group sizes are checked against float64 in tests/conv.rs and tests/gemm.rs.)
    let levels = levels();
    let top = levels.last().expect("the portable level at least").0;
    let runs = levels
        .iter()
        .map(|&(level, _)| (level, 1))
        .chain([(top, 4)]);
    for (level, devices) in runs {
        let dev = CpuDevice::with_level(level).expect("a level this CPU runs");
        let mut losses = Vec::new();
        let finals = train(
            vec![dev; devices],
            &data,
            from_weights(start.clone()),
            &cfg,
            |e| {
                if let Event::Step(s) = e {
                    losses.push(s.loss);
                }
                Ok(())
            },
        )
        .expect("training runs");
        assert_eq!(
            losses.len(),
            steps,
            "{level}, {devices} devices: steps taken"
        );
        let deviations: Vec<f64> = losses
            .iter()
            .zip(&losses64)
            .map(|(l, r)| (l - r).abs() / r)
            .collect();
        let worst = deviations.iter().cloned().fold(0.0, f64::max);
        println!(
            "{level}, {devices} devices: largest deviation of the loss from float64's {worst:.2e}"
        );
        assert!(
            worst < 1e-5,
            "{level}, {devices} devices: the loss left float64's by {worst:.2e}; per step: {deviations:?}"
        );
        for (p, (got, want)) in PARAMS.iter().zip(finals[0].iter().zip(&w64)) {
            let err = relative_error(got, want);
            assert!(
                err < 1e-4,
                "{level}, {devices} devices: {} is {err:.2e} from float64's after {steps} steps",
                p.name
            );
        }
    }
}
