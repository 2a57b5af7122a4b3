//! Shared test support: random inputs, tolerances, the per-backend instantiation macro, and
//! the float64 reference (`reference.rs`).

#![allow(dead_code, unused_macros, unused_imports)]

pub mod reference;

use half::f16;
use nanoddp::backend::Precision;
use rand::{Rng, SeedableRng};

pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Uniform values in [-1, 1) rounded to the storage precision `T`.
pub fn random<T: Precision>(r: &mut impl Rng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| T::from_f32(r.gen_range(-1.0f32..1.0)))
        .collect()
}

pub fn wide<T: Precision>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

/// `|got - want| <= atol + rtol·mag`, with `mag` the reference's magnitude (`Σ|terms|`, or
/// `|want|` for a single term). NaN never passes, so poisoned outputs are caught.
#[derive(Debug, Clone, Copy)]
pub struct Tol {
    pub atol: f64,
    pub rtol: f64,
}

/// fp32 arithmetic: a few ulps of the sum's magnitude.
pub const F32: Tol = Tol {
    atol: 1e-6,
    rtol: 2e-6,
};
/// Long fp32 reductions (K up to ~10^4 terms).
pub const F32_LONG: Tol = Tol {
    atol: 1e-5,
    rtol: 2e-5,
};
/// Half storage of the result (one rounding to 11 bits) after f32 accumulation.
pub const F16: Tol = Tol {
    atol: 1e-4,
    rtol: 1.5e-3,
};

pub fn assert_close<T: Precision>(what: &str, got: &[T], want: &[f64], mag: &[f64], tol: Tol) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut bad = Vec::new();
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32() as f64;
        let err = (g - w).abs();
        let bound = tol.atol + tol.rtol * mag[i].max(w.abs());
        if err.is_nan() || err > bound {
            bad.push((i, g, *w, bound));
        }
        if err.is_nan() || err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} of {} elements outside atol {} + rtol {}·|mag|; max error {:e} at {}; first (index, got, want, bound): {:?}",
        bad.len(),
        got.len(),
        tol.atol,
        tol.rtol,
        worst.0,
        worst.1,
        &bad[..bad.len().min(5)]
    );
}

/// Bytes of a result, for the lane-order comparison on the SIMT backend.
pub fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

pub fn half_bits(v: &[f16]) -> Vec<u8> {
    bytes(v)
}

/// Instantiates a test body `fn body<B: Backend>(dev: &B) -> Vec<u8>` (returning the bytes
/// of everything it computed) once per backend: the native CPU backend; the SIMT emulator
/// under forward and reverse lane order, which must also agree bit for bit; and the GPU
/// when there is one (skipped with the reason otherwise).
macro_rules! per_backend {
    ($($body:ident),* $(,)?) => {
        $(
            mod $body {
                #[test]
                fn cpu() {
                    super::$body(&nanoddp::backend::cpu::CpuDevice::new());
                }

                #[test]
                fn simt_forward_and_reverse_lane_order() {
                    use nanoddp::backend::simt::{same_under_lane_orders, LaneOrder};
                    same_under_lane_orders(&[LaneOrder::Forward, LaneOrder::Reverse], |dev| Ok(super::$body(dev)))
                        .unwrap_or_else(|e| panic!("{e}"));
                }

                #[test]
                fn cuda() {
                    match nanoddp::backend::cuda::CudaDevice::new(0) {
                        Ok(dev) => {
                            super::$body(&dev);
                        }
                        Err(e) => eprintln!("skipped: {e}"),
                    }
                }
            }
        )*
    };
}
pub(crate) use per_backend;
