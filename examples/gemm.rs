//! One GEMM on every backend this machine has, each checked against the CPU backend.
//!
//! `cargo run --release --example gemm [M N K]` (default 129 x 67 x 300: no size is a
//! multiple of a tile). The CPU backend is the reference; the SIMT backend runs
//! `kernels/gemm.cu` on the CPU under the emulator; the CUDA backend runs it on GPU 0 when
//! there is one (and says why not otherwise).

use std::error::Error;

use nanoddp::prelude::*;

/// `C = A·B + bias` (then ReLU) on `dev`, for row-major `a` (m x k) and `b` (k x n).
fn gemm_on<D: Backend>(
    dev: &D,
    shape: &GemmShape,
    a: &[f32],
    b: &[f32],
    bias: &[f32],
) -> Result<Vec<f32>, BackendError> {
    let (a, b, bias) = (dev.upload(a)?, dev.upload(b)?, dev.upload(bias)?);
    // Poisoned output: an element the kernel forgets stays NaN and fails the comparison.
    let mut c = dev.upload(&vec![f32::NAN; shape.m * shape.n])?;
    let epilogue = Epilogue {
        relu: true,
        ..Epilogue::default()
    };
    dev.gemm(shape, &a, &b, Some(&bias), &mut c, epilogue)?;
    dev.download(&c)
}

fn max_rel_diff(x: &[f32], reference: &[f32]) -> f64 {
    x.iter()
        .zip(reference)
        .map(|(&v, &r)| {
            if v.is_nan() {
                f64::INFINITY
            } else {
                (v as f64 - r as f64).abs() / (1.0 + (r as f64).abs())
            }
        })
        .fold(0.0, f64::max)
}

fn main() -> Result<(), Box<dyn Error>> {
    let dims: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().map_err(|_| format!("not a size: {a}")))
        .collect::<Result<_, _>>()?;
    let (m, n, k) = match dims[..] {
        [] => (129, 67, 300),
        [m, n, k] if m > 0 && n > 0 && k > 0 => (m, n, k),
        _ => return Err("usage: gemm [M N K] (all at least 1)".into()),
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    let (a, b, bias) = (random(m * k), random(k * n), random(n));
    let shape = GemmShape::new(m, n, k);
    println!("C = relu(A·B + bias), {m} x {n} x {k}");

    let reference = gemm_on(&CpuDevice::new(), &shape, &a, &b, &bias)?;
    println!("cpu : reference");
    // Tolerance: k products in f32, summed in different orders by different backends.
    let tolerance = 1e-5 * (k as f64).sqrt() * 4.0;
    let simt = gemm_on(&SimtDevice::new(0), &shape, &a, &b, &bias)?;
    let d = max_rel_diff(&simt, &reference);
    println!("simt: max relative difference {d:.2e} (tolerance {tolerance:.1e})");
    if d > tolerance {
        return Err(format!("simt differs from cpu by {d:.2e}").into());
    }
    match CudaDevice::new(0) {
        Ok(gpu) => {
            let out = gemm_on(&gpu, &shape, &a, &b, &bias)?;
            let d = max_rel_diff(&out, &reference);
            println!("cuda: max relative difference {d:.2e} (tolerance {tolerance:.1e})");
            if d > tolerance {
                return Err(format!("cuda differs from cpu by {d:.2e}").into());
            }
        }
        // CI runs this with the CPU stand-in for the driver on LD_LIBRARY_PATH and
        // NANODDP_EXPECT_CUDA=1: there, no CUDA is a failure, not a skip.
        Err(why) if std::env::var_os("NANODDP_EXPECT_CUDA").is_some() => {
            return Err(format!("cuda: expected to run, but {why}").into())
        }
        Err(why) => println!(
            "cuda: skipped ({why}); LD_LIBRARY_PATH={} runs it on the CPU stand-in",
            nanoddp::backend::cuda::STANDIN_DIR
        ),
    }
    Ok(())
}
