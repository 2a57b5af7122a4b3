//! GEMM (`kernels/gemm.cu` and the CPU backend) against the float64 reference: every
//! transpose case a linear layer needs, every epilogue, LeNet's shapes and awkward ones,
//! fp32 and the half-input tensor-core path, outputs poisoned before each call. And the
//! preconditions of the wmma tile loads and stores that path relies on (alignment, leading
//! dimension, one pointer for the whole warp), which the emulator must enforce.

mod common;

use common::reference as r;
use common::{
    bytes, check_and_record, per_backend, random, rng, wide, Tol, BF16, F16, F32, F32_LONG,
};
use half::{bf16, f16};
use nanoddp::backend::simt::{EmulatorError, EmulatorFault, SimtBuffer, SimtDevice};
use nanoddp::backend::simt_module::SimtModule;
use nanoddp::backend::{
    Backend, BackendError, DeviceBuffer, Epilogue, GemmShape, KernelArg, KernelDevice,
    LaunchConfig, Memory, Precision,
};
use nanoddp::kernels::Scalar;

/// (M, N, K): 1s, primes, non-multiples of the 64x64x16 tiles, LeNet's layers at batch 257
/// (forward fc1/fc2/fc3 and the weight-gradient shape of fc1), and one product with enough
/// 64x64 tiles (11 x 12) that the CUDA backend's f32 kernel takes those rather than 16x16
/// tiles with K cut among warps (`gemm_f32_sliced`, which the smaller ones take).
const SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (7, 13, 5),
    (65, 63, 17),
    (64, 64, 16),
    (3, 130, 97),
    (257, 120, 256),
    (257, 84, 120),
    (257, 10, 84),
    (120, 256, 257),
    (701, 743, 9),
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
        check_and_record(
            &format!("{shape:?} bias {bias} {ep:?}"),
            &got,
            &want,
            tol,
            &mut out,
        );
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
        dev.gemm(s, a, b, bias, c, ep).unwrap()
    })
}

fn gemm_f16_inputs_f16_output<B: Backend>(dev: &B) -> Vec<u8> {
    run_gemm::<B, f16, f16>(dev, 3, F16, |dev, s, a, b, bias, c, ep| {
        dev.gemm(s, a, b, bias, c, ep).unwrap()
    })
}

fn gemm_bf16_inputs_f32_output<B: Backend>(dev: &B) -> Vec<u8> {
    // bf16 inputs (8-bit significands) and their products are exact in f32 too.
    run_gemm::<B, bf16, f32>(dev, 4, F32_LONG, |dev, s, a, b, bias, c, ep| {
        dev.gemm(s, a, b, bias, c, ep).unwrap()
    })
}

fn gemm_bf16_inputs_bf16_output<B: Backend>(dev: &B) -> Vec<u8> {
    run_gemm::<B, bf16, bf16>(dev, 5, BF16, |dev, s, a, b, bias, c, ep| {
        dev.gemm(s, a, b, bias, c, ep).unwrap()
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
    // f32 inputs with a half result: no kernel, so refused on every backend, C untouched.
    let mut c_half = dev.upload(&[f16::from_f32(7.0); 4]).unwrap();
    let e = dev
        .gemm(&s, &a, &b, None, &mut c_half, Epilogue::default())
        .unwrap_err();
    assert!(
        e.to_string().contains("fp32 inputs with a fp16 result"),
        "{e}"
    );
    assert_eq!(dev.download(&c_half).unwrap(), [f16::from_f32(7.0); 4]);
    // bf16 inputs with an fp16 result: no kernel either.
    let (a16, b16) = (
        dev.upload(&[bf16::ONE; 6]).unwrap(),
        dev.upload(&[bf16::ONE; 6]).unwrap(),
    );
    let e = dev
        .gemm(&s, &a16, &b16, None, &mut c_half, Epilogue::default())
        .unwrap_err();
    assert!(
        e.to_string().contains("bf16 inputs with a fp16 result"),
        "{e}"
    );
    assert_eq!(dev.download(&c_half).unwrap(), [f16::from_f32(7.0); 4]);
    bytes(&dev.download(&c).unwrap())
}

per_backend!(
    gemm_f32,
    gemm_f16_inputs_f32_output,
    gemm_f16_inputs_f16_output,
    gemm_bf16_inputs_f32_output,
    gemm_bf16_inputs_bf16_output,
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

// ------------------------------------------------------------------ wmma's preconditions

/// The emulator's report on a launch that must fail.
fn wmma_misuse(result: Result<(), BackendError>) -> EmulatorError {
    match result {
        Err(BackendError::Emulator(e)) => *e,
        other => panic!("expected the emulator to report misuse, got {other:?}"),
    }
}

/// One block of `threads` (32: one warp).
fn one_warp(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1, 1),
        block: (threads, 1, 1),
        shared_bytes: 0,
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn misaligned_wmma_tiles_are_reported_at_the_kernels_line() {
    // The self-test kernel computes D = A·B + C from four 16x16 tiles; raw launches at
    // byte offsets into larger buffers hand it tiles that are 16- but not 32-byte aligned.
    use nanoddp::kernels::selftest::WMMA_ROW_MAJOR;
    let dev = SimtDevice::new(0);
    let a = dev.upload(&vec![f16::ONE; 256 + 16]).unwrap();
    let b = dev.upload(&vec![f16::ONE; 256]).unwrap();
    let c = dev.upload(&vec![0.0f32; 256 + 8]).unwrap();
    let mut d = dev.upload(&vec![0.0f32; 256 + 8]).unwrap();
    let ptr = |addr: u64, elem: Scalar, mutable: bool| KernelArg::Ptr {
        addr,
        elem,
        mutable,
    };
    let launch = |a_at: u64, c_at: u64, d_at: u64, d: &mut SimtBuffer<f32>| {
        let args = [
            ptr(a.device_addr() + a_at, Scalar::F16, false),
            ptr(b.device_addr(), Scalar::F16, false),
            ptr(c.device_addr() + c_at, Scalar::F32, false),
            ptr(d.device_addr() + d_at, Scalar::F32, true),
        ];
        // SAFETY: every offset leaves a whole 16x16 tile (ldm 16) inside its buffer.
        unsafe { dev.launch(&WMMA_ROW_MAJOR, one_warp(32), &args) }
    };
    // The emulator's buffers end on a page; these lengths are whole multiples of 32 bytes,
    // so the buffers start 32-byte aligned as cudaMalloc's do.
    for addr in [a.device_addr(), c.device_addr(), d.device_addr()] {
        assert_eq!(addr % 32, 0, "test premise: buffers start 32-byte aligned");
    }
    launch(32, 32, 32, &mut d).expect("tiles 32 bytes into their buffers are aligned");
    assert!(dev.download(&d).unwrap()[8..].iter().all(|&v| v == 16.0));
    for (a_at, c_at, d_at, op) in [
        (16, 0, 0, "wmma::load_matrix_sync"),
        (0, 16, 0, "wmma::load_matrix_sync"),
        (0, 0, 16, "wmma::store_matrix_sync"),
    ] {
        let e = wmma_misuse(launch(a_at, c_at, d_at, &mut d));
        assert_eq!(e.fault, EmulatorFault::WarpMisuse, "{e}");
        assert!(
            e.message.contains(op) && e.message.contains("not 256-bit (32-byte) aligned"),
            "{e}"
        );
        // The kernel's own line, not the emulator header's.
        assert!(
            e.site
                .as_deref()
                .is_some_and(|s| s.starts_with("kernels/selftest.cu:")),
            "{e}"
        );
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn wmma_ldm_and_lanes_disagreeing_are_reported() {
    // A user's kernel, built for the emulator at run time, with every argument of the tile
    // operations in the test's hands.
    let dir = std::env::temp_dir().join(format!("nanoddp-wmma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tile.cu");
    std::fs::write(
        &path,
        r#"#include "simt.cuh"
// D = A·A for 16x16 tiles: A at a + a_at with leading dimension lda (lane 5 adds skew),
// D at d with leading dimension ldd.
extern "C" __global__ void tile(const __half* a, int a_at, int lda, int skew, float* d, int ldd) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a + a_at + (threadIdx.x == 5 ? skew : 0), lda);
    wmma::load_matrix_sync(fb, a, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(d, acc, ldd, wmma::mem_row_major);
}
"#,
    )
    .unwrap();
    let module = SimtModule::compile(&path).unwrap_or_else(|e| panic!("{e}"));
    let dev = SimtDevice::new(0);
    let a = dev.upload(&vec![f16::ONE; 1024]).unwrap();
    let mut d = dev.upload(&vec![0.0f32; 1024]).unwrap();
    let mut run = |threads: u32, a_at: i32, lda: i32, skew: i32, ldd: i32| {
        let args = [
            KernelArg::buffer(&a),
            KernelArg::I32(a_at),
            KernelArg::I32(lda),
            KernelArg::I32(skew),
            KernelArg::buffer_mut(&mut d),
            KernelArg::I32(ldd),
        ];
        // SAFETY: with lda, ldd <= 24 and a_at + skew <= 32, every tile stays inside the
        // 1024-element buffers.
        unsafe { module.launch(&dev, "tile", one_warp(threads), &args) }
    };
    run(32, 16, 24, 0, 20).expect("32-byte offsets and ldm multiples of 16 bytes are fine");
    for (threads, a_at, lda, skew, ldd, says) in [
        (
            32,
            0,
            12,
            0,
            16,
            "ldm 12 is not a multiple of 8 (16 bytes of 16-bit elements)",
        ),
        (
            32,
            0,
            16,
            0,
            6,
            "ldm 6 is not a multiple of 4 (16 bytes of float)",
        ),
        (32, 0, 16, 16, 16, "lanes disagree"),
        (16, 0, 16, 0, 16, "needs all 32 lanes"),
    ] {
        let e = wmma_misuse(run(threads, a_at, lda, skew, ldd));
        assert_eq!(e.fault, EmulatorFault::WarpMisuse, "{e}");
        assert!(e.message.contains(says), "{says:?} missing from: {e}");
        assert!(
            e.site.as_deref().is_some_and(|s| s.contains("tile.cu:")),
            "{e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
