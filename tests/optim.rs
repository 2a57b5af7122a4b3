//! The optimizer step (`kernels/optim.cu` and the CPU backend): SGD with and without
//! momentum and weight decay, unscaling, the half copy of the weights, and the finite
//! check that flags inf and NaN and makes the step leave everything untouched.

mod common;

use common::{assert_close, bytes, per_backend, random, rng, wide, F32};
use half::f16;
use nanoddp::backend::{Backend, Precision, SgdStep};

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

fn sgd_case<B: Backend, G: Precision>(
    dev: &B,
    seed: u64,
    momentum: bool,
    half_copy: bool,
) -> Vec<u8> {
    let mut g = rng(seed);
    let w: Vec<f32> = random(&mut g, N);
    let grad: Vec<G> = random(&mut g, N);
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
    let mut dh = dev.upload(&vec![f16::NAN; N]).unwrap();
    let found = dev.upload(&[0i32]).unwrap();
    dev.sgd_step(
        &mut dw,
        &dg,
        momentum.then_some(&mut dv),
        half_copy.then_some(&mut dh),
        step,
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
    let got_h = dev.download(&dh).unwrap();
    if half_copy {
        let exact: Vec<u16> = got_w.iter().map(|w| f16::from_f32(*w).to_bits()).collect();
        assert_eq!(
            got_h.iter().map(|h| h.to_bits()).collect::<Vec<_>>(),
            exact,
            "half copy = f16(new weights)"
        );
    } else {
        assert!(
            got_h.iter().all(|h| h.is_nan()),
            "half copy untouched when not asked for"
        );
    }
    bytes(&got_w)
}

fn sgd_step<B: Backend>(dev: &B) -> Vec<u8> {
    let mut out = sgd_case::<B, f32>(dev, 40, true, true);
    out.extend(sgd_case::<B, f32>(dev, 41, false, false));
    out.extend(sgd_case::<B, f16>(dev, 42, true, true));
    out.extend(sgd_case::<B, f16>(dev, 43, false, true));
    out
}

fn finite_check_flags_overflow_and_skips_the_step<B: Backend>(dev: &B) -> Vec<u8> {
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        for at in [0, N / 2, N - 1] {
            let mut g32 = vec![0.5f32; N];
            g32[at] = bad;
            let g16: Vec<f16> = g32.iter().map(|v| f16::from_f32(*v)).collect();
            let w = vec![1.0f32; N];
            for half in [false, true] {
                let mut found = dev.upload(&[0i32]).unwrap();
                let mut dw = dev.upload(&w).unwrap();
                let step = SgdStep {
                    lr: 0.1,
                    inv_scale: 1.0,
                    momentum: 0.0,
                    weight_decay: 0.0,
                };
                if half {
                    let dg = dev.upload(&g16).unwrap();
                    dev.grad_check(&dg, &mut found).unwrap();
                    dev.sgd_step(&mut dw, &dg, None, None, step, Some(&found))
                        .unwrap();
                } else {
                    let dg = dev.upload(&g32).unwrap();
                    dev.grad_check(&dg, &mut found).unwrap();
                    dev.sgd_step(&mut dw, &dg, None, None, step, Some(&found))
                        .unwrap();
                }
                assert_eq!(
                    dev.download(&found).unwrap(),
                    vec![1],
                    "{bad} at {at} (half: {half}) must be flagged"
                );
                assert_eq!(
                    dev.download(&dw).unwrap(),
                    w,
                    "weights must be untouched after {bad}"
                );
            }
        }
    }
    // Finite gradients, including the largest half, do not set the flag (and it is not reset).
    let mut found = dev.upload(&[0i32]).unwrap();
    let fine = dev.upload(&vec![f16::MAX; 1000]).unwrap();
    dev.grad_check(&fine, &mut found).unwrap();
    assert_eq!(dev.download(&found).unwrap(), vec![0]);
    let mut found = dev.upload(&[1i32]).unwrap();
    dev.grad_check(&fine, &mut found).unwrap();
    assert_eq!(
        dev.download(&found).unwrap(),
        vec![1],
        "the flag is sticky across buffers"
    );
    Vec::new()
}

per_backend!(sgd_step, finite_check_flags_overflow_and_skips_the_step);
