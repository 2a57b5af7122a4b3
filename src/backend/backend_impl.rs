//! [`BackendImpl`]: what a backend provides so that it is a [`Backend`](super::Backend).
//!
//! Each method does what the [`Backend`](super::Backend) method of the same name documents,
//! and is called only after that method has checked the shapes and buffer lengths: an
//! implementation may index by the shape without checking again. The fused operations have
//! defaults built from the plain ones (what the kernel devices use); a backend overrides
//! them where fusing pays (the CPU backend does for all five). Workspace a default needs is
//! allocated here, from the backend itself, not passed in by every caller.

use half::f16;

use super::precision::Precision;
use super::shapes::{Conv2dShape, Epilogue, GemmShape, Pool2dShape, SgdStep};
use super::{BackendError, DeviceBuffer, Memory};

type Buf<B, T> = <B as Memory>::Buffer<T>;

/// A backend's own implementation of the operations: each method may assume the checks of
/// its [`Backend`](super::Backend) namesake.
/// Implemented by [`CpuDevice`](super::cpu::CpuDevice) and by every kernel
/// [`KernelDevice`](super::KernelDevice).
///
/// # Safety
///
/// Every method may assume what the [`Backend`](super::Backend) method of the same name
/// checks: a valid shape, and buffers of exactly the lengths it implies. A kernel device
/// launches with those lengths as the kernel's bounds, so a caller that broke this would
/// have the GPU read and write out of bounds: call them through [`Backend`](super::Backend).
#[allow(missing_docs, clippy::missing_safety_doc)] // each is documented on `Backend`
pub trait BackendImpl: Memory {
    unsafe fn fill(&self, out: &mut Buf<Self, f32>, value: f32) -> Result<(), BackendError>;
    unsafe fn scale(&self, x: &mut Buf<Self, f32>, alpha: f32) -> Result<(), BackendError>;
    unsafe fn axpy(
        &self,
        alpha: f32,
        x: &Buf<Self, f32>,
        y: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    unsafe fn add(
        &self,
        a: &Buf<Self, f32>,
        b: &Buf<Self, f32>,
        out: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    unsafe fn cast_to_f16(
        &self,
        x: &Buf<Self, f32>,
        out: &mut Buf<Self, f16>,
    ) -> Result<(), BackendError>;
    unsafe fn cast_to_f32(
        &self,
        x: &Buf<Self, f16>,
        out: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    unsafe fn relu_backward<T: Precision>(
        &self,
        y: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    unsafe fn gemm<A: Precision, O: Precision>(
        &self,
        shape: &GemmShape,
        a: &Buf<Self, A>,
        b: &Buf<Self, A>,
        bias: Option<&Buf<Self, f32>>,
        c: &mut Buf<Self, O>,
        epilogue: Epilogue,
    ) -> Result<(), BackendError>;
    unsafe fn conv2d_forward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<Self, T>,
        w: &Buf<Self, T>,
        bias: Option<&Buf<Self, f32>>,
        y: &mut Buf<Self, T>,
        relu: bool,
    ) -> Result<(), BackendError>;
    unsafe fn conv2d_backward_input<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<Self, T>,
        w: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    unsafe fn conv2d_backward_filter<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    unsafe fn conv2d_backward_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<Self, T>,
        db: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    unsafe fn max_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<Self, T>,
        y: &mut Buf<Self, T>,
        argmax: &mut Buf<Self, i32>,
    ) -> Result<(), BackendError>;
    unsafe fn max_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<Self, T>,
        argmax: &Buf<Self, i32>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    unsafe fn avg_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<Self, T>,
        y: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    unsafe fn avg_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    #[allow(clippy::too_many_arguments)]
    unsafe fn softmax_cross_entropy<T: Precision>(
        &self,
        rows: usize,
        classes: usize,
        logits: &Buf<Self, T>,
        labels: &Buf<Self, u8>,
        loss: &mut Buf<Self, f32>,
        grad: Option<&mut Buf<Self, T>>,
        correct: &mut Buf<Self, i32>,
        grad_scale: f32,
    ) -> Result<(), BackendError>;
    unsafe fn grad_check<G: Precision>(
        &self,
        grad: &Buf<Self, G>,
        found: &mut Buf<Self, i32>,
    ) -> Result<(), BackendError>;
    unsafe fn sgd_step<G: Precision>(
        &self,
        w: &mut Buf<Self, f32>,
        grad: &Buf<Self, G>,
        velocity: Option<&mut Buf<Self, f32>>,
        w_half: Option<&mut Buf<Self, f16>>,
        step: SgdStep,
        found: Option<&Buf<Self, i32>>,
    ) -> Result<(), BackendError>;

    /// Default: the convolution with its ReLU, then the pool reading `y` back.
    #[allow(clippy::too_many_arguments)]
    unsafe fn conv2d_relu_avg_pool_forward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<Self, T>,
        w: &Buf<Self, T>,
        bias: Option<&Buf<Self, f32>>,
        y: &mut Buf<Self, T>,
        pooled: &mut Buf<Self, T>,
    ) -> Result<(), BackendError> {
        // SAFETY (here and in the defaults below): each part is called with buffers whose
        // lengths the fused operation's checks fixed, workspace allocated to those lengths.
        self.conv2d_forward(conv, x, w, bias, y, true)?;
        self.avg_pool_forward(pool, y, pooled)
    }
    /// Default: the pool's backward into a workspace the size of `y`, then the ReLU's.
    unsafe fn avg_pool_relu_backward<T: Precision>(
        &self,
        pool: &Pool2dShape,
        d_pooled: &Buf<Self, T>,
        y: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError> {
        let mut unmasked = self.alloc_zeros::<T>(y.len())?;
        self.avg_pool_backward(pool, d_pooled, &mut unmasked)?;
        self.relu_backward(y, &unmasked, dx)
    }
    /// Default: the filter gradient, then the bias gradient.
    unsafe fn conv2d_backward_filter_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
        db: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError> {
        self.conv2d_backward_filter(shape, x, dy, dw)?;
        self.conv2d_backward_bias(shape, dy, db)
    }
    /// Default: filter and bias gradients, then the input gradient.
    #[allow(clippy::too_many_arguments)]
    unsafe fn conv2d_backward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<Self, T>,
        w: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
        db: &mut Buf<Self, f32>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError> {
        self.conv2d_backward_filter_bias(shape, x, dy, dw, db)?;
        self.conv2d_backward_input(shape, dy, w, dx)
    }
    /// Default: the convolution's output gradient into a workspace the size of `y`
    /// ([`BackendImpl::avg_pool_relu_backward`]), then its filter and bias gradients.
    #[allow(clippy::too_many_arguments)]
    unsafe fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<Self, T>,
        y: &Buf<Self, T>,
        d_pooled: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
        db: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError> {
        let mut d_y = self.alloc_zeros::<T>(y.len())?;
        self.avg_pool_relu_backward(pool, d_pooled, y, &mut d_y)?;
        self.conv2d_backward_filter_bias(conv, x, &d_y, dw, db)
    }
}
