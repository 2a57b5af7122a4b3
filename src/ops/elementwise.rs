//! Flat operations over whole buffers (`kernels/elementwise.cu`).

use crate::backend::{BackendError, Device, DeviceBuffer, LaunchConfig};
use crate::kernels::elementwise as k;

fn same_len(operation: &'static str, left: usize, right: usize) -> Result<(), BackendError> {
    if left == right {
        Ok(())
    } else {
        Err(BackendError::LengthMismatch {
            operation,
            left,
            right,
        })
    }
}

/// `out[i] = value` for every element.
pub fn fill<D: Device + ?Sized>(
    dev: &D,
    out: &mut D::Buffer<f32>,
    value: f32,
) -> Result<(), BackendError> {
    let n = out.len();
    // SAFETY: the kernel touches out[0..n) and n is out's length.
    unsafe { k::fill_f32(dev, LaunchConfig::flat(n), out, value, n as u64) }
}

/// `x[i] *= alpha`.
pub fn scale<D: Device + ?Sized>(
    dev: &D,
    x: &mut D::Buffer<f32>,
    alpha: f32,
) -> Result<(), BackendError> {
    let n = x.len();
    // SAFETY: the kernel touches x[0..n) and n is x's length.
    unsafe { k::scale_f32(dev, LaunchConfig::flat(n), x, alpha, n as u64) }
}

/// `y[i] += alpha * x[i]` (fused multiply-add).
pub fn axpy<D: Device + ?Sized>(
    dev: &D,
    alpha: f32,
    x: &D::Buffer<f32>,
    y: &mut D::Buffer<f32>,
) -> Result<(), BackendError> {
    same_len("axpy", x.len(), y.len())?;
    let n = y.len();
    // SAFETY: both buffers hold n elements and the kernel touches [0..n) of each.
    unsafe { k::axpy_f32(dev, LaunchConfig::flat(n), x, y, alpha, n as u64) }
}

/// `out[i] = a[i] + b[i]`.
pub fn add<D: Device + ?Sized>(
    dev: &D,
    a: &D::Buffer<f32>,
    b: &D::Buffer<f32>,
    out: &mut D::Buffer<f32>,
) -> Result<(), BackendError> {
    same_len("add", a.len(), b.len())?;
    same_len("add", a.len(), out.len())?;
    let n = out.len();
    // SAFETY: all three buffers hold n elements and the kernel touches [0..n) of each.
    unsafe { k::add_f32(dev, LaunchConfig::flat(n), a, b, out, n as u64) }
}

/// `out[i] = f16(x[i])`, rounding to nearest even.
pub fn cast_to_f16<D: Device + ?Sized>(
    dev: &D,
    x: &D::Buffer<f32>,
    out: &mut D::Buffer<half::f16>,
) -> Result<(), BackendError> {
    same_len("cast_f32_to_f16", x.len(), out.len())?;
    let n = x.len();
    // SAFETY: both buffers hold n elements and the kernel touches [0..n) of each.
    unsafe { k::cast_f32_to_f16(dev, LaunchConfig::flat(n), x, out, n as u64) }
}

/// `out[i] = f32(x[i])` (exact).
pub fn cast_to_f32<D: Device + ?Sized>(
    dev: &D,
    x: &D::Buffer<half::f16>,
    out: &mut D::Buffer<f32>,
) -> Result<(), BackendError> {
    same_len("cast_f16_to_f32", x.len(), out.len())?;
    let n = x.len();
    // SAFETY: both buffers hold n elements and the kernel touches [0..n) of each.
    unsafe { k::cast_f16_to_f32(dev, LaunchConfig::flat(n), x, out, n as u64) }
}
