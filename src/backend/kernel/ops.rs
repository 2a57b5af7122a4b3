//! [`BackendImpl`] for every kernel [`KernelDevice`] (CUDA and the SIMT emulator): choose the
//! launch shape, launch the kernel from `kernels/*.cu`. The fused operations are the
//! trait's defaults, built from these launches.
//!
//! Every `unsafe` launch below is sound for the same reason: [`Backend`](crate::backend::Backend)
//! validated the shape and checked every buffer's length against it before calling here,
//! and the kernel's index ranges are exactly that shape.

use half::f16;

use super::{KernelArg, KernelDevice, LaunchConfig};
use crate::backend::{
    gemm_kernel, BackendError, BackendImpl, Conv2dShape, DeviceBuffer, DeviceScalar, Epilogue,
    GemmShape, Memory, Pool2dShape, Precision, PrecisionOp, SgdStep,
};
use crate::kernels::elementwise as ew;

type Buf<D, T> = <D as Memory>::Buffer<T>;

fn i32_arg(v: usize) -> KernelArg {
    // Shapes are validated to fit i32 before any launch.
    KernelArg::I32(v as i32)
}

fn blocks(n: usize, per_block: usize) -> u32 {
    n.div_ceil(per_block).max(1) as u32
}

fn gemm_args<D: KernelDevice, A: DeviceScalar, C: DeviceScalar>(
    shape: &GemmShape,
    a: &Buf<D, A>,
    b: &Buf<D, A>,
    bias: Option<&Buf<D, f32>>,
    c: &mut Buf<D, C>,
    epilogue: Epilogue,
) -> Vec<KernelArg> {
    let (lda, ldb, ldc) = shape.leading_dims();
    vec![
        KernelArg::buffer(a),
        KernelArg::buffer(b),
        KernelArg::buffer_mut(c),
        KernelArg::optional(bias),
        i32_arg(shape.m),
        i32_arg(shape.n),
        i32_arg(shape.k),
        i32_arg(lda),
        i32_arg(ldb),
        i32_arg(ldc),
        KernelArg::I32(shape.trans_a.into()),
        KernelArg::I32(shape.trans_b.into()),
        KernelArg::F32(epilogue.alpha),
        KernelArg::F32(epilogue.beta),
        KernelArg::I32(epilogue.relu.into()),
    ]
}

fn conv_dims(s: &Conv2dShape) -> [KernelArg; 10] {
    [
        i32_arg(s.in_h),
        i32_arg(s.in_w),
        i32_arg(s.out_c),
        i32_arg(s.k_h),
        i32_arg(s.k_w),
        i32_arg(s.stride),
        i32_arg(s.pad),
        i32_arg(s.out_h()),
        i32_arg(s.out_w()),
        KernelArg::I32(0),
    ]
}

fn pool_dims(s: &Pool2dShape) -> [KernelArg; 8] {
    [
        i32_arg(s.planes),
        i32_arg(s.in_h),
        i32_arg(s.in_w),
        i32_arg(s.k_h),
        i32_arg(s.k_w),
        i32_arg(s.stride),
        i32_arg(s.out_h()),
        i32_arg(s.out_w()),
    ]
}

impl<D: KernelDevice> BackendImpl for D {
    unsafe fn fill(&self, out: &mut Buf<D, f32>, value: f32) -> Result<(), BackendError> {
        let n = out.len();
        // SAFETY: see the module docs.
        unsafe { ew::fill_f32(self, LaunchConfig::flat(n), out, value, n as u64) }
    }

    unsafe fn scale(&self, x: &mut Buf<D, f32>, alpha: f32) -> Result<(), BackendError> {
        let n = x.len();
        // SAFETY: see the module docs.
        unsafe { ew::scale_f32(self, LaunchConfig::flat(n), x, alpha, n as u64) }
    }

    unsafe fn axpy(
        &self,
        alpha: f32,
        x: &Buf<D, f32>,
        y: &mut Buf<D, f32>,
    ) -> Result<(), BackendError> {
        let n = y.len();
        // SAFETY: see the module docs.
        unsafe { ew::axpy_f32(self, LaunchConfig::flat(n), x, y, alpha, n as u64) }
    }

    unsafe fn add(
        &self,
        a: &Buf<D, f32>,
        b: &Buf<D, f32>,
        out: &mut Buf<D, f32>,
    ) -> Result<(), BackendError> {
        let n = out.len();
        // SAFETY: see the module docs.
        unsafe { ew::add_f32(self, LaunchConfig::flat(n), a, b, out, n as u64) }
    }

    unsafe fn cast_to_f16(
        &self,
        x: &Buf<D, f32>,
        out: &mut Buf<D, f16>,
    ) -> Result<(), BackendError> {
        let n = x.len();
        // SAFETY: see the module docs.
        unsafe { ew::cast_f32_to_f16(self, LaunchConfig::flat(n), x, out, n as u64) }
    }

    unsafe fn cast_to_f32(
        &self,
        x: &Buf<D, f16>,
        out: &mut Buf<D, f32>,
    ) -> Result<(), BackendError> {
        let n = x.len();
        // SAFETY: see the module docs.
        unsafe { ew::cast_f16_to_f32(self, LaunchConfig::flat(n), x, out, n as u64) }
    }

    unsafe fn relu_backward<T: Precision>(
        &self,
        y: &Buf<D, T>,
        dy: &Buf<D, T>,
        dx: &mut Buf<D, T>,
    ) -> Result<(), BackendError> {
        let n = y.len();
        let args = [
            KernelArg::buffer(y),
            KernelArg::buffer(dy),
            KernelArg::buffer_mut(dx),
            KernelArg::U64(n as u64),
        ];
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::ReluBackward.kernel(T::DTYPE),
                LaunchConfig::flat(n),
                &args,
            )
        }
    }

    unsafe fn gemm<A: Precision, O: Precision>(
        &self,
        shape: &GemmShape,
        a: &Buf<D, A>,
        b: &Buf<D, A>,
        bias: Option<&Buf<D, f32>>,
        c: &mut Buf<D, O>,
        epilogue: Epilogue,
    ) -> Result<(), BackendError> {
        let kernel = gemm_kernel(A::DTYPE, O::DTYPE)?;
        let args = gemm_args::<D, A, O>(shape, a, b, bias, c, epilogue);
        // 64x64 tiles of C: 256 threads on CUDA cores, 4 warps of wmma fragments for half.
        let threads = if A::DTYPE.is_half() { 128 } else { 256 };
        let cfg = LaunchConfig {
            grid: (blocks(shape.n, 64), blocks(shape.m, 64), 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe { self.launch(kernel, cfg, &args) }
    }

    unsafe fn conv2d_forward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<D, T>,
        w: &Buf<D, T>,
        bias: Option<&Buf<D, f32>>,
        y: &mut Buf<D, T>,
        relu: bool,
    ) -> Result<(), BackendError> {
        let mut args = vec![
            KernelArg::buffer(x),
            KernelArg::buffer(w),
            KernelArg::optional(bias),
            KernelArg::buffer_mut(y),
        ];
        args.push(i32_arg(shape.in_c));
        let mut dims = conv_dims(shape);
        dims[9] = KernelArg::I32(relu.into());
        args.extend(dims);
        let pixels = shape.out_h() * shape.out_w();
        let cfg = LaunchConfig {
            grid: (blocks(pixels, 256), shape.out_c as u32, shape.batch as u32),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe { self.launch(PrecisionOp::Conv2dForward.kernel(T::DTYPE), cfg, &args) }
    }

    unsafe fn conv2d_backward_input<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<D, T>,
        w: &Buf<D, T>,
        dx: &mut Buf<D, T>,
    ) -> Result<(), BackendError> {
        let mut args = vec![
            KernelArg::buffer(dy),
            KernelArg::buffer(w),
            KernelArg::buffer_mut(dx),
            i32_arg(shape.in_c),
        ];
        args.extend(&conv_dims(shape)[..9]);
        let cfg = LaunchConfig {
            grid: (
                blocks(shape.in_h * shape.in_w, 256),
                shape.in_c as u32,
                shape.batch as u32,
            ),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::Conv2dBackwardInput.kernel(T::DTYPE),
                cfg,
                &args,
            )
        }
    }

    unsafe fn conv2d_backward_filter<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<D, T>,
        dy: &Buf<D, T>,
        dw: &mut Buf<D, f32>,
    ) -> Result<(), BackendError> {
        let ws = shape.sizes().1;
        let mut args = vec![
            KernelArg::buffer(x),
            KernelArg::buffer(dy),
            KernelArg::buffer_mut(dw),
            i32_arg(shape.batch),
            i32_arg(shape.in_c),
        ];
        args.extend(&conv_dims(shape)[..9]);
        let cfg = LaunchConfig {
            grid: (ws as u32, 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::Conv2dBackwardFilter.kernel(T::DTYPE),
                cfg,
                &args,
            )
        }
    }

    unsafe fn conv2d_backward_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<D, T>,
        db: &mut Buf<D, f32>,
    ) -> Result<(), BackendError> {
        let args = [
            KernelArg::buffer(dy),
            KernelArg::buffer_mut(db),
            i32_arg(shape.batch),
            i32_arg(shape.out_c),
            i32_arg(shape.out_h() * shape.out_w()),
        ];
        let cfg = LaunchConfig {
            grid: (shape.out_c as u32, 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe { self.launch(PrecisionOp::Conv2dBackwardBias.kernel(T::DTYPE), cfg, &args) }
    }

    unsafe fn max_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<D, T>,
        y: &mut Buf<D, T>,
        argmax: &mut Buf<D, i32>,
    ) -> Result<(), BackendError> {
        let ys = shape.sizes().1;
        let mut args = vec![
            KernelArg::buffer(x),
            KernelArg::buffer_mut(y),
            KernelArg::buffer_mut(argmax),
        ];
        args.extend(pool_dims(shape));
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::MaxPoolForward.kernel(T::DTYPE),
                LaunchConfig::flat(ys),
                &args,
            )
        }
    }

    unsafe fn max_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<D, T>,
        argmax: &Buf<D, i32>,
        dx: &mut Buf<D, T>,
    ) -> Result<(), BackendError> {
        let xs = shape.sizes().0;
        let mut args = vec![
            KernelArg::buffer(dy),
            KernelArg::buffer(argmax),
            KernelArg::buffer_mut(dx),
        ];
        args.extend(pool_dims(shape));
        // SAFETY: see the module docs. (argmax values come from max_pool_forward of this shape.)
        unsafe {
            self.launch(
                PrecisionOp::MaxPoolBackward.kernel(T::DTYPE),
                LaunchConfig::flat(xs),
                &args,
            )
        }
    }

    unsafe fn avg_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<D, T>,
        y: &mut Buf<D, T>,
    ) -> Result<(), BackendError> {
        let ys = shape.sizes().1;
        let mut args = vec![KernelArg::buffer(x), KernelArg::buffer_mut(y)];
        args.extend(pool_dims(shape));
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::AvgPoolForward.kernel(T::DTYPE),
                LaunchConfig::flat(ys),
                &args,
            )
        }
    }

    unsafe fn avg_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<D, T>,
        dx: &mut Buf<D, T>,
    ) -> Result<(), BackendError> {
        let xs = shape.sizes().0;
        let mut args = vec![KernelArg::buffer(dy), KernelArg::buffer_mut(dx)];
        args.extend(pool_dims(shape));
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::AvgPoolBackward.kernel(T::DTYPE),
                LaunchConfig::flat(xs),
                &args,
            )
        }
    }

    unsafe fn softmax_cross_entropy<T: Precision>(
        &self,
        rows: usize,
        classes: usize,
        logits: &Buf<D, T>,
        labels: &Buf<D, u8>,
        loss: &mut Buf<D, f32>,
        grad: Option<&mut Buf<D, T>>,
        correct: &mut Buf<D, i32>,
        grad_scale: f32,
    ) -> Result<(), BackendError> {
        let args = [
            KernelArg::buffer(logits),
            KernelArg::buffer(labels),
            KernelArg::buffer_mut(loss),
            KernelArg::optional_mut(grad),
            KernelArg::buffer_mut(correct),
            i32_arg(rows),
            i32_arg(classes),
            KernelArg::F32(grad_scale),
        ];
        let cfg = LaunchConfig {
            grid: (blocks(rows, 8), 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::SoftmaxCrossEntropy.kernel(T::DTYPE),
                cfg,
                &args,
            )
        }
    }

    unsafe fn grad_check<G: Precision>(
        &self,
        grad: &Buf<D, G>,
        found: &mut Buf<D, i32>,
    ) -> Result<(), BackendError> {
        let n = grad.len();
        let args = [
            KernelArg::buffer(grad),
            KernelArg::U64(n as u64),
            KernelArg::buffer_mut(found),
        ];
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::GradCheck.kernel(G::DTYPE),
                LaunchConfig::flat(n),
                &args,
            )
        }
    }

    unsafe fn sgd_step<G: Precision>(
        &self,
        w: &mut Buf<D, f32>,
        grad: &Buf<D, G>,
        velocity: Option<&mut Buf<D, f32>>,
        w_half: Option<&mut Buf<D, f16>>,
        step: SgdStep,
        found: Option<&Buf<D, i32>>,
    ) -> Result<(), BackendError> {
        let n = w.len();
        let args = [
            KernelArg::buffer_mut(w),
            KernelArg::buffer(grad),
            KernelArg::optional_mut(velocity),
            KernelArg::optional_mut(w_half),
            KernelArg::U64(n as u64),
            KernelArg::F32(step.lr),
            KernelArg::F32(step.inv_scale),
            KernelArg::F32(step.momentum),
            KernelArg::F32(step.weight_decay),
            KernelArg::optional(found),
        ];
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::SgdStep.kernel(G::DTYPE),
                LaunchConfig::flat(n),
                &args,
            )
        }
    }
}
