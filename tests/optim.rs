//! The optimizer step (`kernels/optim.cu` and the CPU backend): SGD with and without
//! momentum and weight decay, unscaling, the fp16 and bf16 copies of the weights, and the finite
//! check that flags inf and NaN and makes the step leave everything untouched; and both over
//! many tensors in one launch (through a table of their addresses), equal to one launch each.

mod common;

use common::{assert_close, bytes, per_backend, random, rng, wide, F32};
use half::{bf16, f16};
use nanoddp::backend::op::SgdTensor;
use nanoddp::backend::{Backend, BackendError, Precision, SgdStep, TensorTable};

const N: usize = 70_001; // not a multiple of any block or chunk size

fn reference(w: &[f64], g: &[f64], v: Option<&[f64]>, s: SgdStep) -> (Vec<f64>, Vec<f64>) {
    let (mut w2, mut v2) = (w.to_vec(), vec![0.0; w.len()]);
    for i in 0..w.len() {
        let mut d = g[i] * s.inv_scale as f64 + s.weight_decay as f64 * w[i];
        if let Some(v) = v {
            d += s.momentum as f64 * v[i];
            v2[i] = d;
        }
        w2[i] -= s.lr as f64 * d;
    }
    (w2, v2)
}

/// One SGD step with a weight copy of type `T` (or none), against the float64 reference;
/// `nearest` rounds an f32 to the nearest `T` (the `half` crate's rounding, not the code
/// under test) for checking the copy bit for bit.
fn sgd_case<B: Backend, T: Precision>(
    dev: &B,
    seed: u64,
    momentum: bool,
    copy: bool,
    nearest: fn(f32) -> f64,
) -> Vec<u8> {
    let mut g = rng(seed);
    let w: Vec<f32> = random(&mut g, N);
    let grad: Vec<f32> = random(&mut g, N);
    let v: Vec<f32> = random(&mut g, N);
    let step = SgdStep {
        lr: 0.05,
        inv_scale: 1.0 / 64.0,
        momentum: 0.9,
        weight_decay: 5e-4,
    };
    let mut dw = dev.upload(&w).unwrap();
    let dg = dev.upload(&grad).unwrap();
    let mut dv = dev.upload(&v).unwrap();
    let mut dh = dev.upload(&[T::from_f32(f32::NAN); N]).unwrap();
    let found = dev.upload(&[0i32]).unwrap();
    dev.sgd_step(
        &mut dw,
        &dg,
        momentum.then_some(&mut dv),
        copy.then_some(&mut dh),
        step,
        None,
        Some(&found),
    )
    .unwrap();
    let (want_w, want_v) = reference(
        &wide(&w),
        &wide(&grad),
        momentum.then(|| wide(&v)).as_deref(),
        step,
    );
    let got_w = dev.download(&dw).unwrap();
    let mag: Vec<f64> = want_w.iter().map(|x| x.abs() + 0.1).collect();
    assert_close("weights", &got_w, &want_w, &mag, F32);
    if momentum {
        let got_v = dev.download(&dv).unwrap();
        assert_close("velocity", &got_v, &want_v, &vec![1.0; N], F32);
    } else {
        assert_eq!(
            dev.download(&dv).unwrap(),
            v,
            "velocity untouched without momentum"
        );
    }
    let got_h = wide(&dev.download(&dh).unwrap());
    if copy {
        let exact: Vec<f64> = got_w.iter().map(|w| nearest(*w)).collect();
        assert_eq!(
            got_h,
            exact,
            "{} copy = {}(new weights)",
            T::DTYPE,
            T::DTYPE
        );
    } else {
        assert!(
            got_h.iter().all(|h| h.is_nan()),
            "the copy is untouched when not asked for"
        );
    }
    bytes(&got_w)
}

fn sgd_step<B: Backend>(dev: &B) -> Vec<u8> {
    let as_f32: fn(f32) -> f64 = f64::from;
    let as_f16: fn(f32) -> f64 = |w| f16::from_f32(w).to_f64();
    let as_bf16: fn(f32) -> f64 = |w| bf16::from_f32(w).to_f64();
    let mut out = sgd_case::<B, f32>(dev, 40, true, false, as_f32);
    out.extend(sgd_case::<B, f32>(dev, 41, false, false, as_f32));
    out.extend(sgd_case::<B, f16>(dev, 42, true, true, as_f16));
    out.extend(sgd_case::<B, f16>(dev, 43, false, true, as_f16));
    out.extend(sgd_case::<B, bf16>(dev, 44, true, true, as_bf16));
    out.extend(sgd_case::<B, bf16>(dev, 45, false, false, as_bf16));
    out
}

/// `grad` stored as `T`, checked: the flag `grad_check` leaves.
fn flag<B: Backend, T: Precision>(dev: &B, grad: &[f32]) -> i32 {
    let g: Vec<T> = grad.iter().map(|v| T::from_f32(*v)).collect();
    let dg = dev.upload(&g).unwrap();
    let mut found = dev.upload(&[0i32]).unwrap();
    dev.grad_check(&dg, &mut found).unwrap();
    dev.download(&found).unwrap()[0]
}

fn finite_check_flags_overflow_and_skips_the_step<B: Backend>(dev: &B) -> Vec<u8> {
    let step = SgdStep {
        lr: 0.1,
        inv_scale: 1.0,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        for at in [0, N / 2, N - 1] {
            let mut g32 = vec![0.5f32; N];
            g32[at] = bad;
            let flags = [
                flag::<B, f32>(dev, &g32),
                flag::<B, f16>(dev, &g32),
                flag::<B, bf16>(dev, &g32),
            ];
            assert_eq!(
                flags, [1; 3],
                "{bad} at {at} must be flagged (f32, f16, bf16)"
            );
            let w = vec![1.0f32; N];
            let mut dw = dev.upload(&w).unwrap();
            let mut copy = dev.upload(&vec![bf16::ONE; N]).unwrap();
            let found = dev.upload(&[1i32]).unwrap();
            let dg = dev.upload(&g32).unwrap();
            dev.sgd_step(
                &mut dw,
                &dg,
                None,
                Some(&mut copy),
                step,
                None,
                Some(&found),
            )
            .unwrap();
            assert_eq!(
                dev.download(&dw).unwrap(),
                w,
                "weights untouched after {bad}"
            );
            assert!(
                dev.download(&copy).unwrap().iter().all(|c| *c == bf16::ONE),
                "copy untouched"
            );
        }
    }
    // Finite gradients, including the largest of each type, do not set the flag (and it is
    // not reset).
    let fine = [
        flag::<B, f32>(dev, &[f32::MAX; 1000]),
        flag::<B, f16>(dev, &[65504.0; 1000]),
        flag::<B, bf16>(dev, &[bf16::MAX.to_f32(); 1000]),
    ];
    assert_eq!(fine, [0; 3]);
    let mut found = dev.upload(&[1i32]).unwrap();
    let half_max = dev.upload(&vec![f16::MAX; 1000]).unwrap();
    dev.grad_check(&half_max, &mut found).unwrap();
    assert_eq!(
        dev.download(&found).unwrap(),
        vec![1],
        "the flag is sticky across buffers"
    );
    Vec::new()
}

/// Tensors of odd sizes, some with momentum and a copy, updated in one launch: bit for bit
/// what one launch per tensor gives; then other buffers through the same table (it must
/// follow them), a set flag (nothing moves), the checks.
fn many_tensors_in_one_launch_equal_one_launch_each<B: Backend>(dev: &B) -> Vec<u8> {
    let mut g = rng(46);
    let sizes = [1usize, 1000, 257, 4099];
    let step = SgdStep {
        lr: 0.03,
        inv_scale: 0.5,
        momentum: 0.9,
        weight_decay: 1e-3,
    };
    let make = |g: &mut rand::rngs::StdRng| {
        sizes
            .iter()
            .map(|&n| {
                let w: Vec<f32> = random(g, n);
                let grad: Vec<f32> = random(g, n);
                let v: Vec<f32> = random(g, n);
                (w, grad, v)
            })
            .collect::<Vec<_>>()
    };
    let mut table = TensorTable::new(dev, sizes.len()).unwrap();
    let mut out = Vec::new();
    for round in 0..2 {
        // A fresh set of buffers each round: the table must be rewritten to follow them.
        let host = make(&mut g);
        let upload = || {
            host.iter()
                .map(|(w, grad, v)| {
                    (
                        dev.upload(w).unwrap(),
                        dev.upload(grad).unwrap(),
                        dev.upload(v).unwrap(),
                        dev.upload(&vec![f16::NAN; w.len()]).unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let (mut one, mut each) = (upload(), upload());
        // Tensor i has momentum when i is odd, a copy when i > 1.
        let tensors = one
            .iter_mut()
            .enumerate()
            .map(|(i, (w, grad, v, c))| SgdTensor {
                w,
                grad,
                velocity: (i % 2 == 1).then_some(v),
                w_copy: (i > 1).then_some(c),
            })
            .collect();
        dev.sgd_step_many::<f16>(tensors, &mut table, step, None, None)
            .unwrap();
        for (i, (w, grad, v, c)) in each.iter_mut().enumerate() {
            let velocity = (i % 2 == 1).then_some(v);
            let copy = (i > 1).then_some(c);
            dev.sgd_step::<f16>(w, grad, velocity, copy, step, None, None)
                .unwrap();
        }
        for (i, (a, b)) in one.iter().zip(&each).enumerate() {
            let what = format!("round {round}, tensor {i} of {}", sizes[i]);
            let (wa, wb) = (dev.download(&a.0).unwrap(), dev.download(&b.0).unwrap());
            assert_eq!(bytes(&wa), bytes(&wb), "{what}: weights");
            assert_ne!(wa, host[i].0, "{what}: moved");
            let (va, vb) = (dev.download(&a.2).unwrap(), dev.download(&b.2).unwrap());
            assert_eq!(bytes(&va), bytes(&vb), "{what}: velocity");
            let (ca, cb) = (dev.download(&a.3).unwrap(), dev.download(&b.3).unwrap());
            assert_eq!(
                common::half_bits(&ca),
                common::half_bits(&cb),
                "{what}: copy"
            );
            out.extend(bytes(&wa));
        }
        // A set flag: nothing moves, in any tensor.
        let before: Vec<Vec<f32>> = one.iter().map(|t| dev.download(&t.0).unwrap()).collect();
        let found = dev.upload(&[1i32]).unwrap();
        let tensors = one
            .iter_mut()
            .map(|(w, grad, _, _)| SgdTensor::<B, f32> {
                w,
                grad,
                velocity: None,
                w_copy: None,
            })
            .collect();
        dev.sgd_step_many(tensors, &mut table, step, None, Some(&found))
            .unwrap();
        let after: Vec<Vec<f32>> = one.iter().map(|t| dev.download(&t.0).unwrap()).collect();
        assert_eq!(
            before, after,
            "round {round}: a set flag skips every tensor"
        );
        // The check over all of them: a NaN in the third tensor's last element is seen.
        let grads: Vec<&_> = one.iter().map(|t| &t.1).collect();
        let mut check = TensorTable::new(dev, sizes.len()).unwrap();
        let mut found = dev.upload(&[0i32]).unwrap();
        dev.grad_check_many(&grads, &mut check, &mut found).unwrap();
        assert_eq!(dev.download(&found).unwrap(), [0], "finite gradients");
        let mut bad = host[2].1.clone();
        *bad.last_mut().unwrap() = f32::NAN;
        dev.write(&bad, &mut one[2].1).unwrap();
        let grads: Vec<&_> = one.iter().map(|t| &t.1).collect();
        dev.grad_check_many(&grads, &mut check, &mut found).unwrap();
        assert_eq!(dev.download(&found).unwrap(), [1], "the NaN is flagged");
    }
    // More tensors than the table holds, or none: refused.
    let mut small = TensorTable::new(dev, 1).unwrap();
    let (a, b) = (
        dev.upload(&[1.0f32]).unwrap(),
        dev.upload(&[1.0f32]).unwrap(),
    );
    let mut found = dev.upload(&[0i32]).unwrap();
    let e = dev.grad_check_many(&[&a, &b], &mut small, &mut found);
    assert!(matches!(e, Err(BackendError::BadShape { .. })), "{e:?}");
    let e = dev.grad_check_many(&[], &mut small, &mut found);
    assert!(matches!(e, Err(BackendError::BadShape { .. })), "{e:?}");
    out
}

per_backend!(
    sgd_step,
    finite_check_flags_overflow_and_skips_the_step,
    many_tensors_in_one_launch_equal_one_launch_each
);
