//! The CUDA backend: on a machine without a driver every entry point returns a typed error
//! (cudarc itself would panic); with a GPU, the elementwise kernels match a float64
//! reference on odd sizes with poisoned outputs.

use nanoddp::backend::cuda::{self, CudaDevice};
use nanoddp::backend::{BackendError, DeviceBuffer};
use nanoddp::ops::elementwise;
use rand::{Rng, SeedableRng};

#[test]
fn without_a_driver_every_entry_point_errors_instead_of_panicking() {
    if cuda::driver_present() {
        eprintln!("skipped: a CUDA driver is present");
        return;
    }
    assert!(matches!(
        cuda::device_count(),
        Err(BackendError::NoCudaDriver)
    ));
    assert!(matches!(
        cuda::driver_version(),
        Err(BackendError::NoCudaDriver)
    ));
    assert!(matches!(
        CudaDevice::new(0),
        Err(BackendError::NoCudaDriver)
    ));
    assert!(matches!(
        CudaDevice::all_infos(),
        Err(BackendError::NoCudaDriver)
    ));
    let message = BackendError::NoCudaDriver.to_string();
    assert!(
        message.contains("libcuda.so") && message.contains("CPU"),
        "{message}"
    );
}

fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(dev) => Some(dev),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

const SIZES: [usize; 7] = [1, 2, 31, 257, 1021, 65_537, 1 << 20];
const POISON: f32 = f32::NAN;

fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-4.0f32..4.0)).collect()
}

/// `|got - want| <= atol + rtol·|want|`; false for NaN, so poison never passes.
fn within(got: f64, want: f64, atol: f64, rtol: f64) -> bool {
    (got - want).abs() <= atol + rtol * want.abs()
}

fn assert_close(got: &[f32], want: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len());
    let bad: Vec<_> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !within(**g as f64, **w, atol, rtol))
        .take(5)
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: first mismatches (index, (got, want)): {bad:?}"
    );
}

#[test]
fn elementwise_kernels_match_a_float64_reference_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for n in SIZES {
        let x = random(&mut rng, n);
        let y = random(&mut rng, n);
        let dx = dev.upload(&x).unwrap();
        let dy = dev.upload(&y).unwrap();

        let mut out = dev.upload(&vec![POISON; n]).unwrap();
        elementwise::fill(&dev, &mut out, 1.5).unwrap();
        assert_close(
            &dev.download(&out).unwrap(),
            &vec![1.5; n],
            0.0,
            0.0,
            "fill",
        );

        elementwise::add(&dev, &dx, &dy, &mut out).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(a, b)| *a as f64 + *b as f64)
            .collect();
        assert_close(
            &dev.download(&out).unwrap(),
            &want,
            0.0,
            f32::EPSILON as f64,
            "add",
        );

        let mut acc = dev.upload(&y).unwrap();
        elementwise::axpy(&dev, 0.75, &dx, &mut acc).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(a, b)| 0.75 * *a as f64 + *b as f64)
            .collect();
        assert_close(
            &dev.download(&acc).unwrap(),
            &want,
            1e-6,
            f32::EPSILON as f64,
            "axpy",
        );

        elementwise::scale(&dev, &mut acc, -2.0).unwrap();
        let want: Vec<f64> = want.iter().map(|v| -2.0 * v).collect();
        assert_close(
            &dev.download(&acc).unwrap(),
            &want,
            2e-6,
            2.0 * f32::EPSILON as f64,
            "scale",
        );

        let mut h = dev.upload(&vec![half::f16::NAN; n]).unwrap();
        elementwise::cast_to_f16(&dev, &dx, &mut h).unwrap();
        let got = dev.download(&h).unwrap();
        assert!(
            got.iter()
                .zip(&x)
                .all(|(g, v)| g.to_bits() == half::f16::from_f32(*v).to_bits()),
            "cast to f16"
        );
        let mut back = dev.upload(&vec![POISON; n]).unwrap();
        elementwise::cast_to_f32(&dev, &h, &mut back).unwrap();
        let want: Vec<f64> = got.iter().map(|v| v.to_f64()).collect();
        assert_close(
            &dev.download(&back).unwrap(),
            &want,
            0.0,
            0.0,
            "cast to f32",
        );
        assert_eq!(out.len(), n);
    }
    let short = dev.upload(&[1.0f32; 3]).unwrap();
    let mut long = dev.upload(&[1.0f32; 4]).unwrap();
    assert!(matches!(
        elementwise::axpy(&dev, 1.0, &short, &mut long),
        Err(BackendError::LengthMismatch { .. })
    ));
}
