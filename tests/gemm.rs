//! GEMM (`kernels/gemm.cu` and the CPU backend) against the float64 reference: every
//! transpose case a linear layer needs, every epilogue, LeNet's shapes and awkward ones,
//! fp32 and the half-input tensor-core path, outputs poisoned before each call.

mod common;

use common::reference as r;
use common::{assert_close, bytes, per_backend, random, rng, wide, Tol, F16, F32, F32_LONG};
use half::f16;
use nanoddp::backend::{Backend, Epilogue, GemmShape, Precision};

/// (M, N, K): 1s, primes, non-multiples of the 64x64x16 tiles, and LeNet's layers at
/// batch 257 (forward fc1/fc2/fc3 and the weight-gradient shape of fc1).
const SHAPES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (7, 13, 5),
    (65, 63, 17),
    (64, 64, 16),
    (3, 130, 97),
    (257, 120, 256),
    (257, 84, 120),
    (257, 10, 84),
    (120, 256, 257),
];

/// (shape, with a bias, epilogue).
fn cases() -> Vec<(GemmShape, bool, Epilogue)> {
    let mut out = Vec::new();
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            // Rotate through the epilogues so every shape meets several of them.
            let ep = match (i + trans_a as usize * 2 + trans_b as usize) % 4 {
                0 => Epilogue::default(),
                1 => Epilogue {
                    alpha: 0.5,
                    beta: 0.0,
                    relu: true,
                },
                2 => Epilogue {
                    alpha: 1.0,
                    beta: 0.75,
                    relu: false,
                },
                _ => Epilogue {
                    alpha: -1.25,
                    beta: 1.0,
                    relu: true,
                },
            };
            out.push((
                GemmShape {
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                },
                i % 3 != 0,
                ep,
            ));
        }
    }
    out
}

fn run_gemm<B: Backend, A: Precision, C: Precision>(
    dev: &B,
    seed: u64,
    tol: Tol,
    call: impl Fn(
        &B,
        &GemmShape,
        &B::Buffer<A>,
        &B::Buffer<A>,
        Option<&B::Buffer<f32>>,
        &mut B::Buffer<C>,
        Epilogue,
    ),
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut g = rng(seed);
    for (shape, bias, ep) in cases() {
        let a: Vec<A> = random(&mut g, shape.m * shape.k);
        let b: Vec<A> = random(&mut g, shape.k * shape.n);
        let bias_host: Vec<f32> = random(&mut g, shape.n);
        // With beta = 0 the old C must not be read: poison it. Otherwise it is an input.
        let c_in: Vec<C> = if ep.beta == 0.0 {
            vec![C::from_f32(f32::NAN); shape.m * shape.n]
        } else {
            random(&mut g, shape.m * shape.n)
        };
        let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
        let dbias = dev.upload(&bias_host).unwrap();
        let mut dc = dev.upload(&c_in).unwrap();
        call(dev, &shape, &da, &db, bias.then_some(&dbias), &mut dc, ep);
        let got = dev.download(&dc).unwrap();
        let want = r::gemm(
            &shape,
            &wide(&a),
            &wide(&b),
            bias.then(|| wide(&bias_host)).as_deref(),
            &wide(&c_in),
            ep,
        );
        assert_close(
            &format!("{shape:?} bias {bias} {ep:?}"),
            &got,
            &want.value,
            &want.mag,
            tol,
        );
        out.extend(bytes(&got));
    }
    out
}

fn gemm_f32<B: Backend>(dev: &B) -> Vec<u8> {
    run_gemm::<B, f32, f32>(dev, 1, F32_LONG, |dev, s, a, b, bias, c, ep| {
        dev.gemm(s, a, b, bias, c, ep).unwrap()
    })
}

fn gemm_f16_inputs_f32_output<B: Backend>(dev: &B) -> Vec<u8> {
    // Half inputs are exact in f32, their products exact too: only f32 accumulation rounds.
    run_gemm::<B, f16, f32>(dev, 2, F32_LONG, |dev, s, a, b, bias, c, ep| {
        dev.gemm_f16(s, a, b, bias, c, ep).unwrap()
    })
}

fn gemm_f16_inputs_f16_output<B: Backend>(dev: &B) -> Vec<u8> {
    run_gemm::<B, f16, f16>(dev, 3, F16, |dev, s, a, b, bias, c, ep| {
        dev.gemm_f16(s, a, b, bias, c, ep).unwrap()
    })
}

fn bad_gemm_arguments_are_errors<B: Backend>(dev: &B) -> Vec<u8> {
    let a = dev.upload(&[1.0f32; 6]).unwrap();
    let b = dev.upload(&[1.0f32; 6]).unwrap();
    let mut c = dev.upload(&[0.0f32; 4]).unwrap();
    let s = GemmShape::new(2, 2, 3);
    assert!(dev
        .gemm(&s, &a, &b, None, &mut c, Epilogue::default())
        .is_ok());
    let wrong_k = GemmShape::new(2, 2, 4);
    let e = dev
        .gemm(&wrong_k, &a, &b, None, &mut c, Epilogue::default())
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("buffer `a` holds 6 elements, the shape needs 8"),
        "{e}"
    );
    let empty = GemmShape::new(0, 2, 3);
    assert!(dev
        .gemm(&empty, &a, &b, None, &mut c, Epilogue::default())
        .is_err());
    let short_bias = dev.upload(&[1.0f32]).unwrap();
    assert!(dev
        .gemm(&s, &a, &b, Some(&short_bias), &mut c, Epilogue::default())
        .is_err());
    bytes(&dev.download(&c).unwrap())
}

per_backend!(
    gemm_f32,
    gemm_f16_inputs_f32_output,
    gemm_f16_inputs_f16_output,
    bad_gemm_arguments_are_errors
);

#[test]
fn the_cases_cover_every_transpose_and_epilogue() {
    let c = cases();
    for t in [(false, false), (false, true), (true, false), (true, true)] {
        assert!(c.iter().any(|(s, _, _)| (s.trans_a, s.trans_b) == t));
    }
    assert!(c.iter().any(|(_, b, e)| *b && e.relu && e.beta != 0.0));
    assert!(c.iter().any(|(_, b, e)| !*b && e.beta == 0.0 && !e.relu));
    let _ = F32;
}
