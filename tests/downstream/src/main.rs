//! nanoddp used as a library from a crate of its own: a convolution checked against float64,
//! then a four-rank allreduce checked exactly, on the CPU backend, and with `cuda` on the CUDA
//! backend (a GPU, or nanoddp's CPU stand-in for the driver:
//! `LD_LIBRARY_PATH=$(nanoddp-downstream standin-dir) nanoddp-downstream cuda`).

use std::error::Error;

use nanoddp::comm::transport::CommDevice;
use nanoddp::prelude::*;

type AnyError = Box<dyn Error + Send + Sync>;

const RANKS: usize = 4;

fn main() -> Result<(), AnyError> {
    match std::env::args().nth(1).as_deref() {
        None | Some("cpu") => run_on("cpu", |_| Ok(CpuDevice::new())),
        Some("cuda") => {
            let gpus = CudaDevice::all_infos()?.len();
            let driver = if nanoddp::backend::cuda::is_standin() {
                "nanoddp's CPU stand-in for the driver"
            } else {
                "the CUDA driver"
            };
            println!("cuda: {gpus} GPU(s) from {driver}");
            // Ranks share the GPUs round-robin when there are fewer GPUs than ranks.
            run_on("cuda", |rank| CudaDevice::new(rank % gpus))
        }
        Some("standin-dir") => {
            println!("{}", nanoddp::backend::cuda::STANDIN_DIR);
            Ok(())
        }
        Some(other) => Err(format!("unknown argument {other:?}: cpu, cuda or standin-dir").into()),
    }
}

fn run_on<D>(name: &str, open: impl Fn(usize) -> Result<D, BackendError>) -> Result<(), AnyError>
where
    D: Backend + CommDevice + Clone + 'static,
{
    let worst = convolution(&open(0)?)?;
    println!("{name}: conv2d forward within {worst:.1e} of float64 (relative)");
    let devices = (0..RANKS).map(open).collect::<Result<Vec<_>, _>>()?;
    all_reduce(devices)?;
    println!("{name}: {RANKS}-rank ring and tree allreduce exact on every rank");
    Ok(())
}

/// A pseudo-random value in [-0.5, 0.5) for index `i`.
fn value(i: usize, salt: u64) -> f32 {
    let mut x = (i as u64 ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
}

/// `y = relu(conv2d(x, w) + bias)` on odd sizes (no dimension a multiple of a tile), compared
/// with the same sum in float64; returns the largest error relative to the sum of magnitudes.
fn convolution<D: Backend>(dev: &D) -> Result<f64, AnyError> {
    let s = Conv2dShape {
        batch: 3,
        in_c: 3,
        in_h: 13,
        in_w: 11,
        out_c: 5,
        k_h: 5,
        k_w: 5,
        stride: 2,
        pad: 1,
    };
    let (oh, ow) = (
        (s.in_h + 2 * s.pad - s.k_h) / s.stride + 1,
        (s.in_w + 2 * s.pad - s.k_w) / s.stride + 1,
    );
    let x: Vec<f32> = (0..s.batch * s.in_c * s.in_h * s.in_w)
        .map(|i| value(i, 1))
        .collect();
    let w: Vec<f32> = (0..s.out_c * s.in_c * s.k_h * s.k_w)
        .map(|i| value(i, 2))
        .collect();
    let bias: Vec<f32> = (0..s.out_c).map(|i| value(i, 3)).collect();
    let len = s.batch * s.out_c * oh * ow;
    // Poisoned: an output the kernel forgets stays NaN and fails the check.
    let mut y = dev.upload(&vec![f32::NAN; len])?;
    dev.conv2d_forward(
        &s,
        &dev.upload(&x)?,
        &dev.upload(&w)?,
        Some(&dev.upload(&bias)?),
        &mut y,
        true,
    )?;
    let got = dev.download(&y)?;
    let mut worst = 0.0f64;
    for n in 0..s.batch {
        for o in 0..s.out_c {
            for (r, c) in (0..oh).flat_map(|r| (0..ow).map(move |c| (r, c))) {
                let (mut sum, mut magnitude) = (f64::from(bias[o]), f64::from(bias[o]).abs());
                for (i, kr, kc) in (0..s.in_c).flat_map(|i| {
                    (0..s.k_h).flat_map(move |kr| (0..s.k_w).map(move |kc| (i, kr, kc)))
                }) {
                    let (ir, ic) = (
                        (r * s.stride + kr) as isize - s.pad as isize,
                        (c * s.stride + kc) as isize - s.pad as isize,
                    );
                    if ir < 0 || ic < 0 || ir >= s.in_h as isize || ic >= s.in_w as isize {
                        continue;
                    }
                    let xv = f64::from(
                        x[((n * s.in_c + i) * s.in_h + ir as usize) * s.in_w + ic as usize],
                    );
                    let wv = f64::from(w[((o * s.in_c + i) * s.k_h + kr) * s.k_w + kc]);
                    sum += xv * wv;
                    magnitude += (xv * wv).abs();
                }
                let want = sum.max(0.0);
                let have = f64::from(got[((n * s.out_c + o) * oh + r) * ow + c]);
                let error = (have - want).abs() / magnitude.max(f64::MIN_POSITIVE);
                if !(error <= 1e-5) {
                    return Err(format!(
                        "conv2d output ({n}, {o}, {r}, {c}) is {have}, float64 says {want}"
                    )
                    .into());
                }
                worst = worst.max(error);
            }
        }
    }
    Ok(worst)
}

/// Rank r holds (r + 1) · (i mod 7) + i mod 3: small integers, so every sum is exact in f32
/// whatever the order of additions, and any difference is a bug.
fn all_reduce<D: CommDevice + Clone + 'static>(devices: Vec<D>) -> Result<(), AnyError> {
    const COUNT: usize = 100_003;
    let input = |r: usize, i: usize| ((r + 1) * (i % 7) + i % 3) as f32;
    for algorithm in [Algorithm::Ring, Algorithm::Tree] {
        let ranks = communicator(devices.clone(), CommConfig::default())?;
        let results = on_each_rank(ranks, |mut rank| -> Result<Vec<f32>, AnyError> {
            let dev = rank.device().clone();
            let mine: Vec<f32> = (0..COUNT).map(|i| input(rank.rank(), i)).collect();
            let mut x = dev.upload(&mine)?;
            rank.all_reduce(&mut x, ReduceOp::Sum, Some(algorithm))?;
            Ok(dev.download(&x)?)
        })?;
        for (r, got) in results.into_iter().enumerate() {
            let got = got?;
            if let Some(i) =
                (0..COUNT).find(|&i| got[i] != (0..RANKS).map(|q| input(q, i)).sum::<f32>())
            {
                return Err(
                    format!("{}: rank {r} element {i} is {}", algorithm.name(), got[i]).into(),
                );
            }
        }
    }
    Ok(())
}
