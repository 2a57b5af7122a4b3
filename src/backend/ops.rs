//! The operations a LeNet needs, as one trait every backend implements: the kernel devices
//! (CUDA, SIMT) by launching `kernels/*.cu`, the CPU backend in native Rust.
//!
//! Activations may be stored in f32 or f16 ([`Precision`]); arithmetic is f32 either way,
//! and weight gradients, biases and master weights are always f32.

use half::f16;

use super::shapes::{Conv2dShape, Epilogue, GemmShape, Pool2dShape, SgdStep};
use super::{BackendError, DeviceScalar, Memory};
use crate::kernels::{conv, elementwise, gemm, loss, optim, pool, KernelSignature};

/// The kernels that exist per storage precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrecisionOp {
    /// `conv2d_forward_*`
    Conv2dForward,
    /// `conv2d_backward_input_*`
    Conv2dBackwardInput,
    /// `conv2d_backward_filter_*`
    Conv2dBackwardFilter,
    /// `conv2d_backward_bias_*`
    Conv2dBackwardBias,
    /// `max_pool_forward_*`
    MaxPoolForward,
    /// `max_pool_backward_*`
    MaxPoolBackward,
    /// `avg_pool_forward_*`
    AvgPoolForward,
    /// `avg_pool_backward_*`
    AvgPoolBackward,
    /// `softmax_cross_entropy_*`
    SoftmaxCrossEntropy,
    /// `relu_backward_*`
    ReluBackward,
    /// `grad_check_*`
    GradCheck,
    /// `sgd_step_*grad`
    SgdStep,
    /// `gemm_f16_wmma_*out` (by output precision)
    GemmF16,
}

/// Storage precision of activations and gradients: `f32`, or `f16` computed in f32.
pub trait Precision: DeviceScalar {
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    /// Rounds from f32 (to nearest even for f16).
    fn from_f32(v: f32) -> Self;
    /// The kernel implementing `op` at this precision.
    fn kernel(op: PrecisionOp) -> &'static KernelSignature;
    /// Widens a whole slice into `dst` (same length): the fast path for many elements
    /// (F16C when the CPU has it, detected once per call rather than per element).
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
    }
    /// Rounds a whole slice into `dst` (same length), as [`Precision::from_f32`] does.
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = Self::from_f32(*s));
    }
    /// The slice itself when `Self` is f32, so the CPU backend can skip a widening copy.
    fn as_f32(_s: &[Self]) -> Option<&[f32]> {
        None
    }
    /// The slice itself when `Self` is f32, so the CPU backend can write results in place.
    fn as_f32_mut(_s: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

impl Precision for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
    fn kernel(op: PrecisionOp) -> &'static KernelSignature {
        match op {
            PrecisionOp::Conv2dForward => &conv::CONV2D_FORWARD_F32,
            PrecisionOp::Conv2dBackwardInput => &conv::CONV2D_BACKWARD_INPUT_F32,
            PrecisionOp::Conv2dBackwardFilter => &conv::CONV2D_BACKWARD_FILTER_F32,
            PrecisionOp::Conv2dBackwardBias => &conv::CONV2D_BACKWARD_BIAS_F32,
            PrecisionOp::MaxPoolForward => &pool::MAX_POOL_FORWARD_F32,
            PrecisionOp::MaxPoolBackward => &pool::MAX_POOL_BACKWARD_F32,
            PrecisionOp::AvgPoolForward => &pool::AVG_POOL_FORWARD_F32,
            PrecisionOp::AvgPoolBackward => &pool::AVG_POOL_BACKWARD_F32,
            PrecisionOp::SoftmaxCrossEntropy => &loss::SOFTMAX_CROSS_ENTROPY_F32,
            PrecisionOp::ReluBackward => &elementwise::RELU_BACKWARD_F32,
            PrecisionOp::GradCheck => &optim::GRAD_CHECK_F32,
            PrecisionOp::SgdStep => &optim::SGD_STEP_F32GRAD,
            PrecisionOp::GemmF16 => &gemm::GEMM_F16_WMMA_F32OUT,
        }
    }
}

impl Precision for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        super::cpu::half_convert::widen(src, dst);
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        super::cpu::half_convert::narrow(src, dst);
    }
    fn kernel(op: PrecisionOp) -> &'static KernelSignature {
        match op {
            PrecisionOp::Conv2dForward => &conv::CONV2D_FORWARD_F16,
            PrecisionOp::Conv2dBackwardInput => &conv::CONV2D_BACKWARD_INPUT_F16,
            PrecisionOp::Conv2dBackwardFilter => &conv::CONV2D_BACKWARD_FILTER_F16,
            PrecisionOp::Conv2dBackwardBias => &conv::CONV2D_BACKWARD_BIAS_F16,
            PrecisionOp::MaxPoolForward => &pool::MAX_POOL_FORWARD_F16,
            PrecisionOp::MaxPoolBackward => &pool::MAX_POOL_BACKWARD_F16,
            PrecisionOp::AvgPoolForward => &pool::AVG_POOL_FORWARD_F16,
            PrecisionOp::AvgPoolBackward => &pool::AVG_POOL_BACKWARD_F16,
            PrecisionOp::SoftmaxCrossEntropy => &loss::SOFTMAX_CROSS_ENTROPY_F16,
            PrecisionOp::ReluBackward => &elementwise::RELU_BACKWARD_F16,
            PrecisionOp::GradCheck => &optim::GRAD_CHECK_F16,
            PrecisionOp::SgdStep => &optim::SGD_STEP_F16GRAD,
            PrecisionOp::GemmF16 => &gemm::GEMM_F16_WMMA_F16OUT,
        }
    }
}

/// Checks that buffer `name` of `op` holds exactly `expected` elements.
pub(crate) fn expect_len(
    op: &'static str,
    name: &'static str,
    got: usize,
    expected: usize,
) -> Result<(), BackendError> {
    if got == expected {
        Ok(())
    } else {
        Err(BackendError::BufferSize {
            op,
            buffer: name,
            expected,
            got,
        })
    }
}

type Buf<B, T> = <B as Memory>::Buffer<T>;

/// Every operation LeNet training needs. Results land in the `&mut` buffers; shapes and
/// buffer lengths are checked first and reported as [`BackendError::BadShape`] or
/// [`BackendError::BufferSize`].
pub trait Backend: Memory {
    /// `out[i] = value`.
    fn fill(&self, out: &mut Buf<Self, f32>, value: f32) -> Result<(), BackendError>;
    /// `x[i] *= alpha`.
    fn scale(&self, x: &mut Buf<Self, f32>, alpha: f32) -> Result<(), BackendError>;
    /// `y[i] += alpha · x[i]`.
    fn axpy(
        &self,
        alpha: f32,
        x: &Buf<Self, f32>,
        y: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    /// `out[i] = a[i] + b[i]`.
    fn add(
        &self,
        a: &Buf<Self, f32>,
        b: &Buf<Self, f32>,
        out: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    /// `out[i] = f16(x[i])`, round to nearest even.
    fn cast_to_f16(&self, x: &Buf<Self, f32>, out: &mut Buf<Self, f16>)
        -> Result<(), BackendError>;
    /// `out[i] = f32(x[i])`.
    fn cast_to_f32(&self, x: &Buf<Self, f16>, out: &mut Buf<Self, f32>)
        -> Result<(), BackendError>;
    /// `dx[i] = y[i] > 0 ? dy[i] : 0`, with `y` the ReLU's output.
    fn relu_backward<T: Precision>(
        &self,
        y: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;

    /// `C = epilogue(alpha·op(A)·op(B) + beta·C)` in f32, bias per column of C.
    fn gemm(
        &self,
        shape: &GemmShape,
        a: &Buf<Self, f32>,
        b: &Buf<Self, f32>,
        bias: Option<&Buf<Self, f32>>,
        c: &mut Buf<Self, f32>,
        epilogue: Epilogue,
    ) -> Result<(), BackendError>;
    /// The same with half inputs and f32 accumulation (tensor cores on a GPU), C in `O`.
    fn gemm_f16<O: Precision>(
        &self,
        shape: &GemmShape,
        a: &Buf<Self, f16>,
        b: &Buf<Self, f16>,
        bias: Option<&Buf<Self, f32>>,
        c: &mut Buf<Self, O>,
        epilogue: Epilogue,
    ) -> Result<(), BackendError>;

    /// `y = conv2d(x, w) + bias`, then ReLU if asked.
    fn conv2d_forward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<Self, T>,
        w: &Buf<Self, T>,
        bias: Option<&Buf<Self, f32>>,
        y: &mut Buf<Self, T>,
        relu: bool,
    ) -> Result<(), BackendError>;
    /// `dx` from `dy` (the transposed convolution).
    fn conv2d_backward_input<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<Self, T>,
        w: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    /// `dw` (f32) from `x` and `dy`.
    fn conv2d_backward_filter<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    /// `db[o] = Σ dy[:, o]` (f32).
    fn conv2d_backward_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<Self, T>,
        db: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;

    /// Max pooling; `argmax` gets each output's index within its input plane.
    fn max_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<Self, T>,
        y: &mut Buf<Self, T>,
        argmax: &mut Buf<Self, i32>,
    ) -> Result<(), BackendError>;
    /// Routes `dy` to the recorded argmax positions.
    fn max_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<Self, T>,
        argmax: &Buf<Self, i32>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    /// Average pooling.
    fn avg_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<Self, T>,
        y: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    /// Spreads `dy` evenly over each window.
    fn avg_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;

    /// `y = relu(conv2d(x, w) + bias)` and `pooled = avg_pool(y)` in one call. Backends that
    /// fuse them pool each plane while it is still in cache instead of reading `y` back; the
    /// default is [`Backend::conv2d_forward`] then [`Backend::avg_pool_forward`]. A fused
    /// backend pools the f32 values before they are rounded to `T`.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_relu_avg_pool_forward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<Self, T>,
        w: &Buf<Self, T>,
        bias: Option<&Buf<Self, f32>>,
        y: &mut Buf<Self, T>,
        pooled: &mut Buf<Self, T>,
    ) -> Result<(), BackendError> {
        check::conv_then_pool(conv, pool)?;
        self.conv2d_forward(conv, x, w, bias, y, true)?;
        self.avg_pool_forward(pool, y, pooled)
    }
    /// `dx = (y > 0) ⊙ avg_pool_backward(d_pooled)`: an average pool's backward, then the
    /// backward of the ReLU whose output `y` it pooled. `scratch` (y's size) is a workspace
    /// for the default, [`Backend::avg_pool_backward`] then [`Backend::relu_backward`];
    /// backends that fuse the two leave it alone.
    fn avg_pool_relu_backward<T: Precision>(
        &self,
        pool: &Pool2dShape,
        d_pooled: &Buf<Self, T>,
        y: &Buf<Self, T>,
        scratch: &mut Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError> {
        self.avg_pool_backward(pool, d_pooled, scratch)?;
        self.relu_backward(y, scratch, dx)
    }
    /// [`Backend::conv2d_backward_filter`] and [`Backend::conv2d_backward_bias`] together:
    /// backends that fuse them read `dy` once.
    fn conv2d_backward_filter_bias<T: Precision>(
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

    /// A convolution's whole backward pass: filter, bias and input gradients. Backends that
    /// fuse them gather `dy` once; the default is
    /// [`Backend::conv2d_backward_filter_bias`] then [`Backend::conv2d_backward_input`].
    #[allow(clippy::too_many_arguments)]
    fn conv2d_backward<T: Precision>(
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

    /// The backward of [`Backend::conv2d_relu_avg_pool_forward`] for a first layer (no
    /// input gradient): the filter and bias gradients from the gradient at the pool's
    /// output, through the pool and the ReLU whose output `y` is. Backends that fuse it
    /// compute the convolution's output gradient a few images at a time where it is used;
    /// the default writes it to `d_y` with [`Backend::avg_pool_relu_backward`] (`scratch`
    /// is that call's workspace) and then runs [`Backend::conv2d_backward_filter_bias`].
    #[allow(clippy::too_many_arguments)]
    fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<Self, T>,
        y: &Buf<Self, T>,
        d_pooled: &Buf<Self, T>,
        scratch: &mut Buf<Self, T>,
        d_y: &mut Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
        db: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError> {
        check::conv_then_pool(conv, pool)?;
        self.avg_pool_relu_backward(pool, d_pooled, y, scratch, d_y)?;
        self.conv2d_backward_filter_bias(conv, x, d_y, dw, db)
    }

    /// Per-row softmax cross-entropy loss, optionally its logits' gradient times
    /// `grad_scale`, and `correct[0] +=` the number of rows whose argmax is the label.
    #[allow(clippy::too_many_arguments)]
    fn softmax_cross_entropy<T: Precision>(
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

    /// Sets `found[0] = 1` if any gradient is inf or NaN (leaves it alone otherwise).
    fn grad_check<G: Precision>(
        &self,
        grad: &Buf<Self, G>,
        found: &mut Buf<Self, i32>,
    ) -> Result<(), BackendError>;
    /// One fused SGD step (see `kernels/optim.cu`); skipped entirely when `found[0] != 0`.
    fn sgd_step<G: Precision>(
        &self,
        w: &mut Buf<Self, f32>,
        grad: &Buf<Self, G>,
        velocity: Option<&mut Buf<Self, f32>>,
        w_half: Option<&mut Buf<Self, f16>>,
        step: SgdStep,
        found: Option<&Buf<Self, i32>>,
    ) -> Result<(), BackendError>;
}

/// Shape and buffer-length checks shared by every backend's implementation of [`Backend`],
/// so a wrong call fails the same way (and before any work) on all of them.
pub(crate) mod check {
    use super::expect_len;

    /// Two buffers of an elementwise operation (or a host slice and a buffer) must match.
    pub(crate) fn same_len(
        operation: &'static str,
        left: usize,
        right: usize,
    ) -> Result<(), BackendError> {
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

    /// Validates a softmax cross-entropy call (sizes the kernels index with 32-bit ints).
    pub(crate) fn softmax(
        rows: usize,
        classes: usize,
        logits: usize,
        labels: usize,
        loss: usize,
        grad: Option<usize>,
        correct: usize,
    ) -> Result<(), BackendError> {
        let op = "softmax_cross_entropy";
        if rows == 0
            || classes == 0
            || rows
                .checked_mul(classes)
                .is_none_or(|n| n > i32::MAX as usize)
        {
            return Err(BackendError::BadShape {
                op,
                detail: format!("{rows} rows x {classes} classes"),
            });
        }
        expect_len(op, "logits", logits, rows * classes)?;
        expect_len(op, "labels", labels, rows)?;
        expect_len(op, "loss", loss, rows)?;
        expect_len(op, "correct", correct, 1)?;
        if let Some(g) = grad {
            expect_len(op, "grad", g, rows * classes)?;
        }
        Ok(())
    }

    /// Validates an SGD step over `n` weights.
    pub(crate) fn sgd(
        n: usize,
        grad: usize,
        velocity: Option<usize>,
        w_half: Option<usize>,
        found: Option<usize>,
    ) -> Result<(), BackendError> {
        expect_len("sgd_step", "grad", grad, n)?;
        if let Some(v) = velocity {
            expect_len("sgd_step", "velocity", v, n)?;
        }
        if let Some(h) = w_half {
            expect_len("sgd_step", "w_half", h, n)?;
        }
        if let Some(f) = found {
            expect_len("sgd_step", "found", f, 1)?;
        }
        Ok(())
    }
    use crate::backend::shapes::{Conv2dShape, Pool2dShape};
    use crate::backend::BackendError;

    /// Validates a convolution forward pass's shape and buffers.
    pub(crate) fn conv_forward(
        s: &Conv2dShape,
        x: usize,
        w: usize,
        y: usize,
        bias: Option<usize>,
    ) -> Result<(), BackendError> {
        s.validate()?;
        let (xs, ws, ys) = s.sizes();
        expect_len("conv2d_forward", "x", x, xs)?;
        expect_len("conv2d_forward", "w", w, ws)?;
        expect_len("conv2d_forward", "y", y, ys)?;
        if let Some(bias) = bias {
            expect_len("conv2d_forward", "bias", bias, s.out_c)?;
        }
        Ok(())
    }

    /// Validates a convolution's input-gradient call.
    pub(crate) fn conv_backward_input(
        s: &Conv2dShape,
        dy: usize,
        w: usize,
        dx: usize,
    ) -> Result<(), BackendError> {
        s.validate()?;
        let (xs, ws, ys) = s.sizes();
        expect_len("conv2d_backward_input", "dy", dy, ys)?;
        expect_len("conv2d_backward_input", "w", w, ws)?;
        expect_len("conv2d_backward_input", "dx", dx, xs)
    }

    /// Validates a convolution's filter-gradient call; returns the filter's size.
    pub(crate) fn conv_backward_filter(
        s: &Conv2dShape,
        x: usize,
        dy: usize,
        dw: usize,
    ) -> Result<usize, BackendError> {
        s.validate()?;
        let (xs, ws, ys) = s.sizes();
        expect_len("conv2d_backward_filter", "x", x, xs)?;
        expect_len("conv2d_backward_filter", "dy", dy, ys)?;
        expect_len("conv2d_backward_filter", "dw", dw, ws)?;
        Ok(ws)
    }

    /// Validates a convolution's bias-gradient call.
    pub(crate) fn conv_backward_bias(
        s: &Conv2dShape,
        dy: usize,
        db: usize,
    ) -> Result<(), BackendError> {
        s.validate()?;
        expect_len("conv2d_backward_bias", "dy", dy, s.sizes().2)?;
        expect_len("conv2d_backward_bias", "db", db, s.out_c)
    }

    /// Validates that `pool` pools exactly the planes `conv` produces.
    pub(crate) fn conv_then_pool(
        conv: &Conv2dShape,
        pool: &Pool2dShape,
    ) -> Result<(), BackendError> {
        conv.validate()?;
        pool.validate()?;
        if pool.planes != conv.batch * conv.out_c
            || pool.in_h != conv.out_h()
            || pool.in_w != conv.out_w()
        {
            return Err(BackendError::BadShape {
                op: "conv2d_relu_avg_pool_forward",
                detail: format!(
                    "the pool's input ({} planes of {}x{}) is not the convolution's output \
                     ({} planes of {}x{})",
                    pool.planes,
                    pool.in_h,
                    pool.in_w,
                    conv.batch * conv.out_c,
                    conv.out_h(),
                    conv.out_w()
                ),
            });
        }
        Ok(())
    }

    /// Validates a pooling call: `input`/`output` are the lengths of the input-side and
    /// output-side buffers (x and y forward, dx and dy backward), `argmax` max pooling's
    /// index buffer. Returns (input size, output size).
    pub(crate) fn pool(
        op: &'static str,
        s: &Pool2dShape,
        input: usize,
        output: usize,
        argmax: Option<usize>,
    ) -> Result<(usize, usize), BackendError> {
        s.validate()?;
        let (xs, ys) = s.sizes();
        let forward = op.ends_with("forward");
        expect_len(op, if forward { "x" } else { "dx" }, input, xs)?;
        expect_len(op, if forward { "y" } else { "dy" }, output, ys)?;
        if let Some(a) = argmax {
            expect_len(op, "argmax", a, ys)?;
        }
        Ok((xs, ys))
    }
}
