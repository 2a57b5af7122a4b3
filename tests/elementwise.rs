//! The elementwise kernels (`kernels/elementwise.cu`) against float64 references, on odd
//! sizes, with outputs poisoned before every launch. Each test body is written once and run
//! on the CPU backend, on the SIMT emulator under two lane orders, and on the GPU when there
//! is one.

mod common;

use half::{bf16, f16};
use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::cuda::CudaDevice;
use nanoddp::backend::simt::{LaneOrder, SimtConfig, SimtDevice};
use nanoddp::backend::{Backend, BackendError, DeviceBuffer};
use rand::{Rng, SeedableRng};

/// Sizes: 1, primes, around the 256-thread block, and past one full grid of blocks so the
/// grid-stride loop wraps: the kernel instances run with `common::small_flat_grids` (3
/// blocks, 768 threads), so 769 and 1021 take two passes and 65,537 takes 86. (Under the
/// GPU's cap of 65,535 blocks the loop would first wrap at 16,776,961 elements.)
const SIZES: [usize; 8] = [1, 2, 31, 255, 257, 769, 1021, 65_537];

/// `|got - want| <= atol + rtol·|want|`; false for NaN, so poison never passes.
fn within(got: f64, want: f64, atol: f64, rtol: f64) -> bool {
    (got - want).abs() <= atol + rtol * want.abs()
}

fn assert_close(got: &[f32], want: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<_> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !within(**g as f64, **w, atol, rtol))
        .collect();
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max);
    assert!(
        bad.is_empty(),
        "{what}: {} of {} outside atol {atol} + rtol {rtol}; max abs error {worst}; first: {:?}",
        bad.len(),
        got.len(),
        &bad[..bad.len().min(5)]
    );
}

fn elementwise_matches_float64<D: Backend>(dev: &D, sizes: &[usize]) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let eps = f32::EPSILON as f64;
    for &n in sizes {
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
        let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
        let dx = dev.upload(&x).unwrap();
        let dy = dev.upload(&y).unwrap();

        let mut out = dev.upload(&vec![f32::NAN; n]).unwrap();
        dev.fill(&mut out, 1.5).unwrap();
        assert_close(
            &dev.download(&out).unwrap(),
            &vec![1.5; n],
            0.0,
            0.0,
            "fill",
        );

        dev.write(&vec![f32::NAN; n], &mut out).unwrap();
        dev.add(&dx, &dy, &mut out).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(a, b)| *a as f64 + *b as f64)
            .collect();
        assert_close(&dev.download(&out).unwrap(), &want, 0.0, eps / 2.0, "add");

        let mut acc = dev.upload(&y).unwrap();
        dev.axpy(0.75, &dx, &mut acc).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(a, b)| 0.75 * *a as f64 + *b as f64)
            .collect();
        // One rounding (fused) or two: within an ulp of the larger operand.
        assert_close(&dev.download(&acc).unwrap(), &want, 4.0 * eps, eps, "axpy");

        let before = dev.download(&acc).unwrap();
        dev.scale(&mut acc, -2.0).unwrap();
        let want: Vec<f64> = before.iter().map(|v| -2.0 * *v as f64).collect();
        assert_close(
            &dev.download(&acc).unwrap(),
            &want,
            0.0,
            0.0,
            "scale by a power of two is exact",
        );
        assert_eq!(acc.len(), n);
    }
}

/// f32 → f16 must be IEEE round-to-nearest-even. Checked without trusting any library: the
/// result must be a nearest half (no neighbour is strictly closer) and, on a tie, even.
fn is_rne(x: f32, h: f16) -> bool {
    if x.is_nan() {
        return h.is_nan();
    }
    let xf = x as f64;
    let value = |bits: u16| f16::from_bits(bits).to_f64();
    let bits = h.to_bits();
    if h.is_infinite() {
        // Overflow: |x| must be at least halfway between 65504 and 65536.
        return h.is_sign_negative() == x.is_sign_negative() && xf.abs() >= 65520.0;
    }
    if h.to_f64() == 0.0 && xf != 0.0 {
        return xf.abs() <= 2f64.powi(-25) && h.is_sign_negative() == x.is_sign_negative();
    }
    let err = (value(bits) - xf).abs();
    let up = value(bits.wrapping_add(1));
    let down = if bits & 0x7fff == 0 {
        value(bits ^ 0x8000)
    } else {
        value(bits.wrapping_sub(1))
    };
    [up, down].iter().all(|&n| {
        let e = (n - xf).abs();
        e > err || (e == err && bits & 1 == 0)
    })
}

fn casts_round_to_nearest_even<D: Backend>(dev: &D) {
    // Every half value, as f32 (exact), must survive the round trip bit for bit.
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let dh = dev.upload(&all).unwrap();
    let mut wide = dev.upload(&vec![f32::NAN; all.len()]).unwrap();
    dev.cast_to_f32(&dh, &mut wide).unwrap();
    let wide_host = dev.download(&wide).unwrap();
    for (h, f) in all.iter().zip(&wide_host) {
        if h.is_nan() {
            assert!(f.is_nan(), "{:#06x} -> {f}", h.to_bits());
        } else {
            assert_eq!(
                *f as f64,
                h.to_f64(),
                "half {:#06x} widened inexactly",
                h.to_bits()
            );
        }
    }
    let mut back = dev.upload(&vec![f16::NAN; all.len()]).unwrap();
    dev.cast_from_f32(&wide, &mut back).unwrap();
    for (h, b) in all.iter().zip(dev.download(&back).unwrap()) {
        if !h.is_nan() {
            assert_eq!(
                b.to_bits(),
                h.to_bits(),
                "round trip of {:#06x}",
                h.to_bits()
            );
        }
    }

    // Random floats over every binade that matters, plus the edges: subnormal halves,
    // exact ties, the overflow threshold, infinities and NaN.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut xs: Vec<f32> = (0..200_000)
        .map(|_| {
            let exp = rng.gen_range(-30..17);
            let mant: f32 = rng.gen_range(1.0..2.0);
            let sign = if rng.gen() { -1.0 } else { 1.0 };
            sign * mant * 2f32.powi(exp)
        })
        .collect();
    for bits in 0u16..0x7c00 {
        // Midpoints between consecutive halves: the ties.
        let lo = f16::from_bits(bits).to_f64();
        let hi = f16::from_bits(bits + 1).to_f64();
        xs.push(((lo + hi) / 2.0) as f32);
    }
    xs.extend([
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-45,
        2f32.powi(-25),
        2f32.powi(-25) * 1.000_001,
        2f32.powi(-24),
        65504.0,
        65519.99,
        65520.0,
        1e10,
        -1e10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let dx = dev.upload(&xs).unwrap();
    let mut dh = dev.upload(&vec![f16::from_bits(0x7e00); xs.len()]).unwrap();
    dev.cast_from_f32(&dx, &mut dh).unwrap();
    let got = dev.download(&dh).unwrap();
    let bad: Vec<_> = xs
        .iter()
        .zip(&got)
        .filter(|(x, h)| !is_rne(**x, **h))
        .take(5)
        .collect();
    assert!(bad.is_empty(), "not round-to-nearest-even: {bad:?}");
}

/// The bf16 nearest to `x` (ties to even), found in float64 from its two neighbours, and
/// NaN as 0x7fff (CUDA's `__float2bfloat16_rn`): independent of the code under test.
fn nearest_even_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let toward_zero = (x.to_bits() >> 16) as u16;
    if x.to_bits() & 0xffff == 0 {
        return toward_zero;
    }
    let away = toward_zero + 1;
    // Past the largest finite bf16 lies infinity, at the distance 2^128 would be.
    let value = |b: u16| match b & 0x7fff {
        0x7f80 => 2f64.powi(128).copysign(x as f64),
        _ => bf16::from_bits(b).to_f64(),
    };
    let (d0, d1) = (
        (x as f64 - value(toward_zero)).abs(),
        (value(away) - x as f64).abs(),
    );
    if d0 < d1 || (d0 == d1 && toward_zero & 1 == 0) {
        toward_zero
    } else {
        away
    }
}

/// bf16: every value widens exactly and survives the round trip; random floats over the whole
/// exponent range, every tie of a sweep of binades, the overflow edge, subnormals and NaN
/// narrow to the nearest even bf16.
fn bf16_casts_round_to_nearest_even<D: Backend>(dev: &D) {
    let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let dh = dev.upload(&all).unwrap();
    let mut wide = dev.upload(&vec![f32::NAN; all.len()]).unwrap();
    dev.cast_to_f32(&dh, &mut wide).unwrap();
    let wide_host = dev.download(&wide).unwrap();
    for (h, f) in all.iter().zip(&wide_host) {
        assert_eq!(
            f.to_bits(),
            u32::from(h.to_bits()) << 16,
            "bf16 {:#06x} widened inexactly",
            h.to_bits()
        );
    }
    let mut back = dev.upload(&vec![bf16::NAN; all.len()]).unwrap();
    dev.cast_from_f32(&wide, &mut back).unwrap();
    for (h, b) in all.iter().zip(dev.download(&back).unwrap()) {
        let want = if h.is_nan() { 0x7fff } else { h.to_bits() };
        assert_eq!(b.to_bits(), want, "round trip of {:#06x}", h.to_bits());
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut xs: Vec<f32> = (0..200_000).map(|_| f32::from_bits(rng.gen())).collect();
    for hi in (0u32..0x7f80).step_by(97).chain([0x7f7f, 0x0000, 0x0080]) {
        for low in [0x7fffu32, 0x8000, 0x8001] {
            for sign in [0, 0x8000_0000] {
                xs.push(f32::from_bits(sign | hi << 16 | low));
            }
        }
    }
    xs.extend([
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -0.0,
        1e-45,
    ]);
    let dx = dev.upload(&xs).unwrap();
    let mut dh = dev
        .upload(&vec![bf16::from_bits(0x1234); xs.len()])
        .unwrap();
    dev.cast_from_f32(&dx, &mut dh).unwrap();
    let got = dev.download(&dh).unwrap();
    let bad: Vec<_> = xs
        .iter()
        .zip(&got)
        .filter(|(x, h)| h.to_bits() != nearest_even_bf16(**x))
        .map(|(x, h)| (x.to_bits(), h.to_bits(), nearest_even_bf16(*x)))
        .take(5)
        .collect();
    assert!(
        bad.is_empty(),
        "not round-to-nearest-even (f32 bits, got, want): {bad:x?}"
    );
}

fn length_mismatch_is_an_error<D: Backend>(dev: &D) {
    let short = dev.upload(&[1.0f32; 3]).unwrap();
    let mut long = dev.upload(&[1.0f32; 4]).unwrap();
    let err = dev.axpy(1.0, &short, &mut long).unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::LengthMismatch {
                left: 3,
                right: 4,
                ..
            }
        ),
        "{err}"
    );
}

fn simt(order: LaneOrder) -> SimtDevice {
    common::small_flat_grids();
    SimtDevice::with_config(
        0,
        SimtConfig {
            lane_order: order,
            workers: 0,
            ..Default::default()
        },
    )
}

/// The CUDA device: a GPU, or the CPU stand-in for the driver (never skipped).
fn gpu() -> CudaDevice {
    common::small_flat_grids();
    common::cuda_device(0)
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn simt_forward_elementwise_matches_float64() {
    elementwise_matches_float64(&simt(LaneOrder::Forward), &SIZES);
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn simt_reverse_elementwise_matches_float64() {
    elementwise_matches_float64(&simt(LaneOrder::Reverse), &SIZES);
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn simt_casts_round_to_nearest_even() {
    casts_round_to_nearest_even(&simt(LaneOrder::Random(3)));
    bf16_casts_round_to_nearest_even(&simt(LaneOrder::Random(3)));
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn simt_length_mismatch_is_an_error() {
    length_mismatch_is_an_error(&simt(LaneOrder::Forward));
}

#[test]
fn cpu_elementwise_matches_float64() {
    let dev = CpuDevice::new();
    elementwise_matches_float64(&dev, &SIZES);
    casts_round_to_nearest_even(&dev);
    bf16_casts_round_to_nearest_even(&dev);
    length_mismatch_is_an_error(&dev);
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn cuda_elementwise_matches_float64() {
    let dev = gpu();
    elementwise_matches_float64(&dev, &SIZES);
    casts_round_to_nearest_even(&dev);
    bf16_casts_round_to_nearest_even(&dev);
    length_mismatch_is_an_error(&dev);
}

fn relu_backward_passes_gradient_where_the_output_is_positive<D: Backend>(dev: &D) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(77);
    let n = 70_003;
    let y: Vec<f32> = (0..n)
        .map(|i| {
            if i % 5 == 0 {
                0.0
            } else {
                rng.gen_range(-2.0f32..2.0).max(0.0)
            }
        })
        .collect();
    let dy: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let want: Vec<f32> = y
        .iter()
        .zip(&dy)
        .map(|(y, d)| if *y > 0.0 { *d } else { 0.0 })
        .collect();
    let (dyv, ddy) = (dev.upload(&y).unwrap(), dev.upload(&dy).unwrap());
    let mut dx = dev.upload(&vec![f32::NAN; n]).unwrap();
    dev.relu_backward(&dyv, &ddy, &mut dx).unwrap();
    assert_eq!(dev.download(&dx).unwrap(), want, "f32");
    let h = |v: &[f32]| v.iter().map(|x| f16::from_f32(*x)).collect::<Vec<f16>>();
    let (dyh, ddyh) = (dev.upload(&h(&y)).unwrap(), dev.upload(&h(&dy)).unwrap());
    let mut dxh = dev.upload(&vec![f16::NAN; n]).unwrap();
    dev.relu_backward(&dyh, &ddyh, &mut dxh).unwrap();
    assert_eq!(dev.download(&dxh).unwrap(), h(&want), "f16");
    let b = |v: &[f32]| v.iter().map(|x| bf16::from_f32(*x)).collect::<Vec<bf16>>();
    let (dyb, ddyb) = (dev.upload(&b(&y)).unwrap(), dev.upload(&b(&dy)).unwrap());
    let mut dxb = dev.upload(&vec![bf16::NAN; n]).unwrap();
    dev.relu_backward(&dyb, &ddyb, &mut dxb).unwrap();
    assert_eq!(dev.download(&dxb).unwrap(), b(&want), "bf16");
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn relu_backward_on_every_backend() {
    relu_backward_passes_gradient_where_the_output_is_positive(&CpuDevice::new());
    relu_backward_passes_gradient_where_the_output_is_positive(&simt(LaneOrder::Forward));
    relu_backward_passes_gradient_where_the_output_is_positive(&simt(LaneOrder::Reverse));
    relu_backward_passes_gradient_where_the_output_is_positive(&gpu());
}
