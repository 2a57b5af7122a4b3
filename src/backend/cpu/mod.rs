//! The native CPU backend: the same operations as the kernels, in Rust, on host memory.
//!
//! It is the production path on machines without a GPU, so it is built for speed: the
//! fully connected layers' GEMMs go to `matrixmultiply` (cache-blocked, SIMD, threaded); the
//! convolutions run over groups of images on nanoddp's own AVX-512 register tiles: the
//! forward and filter-gradient products read the images in place (`window_gemm`, from 64
//! filter taps; im2col + `microkernel` below that), the input gradient is a GEMM then col2im
//! (`microkernel`), with the ReLU, the average pool and the bias gradient fused in where
//! the trainer asks for it (`Backend::conv2d_relu_avg_pool_forward` and friends); loops over
//! images, planes and rows run on all cores with rayon. Arithmetic is
//! f32 with f16 storage for mixed precision, as on the GPU. Every reduction has a fixed
//! order that does not depend on the number of threads, so results are bitwise
//! reproducible across machines.
//!
//! The float64 reference the tests compare against is separate (`tests/common/reference.rs`).

/// Defines a function as `$body` compiled twice, for the baseline instruction set and for
/// AVX-512 (F, VL, BW, DQ), and picks one at run time ([`isa::isa`]). For the plain loops the compiler
/// vectorizes by itself: the crate is built for baseline x86-64, four lanes wide.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) = $body:ident) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq")]
                unsafe fn avx512_version($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if $crate::backend::cpu::isa::isa().avx512 {
                    // SAFETY: the CPU has every feature `avx512_version` is compiled for
                    // (`Isa::avx512` is only set where all four were detected).
                    return unsafe { avx512_version($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

mod conv;
mod gemm;
pub(crate) mod half_convert;
pub mod isa;
mod loss;
mod microkernel;
mod optim;
mod pool;
#[cfg(test)]
mod product_check;
mod summation;
mod window_gemm;

use half::f16;
use rayon::prelude::*;

use super::backend_impl::BackendImpl;
use super::precision::Precision;
use super::shapes::{Conv2dShape, Epilogue, GemmShape, Pool2dShape, SgdStep};
use super::{BackendError, DeviceBuffer, DeviceScalar, Memory};

/// `src` as f32: the slice itself when `T` is f32 (no copy), else widened into `scratch`.
fn widened<'a, T: Precision>(src: &'a [T], scratch: &'a mut [f32]) -> &'a [f32] {
    match T::as_f32(src) {
        Some(s) => s,
        None => {
            let scratch = &mut scratch[..src.len()];
            T::widen_slice(src, scratch);
            scratch
        }
    }
}

/// Runs `f` on an f32 view of `dst`: `dst` itself when `T` is f32, else `scratch`, rounded
/// into `dst` afterwards. Returns the f32 values written.
fn write_f32<'a, T: Precision>(
    dst: &'a mut [T],
    scratch: &'a mut [f32],
    f: impl FnOnce(&mut [f32]),
) -> &'a [f32] {
    if T::as_f32(dst).is_some() {
        let d = T::as_f32_mut(dst).expect("T is f32");
        f(d);
        return d;
    }
    let scratch = &mut scratch[..dst.len()];
    f(scratch);
    T::narrow_slice(scratch, dst);
    scratch
}

/// The host as a device.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuDevice;

impl CpuDevice {
    /// The CPU backend (it uses rayon's global thread pool).
    pub fn new() -> Self {
        CpuDevice
    }
}

/// A buffer in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuBuffer<T>(Vec<T>);

impl<T> CpuBuffer<T> {
    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        &self.0
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: DeviceScalar> DeviceBuffer<T> for CpuBuffer<T> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn device_addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

impl Memory for CpuDevice {
    type Buffer<T: DeviceScalar> = CpuBuffer<T>;

    fn alloc_zeros<T: DeviceScalar>(&self, len: usize) -> Result<CpuBuffer<T>, BackendError> {
        Ok(CpuBuffer(vec![T::zeroed(); len]))
    }

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<CpuBuffer<T>, BackendError> {
        Ok(CpuBuffer(host.to_vec()))
    }

    fn copy_in<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        buf.0.copy_from_slice(host);
        Ok(())
    }

    fn download<T: DeviceScalar>(&self, buf: &CpuBuffer<T>) -> Result<Vec<T>, BackendError> {
        Ok(buf.0.clone())
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// Elements per rayon task for flat loops: big enough that scheduling is noise.
const FLAT_CHUNK: usize = 1 << 14;

fn map_into<A: Sync, B: Send>(src: &[A], dst: &mut [B], f: impl Fn(&A) -> B + Sync) {
    dst.par_chunks_mut(FLAT_CHUNK)
        .zip(src.par_chunks(FLAT_CHUNK))
        .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d = f(s)));
}

impl BackendImpl for CpuDevice {
    unsafe fn fill(&self, out: &mut CpuBuffer<f32>, value: f32) -> Result<(), BackendError> {
        out.0.par_chunks_mut(FLAT_CHUNK).for_each(|c| c.fill(value));
        Ok(())
    }

    unsafe fn scale(&self, x: &mut CpuBuffer<f32>, alpha: f32) -> Result<(), BackendError> {
        x.0.par_chunks_mut(FLAT_CHUNK)
            .for_each(|c| c.iter_mut().for_each(|v| *v *= alpha));
        Ok(())
    }

    unsafe fn axpy(
        &self,
        alpha: f32,
        x: &CpuBuffer<f32>,
        y: &mut CpuBuffer<f32>,
    ) -> Result<(), BackendError> {
        y.0.par_chunks_mut(FLAT_CHUNK)
            .zip(x.0.par_chunks(FLAT_CHUNK))
            .for_each(|(y, x)| {
                y.iter_mut()
                    .zip(x)
                    .for_each(|(y, x)| *y = alpha.mul_add(*x, *y))
            });
        Ok(())
    }

    unsafe fn add(
        &self,
        a: &CpuBuffer<f32>,
        b: &CpuBuffer<f32>,
        out: &mut CpuBuffer<f32>,
    ) -> Result<(), BackendError> {
        out.0
            .par_chunks_mut(FLAT_CHUNK)
            .zip(a.0.par_chunks(FLAT_CHUNK).zip(b.0.par_chunks(FLAT_CHUNK)))
            .for_each(|(o, (a, b))| {
                o.iter_mut()
                    .zip(a.iter().zip(b))
                    .for_each(|(o, (a, b))| *o = a + b)
            });
        Ok(())
    }

    unsafe fn cast_to_f16(
        &self,
        x: &CpuBuffer<f32>,
        out: &mut CpuBuffer<f16>,
    ) -> Result<(), BackendError> {
        map_into(&x.0, &mut out.0, |v| f16::from_f32(*v));
        Ok(())
    }

    unsafe fn cast_to_f32(
        &self,
        x: &CpuBuffer<f16>,
        out: &mut CpuBuffer<f32>,
    ) -> Result<(), BackendError> {
        map_into(&x.0, &mut out.0, |v| v.to_f32());
        Ok(())
    }

    unsafe fn relu_backward<T: Precision>(
        &self,
        y: &CpuBuffer<T>,
        dy: &CpuBuffer<T>,
        dx: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        dx.0.par_chunks_mut(FLAT_CHUNK)
            .zip(y.0.par_chunks(FLAT_CHUNK).zip(dy.0.par_chunks(FLAT_CHUNK)))
            .for_each(|(dx, (y, dy))| {
                // Widen y a block at a time (one F16C pass instead of a call per element).
                let mut wide = [0.0f32; 1024];
                for ((dx, y), dy) in dx.chunks_mut(1024).zip(y.chunks(1024)).zip(dy.chunks(1024)) {
                    let wide = &mut wide[..y.len()];
                    T::widen_slice(y, wide);
                    for ((dx, y), dy) in dx.iter_mut().zip(wide.iter()).zip(dy) {
                        *dx = if *y > 0.0 { *dy } else { T::from_f32(0.0) };
                    }
                }
            });
        Ok(())
    }

    unsafe fn gemm<A: Precision, O: Precision>(
        &self,
        shape: &GemmShape,
        a: &CpuBuffer<A>,
        b: &CpuBuffer<A>,
        bias: Option<&CpuBuffer<f32>>,
        c: &mut CpuBuffer<O>,
        epilogue: Epilogue,
    ) -> Result<(), BackendError> {
        // Half operands are widened once (F16C), then the f32 product runs on them.
        let scratch = |n| {
            if A::DTYPE.is_half() {
                vec![0.0f32; n]
            } else {
                Vec::new()
            }
        };
        let (mut wide_a, mut wide_b) = (scratch(a.len()), scratch(b.len()));
        let (a32, b32) = (widened(&a.0, &mut wide_a), widened(&b.0, &mut wide_b));
        let bias = bias.map(|b| b.as_slice());
        match O::as_f32_mut(&mut c.0) {
            Some(c32) => gemm::gemm_f32(shape, a32, b32, bias, c32, epilogue),
            None => {
                // C is read when beta != 0: widened, computed on, rounded back.
                let mut c32 = vec![0.0f32; c.0.len()];
                O::widen_slice(&c.0, &mut c32);
                gemm::gemm_f32(shape, a32, b32, bias, &mut c32, epilogue);
                O::narrow_slice(&c32, &mut c.0);
            }
        }
        Ok(())
    }

    unsafe fn conv2d_forward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &CpuBuffer<T>,
        w: &CpuBuffer<T>,
        bias: Option<&CpuBuffer<f32>>,
        y: &mut CpuBuffer<T>,
        relu: bool,
    ) -> Result<(), BackendError> {
        conv::forward(
            shape,
            &x.0,
            &w.0,
            bias.map(|b| b.as_slice()),
            &mut y.0,
            relu,
            None,
        );
        Ok(())
    }

    unsafe fn conv2d_relu_avg_pool_forward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &CpuBuffer<T>,
        w: &CpuBuffer<T>,
        bias: Option<&CpuBuffer<f32>>,
        y: &mut CpuBuffer<T>,
        pooled: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        conv::forward(
            conv,
            &x.0,
            &w.0,
            bias.map(|b| b.as_slice()),
            &mut y.0,
            true,
            Some((pool, &mut pooled.0)),
        );
        Ok(())
    }

    unsafe fn avg_pool_relu_backward<T: Precision>(
        &self,
        pool: &Pool2dShape,
        d_pooled: &CpuBuffer<T>,
        y: &CpuBuffer<T>,
        dx: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        pool::avg_relu_backward(pool, &d_pooled.0, &y.0, &mut dx.0);
        Ok(())
    }

    unsafe fn conv2d_backward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &CpuBuffer<T>,
        w: &CpuBuffer<T>,
        dy: &CpuBuffer<T>,
        dw: &mut CpuBuffer<f32>,
        db: &mut CpuBuffer<f32>,
        dx: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        conv::backward_filter(
            shape,
            &x.0,
            conv::OutputGrad::Tensor(&dy.0),
            &mut dw.0,
            Some(&mut db.0),
            Some((&w.0, &mut dx.0)),
        );
        Ok(())
    }

    unsafe fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &CpuBuffer<T>,
        y: &CpuBuffer<T>,
        d_pooled: &CpuBuffer<T>,
        dw: &mut CpuBuffer<f32>,
        db: &mut CpuBuffer<f32>,
    ) -> Result<(), BackendError> {
        let dy = conv::OutputGrad::Pooled {
            pool,
            d_pooled: &d_pooled.0,
            y: &y.0,
        };
        conv::backward_filter(conv, &x.0, dy, &mut dw.0, Some(&mut db.0), None);
        Ok(())
    }

    unsafe fn conv2d_backward_filter_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &CpuBuffer<T>,
        dy: &CpuBuffer<T>,
        dw: &mut CpuBuffer<f32>,
        db: &mut CpuBuffer<f32>,
    ) -> Result<(), BackendError> {
        conv::backward_filter(
            shape,
            &x.0,
            conv::OutputGrad::Tensor(&dy.0),
            &mut dw.0,
            Some(&mut db.0),
            None,
        );
        Ok(())
    }

    unsafe fn conv2d_backward_input<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &CpuBuffer<T>,
        w: &CpuBuffer<T>,
        dx: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        conv::backward_input(shape, &dy.0, &w.0, &mut dx.0);
        Ok(())
    }

    unsafe fn conv2d_backward_filter<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &CpuBuffer<T>,
        dy: &CpuBuffer<T>,
        dw: &mut CpuBuffer<f32>,
    ) -> Result<(), BackendError> {
        conv::backward_filter(
            shape,
            &x.0,
            conv::OutputGrad::Tensor(&dy.0),
            &mut dw.0,
            None,
            None,
        );
        Ok(())
    }

    unsafe fn conv2d_backward_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &CpuBuffer<T>,
        db: &mut CpuBuffer<f32>,
    ) -> Result<(), BackendError> {
        conv::backward_bias(shape, &dy.0, &mut db.0);
        Ok(())
    }

    unsafe fn max_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &CpuBuffer<T>,
        y: &mut CpuBuffer<T>,
        argmax: &mut CpuBuffer<i32>,
    ) -> Result<(), BackendError> {
        pool::max_forward(shape, &x.0, &mut y.0, &mut argmax.0);
        Ok(())
    }

    unsafe fn max_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &CpuBuffer<T>,
        argmax: &CpuBuffer<i32>,
        dx: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        pool::max_backward(shape, &dy.0, &argmax.0, &mut dx.0);
        Ok(())
    }

    unsafe fn avg_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &CpuBuffer<T>,
        y: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        pool::avg_forward(shape, &x.0, &mut y.0);
        Ok(())
    }

    unsafe fn avg_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &CpuBuffer<T>,
        dx: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        pool::avg_backward(shape, &dy.0, &mut dx.0);
        Ok(())
    }

    unsafe fn softmax_cross_entropy<T: Precision>(
        &self,
        _rows: usize, // the labels' length, validated
        classes: usize,
        logits: &CpuBuffer<T>,
        labels: &CpuBuffer<u8>,
        loss: &mut CpuBuffer<f32>,
        grad: Option<&mut CpuBuffer<T>>,
        correct: &mut CpuBuffer<i32>,
        grad_scale: f32,
    ) -> Result<(), BackendError> {
        let right = loss::softmax_cross_entropy(
            classes,
            &logits.0,
            &labels.0,
            &mut loss.0,
            grad.map(|g| g.as_mut_slice()),
            grad_scale,
        );
        correct.0[0] += right;
        Ok(())
    }

    unsafe fn grad_check<G: Precision>(
        &self,
        grad: &CpuBuffer<G>,
        found: &mut CpuBuffer<i32>,
    ) -> Result<(), BackendError> {
        if optim::any_nonfinite(&grad.0) {
            found.0[0] = 1;
        }
        Ok(())
    }

    unsafe fn sgd_step<G: Precision>(
        &self,
        w: &mut CpuBuffer<f32>,
        grad: &CpuBuffer<G>,
        velocity: Option<&mut CpuBuffer<f32>>,
        w_half: Option<&mut CpuBuffer<f16>>,
        step: SgdStep,
        found: Option<&CpuBuffer<i32>>,
    ) -> Result<(), BackendError> {
        if let Some(f) = found {
            if f.0[0] != 0 {
                return Ok(());
            }
        }
        optim::sgd_step(
            &mut w.0,
            &grad.0,
            velocity.map(|v| v.as_mut_slice()),
            w_half.map(|h| h.as_mut_slice()),
            step,
        );
        Ok(())
    }
}
