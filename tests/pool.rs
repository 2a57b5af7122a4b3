//! Max and average pooling (`kernels/pool.cu` and the CPU backend) against the float64
//! reference: LeNet's 2x2/2, overlapping 3x3/2 and 3x3/1 windows, non-square ones, planes
//! 1 and 257 x 6, ties and NaN in max windows; fp32 and half.

mod common;

use common::reference as r;
use common::{
    assert_close, bytes, check_and_record, per_backend, pool_shape, random, rng, wide, Tol, BF16,
    F16, F32,
};
use half::{bf16, f16};
use nanoddp::backend::{Backend, Pool2dShape, Precision};

fn shapes() -> Vec<Pool2dShape> {
    vec![
        pool_shape(257 * 6, (24, 24), (2, 2), 2), // LeNet pool1 at batch 257
        pool_shape(5, (8, 8), (2, 2), 2),         // LeNet pool2
        pool_shape(7, (9, 9), (2, 2), 2), // nanoddp's pool2: the last row and column are in no window
        pool_shape(3, (7, 71), (2, 2), 2), // rows of several vectors, ragged, odd on both axes
        pool_shape(2, (7, 11), (3, 3), 3), // tiling windows that leave a remainder on both axes
        pool_shape(3, (9, 11), (3, 3), 2), // overlapping windows
        pool_shape(2, (7, 7), (3, 3), 1), // every input under up to 9 windows
        pool_shape(1, (5, 13), (2, 4), 3), // non-square window, a stride that skips inputs
        pool_shape(1, (1, 1), (1, 1), 1),
    ]
}

fn pool_all<B: Backend, T: Precision>(dev: &B, seed: u64, tol: Tol) -> Vec<u8> {
    let mut out = Vec::new();
    let mut g = rng(seed);
    for s in shapes() {
        let (xs, ys) = s.sizes();
        let mut x: Vec<T> = random(&mut g, xs);
        // Ties: repeat values inside windows; the first (row-major) maximum must win.
        for i in (0..xs).step_by(7) {
            x[i] = x[i / 2];
        }
        let dy: Vec<T> = random(&mut g, ys);
        let (dx_, ddy) = (dev.upload(&x).unwrap(), dev.upload(&dy).unwrap());

        let mut y = dev.upload(&vec![T::from_f32(f32::NAN); ys]).unwrap();
        let mut arg = dev.upload(&vec![-1i32; ys]).unwrap();
        dev.max_pool_forward(&s, &dx_, &mut y, &mut arg).unwrap();
        let (want, want_arg) = r::max_pool_forward(&s, &wide(&x));
        let got = dev.download(&y).unwrap();
        assert_close(
            &format!("max forward {s:?}"),
            &got,
            &want,
            &vec![0.0; ys],
            Tol {
                atol: 0.0,
                rtol: 0.0,
            },
        );
        assert_eq!(dev.download(&arg).unwrap(), want_arg, "argmax {s:?}");
        out.extend(bytes(&got));

        let mut dx = dev.upload(&vec![T::from_f32(f32::NAN); xs]).unwrap();
        dev.max_pool_backward(&s, &ddy, &arg, &mut dx).unwrap();
        let want = r::max_pool_backward(&s, &wide(&dy), &want_arg);
        let got = dev.download(&dx).unwrap();
        check_and_record(&format!("max backward {s:?}"), &got, &want, tol, &mut out);

        let mut y = dev.upload(&vec![T::from_f32(f32::NAN); ys]).unwrap();
        dev.avg_pool_forward(&s, &dx_, &mut y).unwrap();
        let want = r::avg_pool_forward(&s, &wide(&x));
        let got = dev.download(&y).unwrap();
        check_and_record(&format!("avg forward {s:?}"), &got, &want, tol, &mut out);

        let mut dx = dev.upload(&vec![T::from_f32(f32::NAN); xs]).unwrap();
        dev.avg_pool_backward(&s, &ddy, &mut dx).unwrap();
        let want = r::avg_pool_backward(&s, &wide(&dy));
        let got = dev.download(&dx).unwrap();
        check_and_record(&format!("avg backward {s:?}"), &got, &want, tol, &mut out);
    }
    out
}

fn pool_f32<B: Backend>(dev: &B) -> Vec<u8> {
    pool_all::<B, f32>(dev, 20, F32)
}

fn pool_f16<B: Backend>(dev: &B) -> Vec<u8> {
    pool_all::<B, f16>(dev, 21, F16)
}

fn pool_bf16<B: Backend>(dev: &B) -> Vec<u8> {
    pool_all::<B, bf16>(dev, 22, BF16)
}

fn max_pool_propagates_nan<B: Backend>(dev: &B) -> Vec<u8> {
    let s = Pool2dShape {
        planes: 1,
        in_h: 2,
        in_w: 4,
        k_h: 2,
        k_w: 2,
        stride: 2,
    };
    let x = dev
        .upload(&[1.0f32, 2.0, 5.0, f32::NAN, 3.0, f32::NAN, 4.0, 9.0])
        .unwrap();
    let mut y = dev.upload(&[0.0f32; 2]).unwrap();
    let mut arg = dev.upload(&[0i32; 2]).unwrap();
    dev.max_pool_forward(&s, &x, &mut y, &mut arg).unwrap();
    let y = dev.download(&y).unwrap();
    assert!(
        y[0].is_nan() && y[1].is_nan(),
        "a NaN in a window must win: {y:?}"
    );
    assert_eq!(dev.download(&arg).unwrap(), vec![5, 3]);
    bytes(&y)
}

per_backend!(pool_f32, pool_f16, pool_bf16, max_pool_propagates_nan);
