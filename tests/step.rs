//! A training step's bookkeeping on the device (`kernels/step.cu` and the CPU backend): the
//! batch gathered from a data set in device memory, the step's scalars, the shard's
//! statistics and the step's end (loss scaling, the ring of records), against float64 and
//! the host's rules; and the loss and optimizer reading their scalars from device memory
//! (the host's values poisoned, so a kernel that used them would fail).

mod common;

use common::{assert_close, bytes, per_backend, rng, Tol, F32};
use half::{bf16, f16};
use nanoddp::backend::step::rescale;
use nanoddp::backend::{Backend, BackendError, Precision, SgdStep, StepScalars, RECORD, STATS};
use rand::Rng;

/// A data set of `count` images of `image` pixels, random bytes and labels.
fn data_set(seed: u64, count: usize, image: usize) -> (Vec<u8>, Vec<u8>) {
    let mut g = rng(seed);
    let pixels = (0..count * image).map(|_| g.gen()).collect();
    let labels = (0..count).map(|_| g.gen_range(0..10)).collect();
    (pixels, labels)
}

fn gather_case<B: Backend, T: Precision>(dev: &B, seed: u64) -> Vec<u8> {
    // 37 images of 7x5 pixels; an order of 3 batches of stride 5 whose last is cut short,
    // with an index past the set in batch 1 and the order ending inside batch 2.
    let (count, image, stride) = (37, 35, 5);
    let (pixels, labels) = data_set(seed, count, image);
    let mut g = rng(seed + 1);
    let mut order: Vec<u32> = (0..13).map(|_| g.gen_range(0..count as u32)).collect();
    order[7] = count as u32 + 4; // past the set
    let (dp, dl, dord) = (
        dev.upload(&pixels).unwrap(),
        dev.upload(&labels).unwrap(),
        dev.upload(&order).unwrap(),
    );
    let mut out = Vec::new();
    for (batch, n) in [(0u32, 5), (1, 5), (2, 4)] {
        let db = dev.upload(&[batch]).unwrap();
        let mut x = dev.upload(&vec![T::from_f32(f32::NAN); n * image]).unwrap();
        let mut y = dev.upload(&vec![77u8; n]).unwrap();
        dev.gather_batch(&dp, &dl, &dord, &db, stride, &mut x, &mut y)
            .unwrap();
        let (x, y) = (dev.download(&x).unwrap(), dev.download(&y).unwrap());
        for i in 0..n {
            let at = batch as usize * stride + i;
            let k = order.get(at).map_or(count, |&k| k as usize);
            let what = format!("{}: batch {batch}, image {i}", T::DTYPE);
            if k >= count {
                assert_eq!(y[i], 255, "{what}: past the set or the order, label 255");
                assert!(x[i * image..(i + 1) * image]
                    .iter()
                    .all(|v| v.to_f32() == 0.0));
                continue;
            }
            assert_eq!(y[i], labels[k], "{what}: label");
            for p in 0..image {
                // The float64 quotient rounded once to f32 (for bytes over 255 it is the
                // correctly rounded f32 division: checked below), then to T.
                let want = T::from_f32((pixels[k * image + p] as f64 / 255.0) as f32);
                assert_eq!(
                    x[i * image + p].to_f32().to_bits(),
                    want.to_f32().to_bits(),
                    "{what}, pixel {p}"
                );
            }
        }
        out.extend(bytes(&x));
        out.extend(y);
    }
    out
}

fn gather_batch<B: Backend>(dev: &B) -> Vec<u8> {
    // The reference's one rounding equals the host's f32 division for every byte.
    for p in 0..=255u8 {
        assert_eq!((p as f64 / 255.0) as f32, p as f32 / 255.0);
    }
    let mut out = gather_case::<B, f32>(dev, 50);
    out.extend(gather_case::<B, f16>(dev, 51));
    out.extend(gather_case::<B, bf16>(dev, 52));
    out
}

fn gather_refuses_what_does_not_fit<B: Backend>(dev: &B) -> Vec<u8> {
    let (pixels, labels) = data_set(53, 4, 10);
    let (dp, dl) = (dev.upload(&pixels).unwrap(), dev.upload(&labels).unwrap());
    let order = dev.upload(&[0u32, 1, 2, 3]).unwrap();
    let batch = dev.upload(&[0u32]).unwrap();
    let mut y = dev.alloc_zeros::<u8>(2).unwrap();
    let mut x = dev.alloc_zeros::<f32>(19).unwrap(); // 2 images of 10 need 20
    let e = dev.gather_batch(&dp, &dl, &order, &batch, 2, &mut x, &mut y);
    assert!(matches!(e, Err(BackendError::BufferSize { .. })), "{e:?}");
    let ragged = dev.upload(&pixels[..39]).unwrap(); // 39 pixels are not 4 images
    let mut x = dev.alloc_zeros::<f32>(20).unwrap();
    let e = dev.gather_batch(&ragged, &dl, &order, &batch, 2, &mut x, &mut y);
    assert!(matches!(e, Err(BackendError::BadShape { .. })), "{e:?}");
    Vec::new()
}

fn step_scalars<B: Backend>(dev: &B) -> Vec<u8> {
    let table = [0.05f32, 0.04, 0.0312, 0.02];
    let dt = dev.upload(&table).unwrap();
    let mut out = Vec::new();
    for (batch, scale, global) in [(0u32, 1.0f32, 256), (3, 65536.0, 255), (2, 3.0, 7)] {
        let (db, ds) = (dev.upload(&[batch]).unwrap(), dev.upload(&[scale]).unwrap());
        let mut s = StepScalars::new(dev).unwrap();
        for b in [&mut s.lr, &mut s.grad_scale, &mut s.inv_scale] {
            dev.write(&[f32::NAN], b).unwrap();
        }
        dev.step_begin(&dt, &db, &ds, global, &mut s).unwrap();
        let lr = dev.download(&s.lr).unwrap()[0];
        assert_eq!(lr, table[batch as usize], "lr of batch {batch}");
        let got = [
            dev.download(&s.grad_scale).unwrap()[0],
            dev.download(&s.inv_scale).unwrap()[0],
        ];
        let want = [scale as f64 / global as f64, 1.0 / scale as f64];
        assert_close("grad_scale, inv_scale", &got, &want, &want, F32);
        out.extend(bytes(&[lr, got[0], got[1]]));
    }
    // A batch past the table: a NaN learning rate, never a read past it.
    let (db, ds) = (dev.upload(&[4u32]).unwrap(), dev.upload(&[1.0f32]).unwrap());
    let mut s = StepScalars::new(dev).unwrap();
    dev.step_begin(&dt, &db, &ds, 1, &mut s).unwrap();
    assert!(dev.download(&s.lr).unwrap()[0].is_nan());
    out
}

fn shard_statistics<B: Backend>(dev: &B) -> Vec<u8> {
    let mut g = rng(54);
    let mut out = Vec::new();
    // Sizes around the kernel's 256 threads, and a poisoned output.
    for n in [1usize, 255, 256, 257, 1000] {
        let loss: Vec<f32> = (0..n).map(|_| g.gen_range(0.0f32..5.0)).collect();
        let right = g.gen_range(0..=n as i32);
        let dl = dev.upload(&loss).unwrap();
        let mut correct = dev.upload(&[right]).unwrap();
        let mut stats = dev.upload(&[f32::NAN; STATS]).unwrap();
        dev.shard_stats(&dl, &mut correct, &mut stats, false)
            .unwrap();
        let got = dev.download(&stats).unwrap();
        let sum: f64 = loss.iter().map(|&l| l as f64).sum();
        let tight = Tol {
            atol: 0.0,
            rtol: 1e-7,
        };
        assert_close(&format!("Σ loss of {n}"), &got[..1], &[sum], &[sum], tight);
        assert_eq!(got[1..], [right as f32, n as f32], "correct, count of {n}");
        assert_eq!(dev.download(&correct).unwrap(), [0], "correct is reset");
        // Accumulating adds (the count reset above now counts from 0).
        dev.shard_stats(&dl, &mut correct, &mut stats, true)
            .unwrap();
        let twice = dev.download(&stats).unwrap();
        assert_eq!(twice[0], got[0] + got[0]);
        assert_eq!(twice[1..], [right as f32, 2.0 * n as f32]);
        out.extend(bytes(&got));
    }
    out
}

/// Steps with the overflow flags `flags` through `step_end` (fp16's dynamic scaling with a
/// growth interval of 3, a ring of 3 records in host memory the device writes, poisoned
/// first), checked record by record against the host's rule; a step writes its own record
/// and leaves the others as they were.
fn step_end_follows_the_loss_scaler<B: Backend>(dev: &B) -> Vec<u8> {
    let flags = [0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0];
    let growth = 3;
    let (mut scale, mut clean) = (8.0f32, 1usize);
    let mut d_scale = dev.upload(&[scale]).unwrap();
    let mut d_clean = dev.upload(&[clean as i32]).unwrap();
    let mut batch = dev.upload(&[0u32]).unwrap();
    let mut ring = dev.alloc_staging::<f32>(3 * RECORD).unwrap();
    for i in 0..ring.len() {
        ring.set(i, f32::NAN);
    }
    let mut before = ring.read();
    let mut out = Vec::new();
    for (step, &f) in flags.iter().enumerate() {
        let current = dev.upload(&[step as f32, 2.0 * step as f32, 3.0]).unwrap();
        let mut found = dev.upload(&[f]).unwrap();
        dev.step_end(
            &mut d_scale,
            Some(&mut d_clean),
            Some(&mut found),
            growth,
            &mut batch,
            &current,
            &mut ring,
        )
        .unwrap();
        let ran_with = scale;
        (scale, clean) = rescale(scale, clean, f != 0, growth);
        let what = format!("step {step}, overflow {f}");
        assert_eq!(dev.download(&d_scale).unwrap(), [scale], "{what}: scale");
        assert_eq!(dev.download(&d_clean).unwrap(), [clean as i32], "{what}");
        assert_eq!(dev.download(&found).unwrap(), [0], "{what}: flag cleared");
        assert_eq!(dev.download(&batch).unwrap(), [step as u32 + 1], "{what}");
        dev.synchronize().unwrap();
        let r = ring.read();
        let slot = step % 3;
        assert_eq!(
            r[slot * RECORD..(slot + 1) * RECORD],
            [step as f32, 2.0 * step as f32, 3.0, ran_with],
            "{what}: its record, with the scale it ran with"
        );
        for (i, (now, was)) in r.iter().zip(&before).enumerate() {
            if i / RECORD != slot {
                assert_eq!(now.to_bits(), was.to_bits(), "{what}: value {i} left alone");
            }
        }
        out.extend(bytes(&r));
        before = r;
    }
    // bf16: the flag without scaling, cleared, the scale untouched.
    let mut found = dev.upload(&[1]).unwrap();
    let current = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let mut one = dev.upload(&[1.0f32]).unwrap();
    dev.step_end(
        &mut one,
        None,
        Some(&mut found),
        growth,
        &mut batch,
        &current,
        &mut ring,
    )
    .unwrap();
    assert_eq!(dev.download(&one).unwrap(), [1.0]);
    assert_eq!(dev.download(&found).unwrap(), [0]);
    // Scaling without the flag is refused.
    let e = dev.step_end(
        &mut one,
        Some(&mut d_clean),
        None,
        growth,
        &mut batch,
        &current,
        &mut ring,
    );
    assert!(matches!(e, Err(BackendError::BadShape { .. })), "{e:?}");
    out
}

/// The loss's gradient factor and the optimizer's learning rate and unscaling, read from
/// device memory: the same results as the host values, with the host's poisoned.
fn loss_and_update_read_device_scalars<B: Backend>(dev: &B) -> Vec<u8> {
    let (rows, classes) = (9, 10);
    let mut g = rng(55);
    let logits: Vec<f32> = (0..rows * classes)
        .map(|_| g.gen_range(-3.0..3.0))
        .collect();
    let labels: Vec<u8> = (0..rows).map(|_| g.gen_range(0..10)).collect();
    let (dz, dy) = (dev.upload(&logits).unwrap(), dev.upload(&labels).unwrap());
    let mut at = StepScalars::new(dev).unwrap();
    dev.write(&[0.0625], &mut at.lr).unwrap();
    dev.write(&[0.25], &mut at.grad_scale).unwrap();
    dev.write(&[0.5], &mut at.inv_scale).unwrap();
    let run = |grad_scale: f32, at: Option<&StepScalars<B>>| {
        let mut loss = dev.alloc_zeros::<f32>(rows).unwrap();
        let mut grad = dev.alloc_zeros::<f32>(rows * classes).unwrap();
        let mut correct = dev.alloc_zeros::<i32>(1).unwrap();
        dev.softmax_cross_entropy(
            rows,
            classes,
            &dz,
            &dy,
            &mut loss,
            Some(&mut grad),
            &mut correct,
            grad_scale,
            at,
        )
        .unwrap();
        dev.download(&grad).unwrap()
    };
    let (host, device) = (run(0.25, None), run(f32::NAN, Some(&at)));
    assert_eq!(bytes(&host), bytes(&device), "the loss's gradient");

    let w: Vec<f32> = (0..100).map(|_| g.gen_range(-1.0..1.0)).collect();
    let grad: Vec<f32> = (0..100).map(|_| g.gen_range(-1.0..1.0)).collect();
    let dg = dev.upload(&grad).unwrap();
    let update = |step: SgdStep, at: Option<&StepScalars<B>>| {
        let mut dw = dev.upload(&w).unwrap();
        let mut v = dev.alloc_zeros::<f32>(100).unwrap();
        dev.sgd_step::<f32>(&mut dw, &dg, Some(&mut v), None, step, at, None)
            .unwrap();
        dev.download(&dw).unwrap()
    };
    let step = |lr, inv_scale| SgdStep {
        lr,
        inv_scale,
        momentum: 0.9,
        weight_decay: 1e-3,
    };
    let host_w = update(step(0.0625, 0.5), None);
    let device_w = update(step(f32::NAN, f32::NAN), Some(&at));
    assert_eq!(bytes(&host_w), bytes(&device_w), "the update");
    assert_ne!(host_w, w, "the update moved the weights");
    // The gradient went through expf: compared within executors above, not across them.
    bytes(&host_w)
}

per_backend!(
    gather_batch,
    gather_refuses_what_does_not_fit,
    step_scalars,
    shard_statistics,
    step_end_follows_the_loss_scaler,
    loss_and_update_read_device_scalars
);
