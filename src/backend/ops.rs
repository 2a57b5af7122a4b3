//! [`Backend`]: the operations a LeNet needs, as the library's users and the model call them.
//!
//! Every operation checks its shapes and buffer lengths here, once, and then hands the call
//! to the backend's [`BackendImpl`], which may assume them: the kernel devices (CUDA, SIMT)
//! by launching `kernels/*.cu` (`kernel/ops.rs`), the CPU backend in native Rust
//! ([`super::cpu`]). Every [`BackendImpl`] is a [`Backend`] through the one implementation
//! below, so no backend can skip a check, and a wrong call fails the same way on all of them.
//!
//! Activations may be stored in f32, f16 or bf16 ([`Precision`]); arithmetic is f32 either
//! way, and weight gradients, biases and master weights are always f32.

use super::backend_impl::{run, BackendImpl};
use super::op::{
    Add, AvgPoolBackward, AvgPoolForward, AvgPoolReluBackward, Axpy, BeginStep, Cast,
    Conv2dBackward, Conv2dBackwardBias, Conv2dBackwardFilter, Conv2dBackwardInput, Conv2dForward,
    Conv2dReluAvgPoolBackward, Conv2dReluAvgPoolBackwardRecomputed, Conv2dReluAvgPoolForward,
    Conv2dReluAvgPoolForwardPooled, Fill, GatherAndBegin, GatherBatch, Gemm, GradCheck,
    GradCheckMany, HeadGradient, InputGradient, MaxPoolBackward, MaxPoolForward, ReluBackward,
    Scale, Sgd, SgdMany, SgdTensor, ShardStats, SoftmaxCrossEntropy, SoftmaxHead, StepBegin,
    StepEnd,
};
use super::precision::Precision;
use super::shapes::{Conv2dShape, Epilogue, GemmShape, Pool2dShape, SgdStep};
use super::step::{StepScalars, TensorTable};
use super::{BackendError, Memory, Staging};

type Buf<B, T> = <B as Memory>::Buffer<T>;

/// Every operation LeNet training needs. Results land in the `&mut` buffers; shapes and
/// buffer lengths are checked first and reported as [`BackendError::BadShape`],
/// [`BackendError::BufferSize`] or [`BackendError::LengthMismatch`].
///
/// Implemented for every [`BackendImpl`]; a new backend implements that trait.
pub trait Backend: Memory + Sized {
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
    /// `out[i] = T(x[i])`, rounded to nearest even (a copy for f32).
    fn cast_from_f32<T: Precision>(
        &self,
        x: &Buf<Self, f32>,
        out: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    /// `out[i] = f32(x[i])` (exact).
    fn cast_to_f32<T: Precision>(
        &self,
        x: &Buf<Self, T>,
        out: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    /// `dx[i] = y[i] > 0 ? dy[i] : 0`, with `y` the ReLU's output.
    fn relu_backward<T: Precision>(
        &self,
        y: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;

    /// `C = epilogue(alpha·op(A)·op(B) + beta·C)`, bias per column of C, accumulated in f32
    /// from inputs of type `A` (tensor cores on a GPU for half inputs) into C of type `O`.
    /// The pairs with a kernel ([`gemm_kernels`](super::gemm_kernels)) run on every backend;
    /// any other is [`BackendError::Unsupported`].
    fn gemm<A: Precision, O: Precision>(
        &self,
        shape: &GemmShape,
        a: &Buf<Self, A>,
        b: &Buf<Self, A>,
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
    /// fuse them pool each plane while it is still in cache instead of reading `y` back,
    /// from the f32 values before they are rounded to `T`. `y` is defined at the pixels the
    /// pool's windows read, all that [`Backend::conv2d_relu_avg_pool_backward`] reads: a
    /// backend may leave the others (the last row and column of an odd plane under a 2x2
    /// pool) as they were.
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
    ) -> Result<(), BackendError>;
    /// `dx = (y > 0) ⊙ avg_pool_backward(d_pooled)`: an average pool's backward, then the
    /// backward of the ReLU whose output `y` it pooled.
    fn avg_pool_relu_backward<T: Precision>(
        &self,
        pool: &Pool2dShape,
        d_pooled: &Buf<Self, T>,
        y: &Buf<Self, T>,
        dx: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    /// [`Backend::conv2d_backward_filter`] and [`Backend::conv2d_backward_bias`] together:
    /// backends that fuse them read `dy` once.
    fn conv2d_backward_filter_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<Self, T>,
        dy: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
        db: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;
    /// A convolution's whole backward pass: filter, bias and input gradients. Backends that
    /// fuse them gather `dy` once.
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
    ) -> Result<(), BackendError>;
    /// The backward of [`Backend::conv2d_relu_avg_pool_forward`]: the filter and bias
    /// gradients from the gradient at the pool's output, through the pool and the ReLU whose
    /// output `y` is, and with `input` = `Some((w, dx))` the input gradient too (`None` for a
    /// first layer, whose input needs none). Backends that fuse it compute the
    /// convolution's output gradient where it is used; the others hold it in `workspace`
    /// (the size of `y`, its contents undefined after), so a training step allocates
    /// nothing: the caller keeps it from step to step.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<Self, T>,
        y: &Buf<Self, T>,
        d_pooled: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
        db: &mut Buf<Self, f32>,
        input: Option<InputGradient<'_, Self, T>>,
        workspace: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;

    /// Whether this backend's [`Backend::conv2d_relu_avg_pool_backward_recomputed`]
    /// recomputes the ReLU's output where it needs it, so that a first layer (no input
    /// gradient) keeps no tensor the size of its convolution's output between the passes: the
    /// kernel backends where `kernels/conv_direct.cu` takes the layer (one input channel, a
    /// 3x3 filter at stride 1, a 2x2 stride-2 pool). Where false, keep `y`
    /// ([`Backend::conv2d_relu_avg_pool_forward`], [`Backend::conv2d_relu_avg_pool_backward`]):
    /// the recomputing calls work everywhere, with the same results, but there they allocate
    /// `y` and run the forward again.
    fn recomputes_relu(&self, conv: &Conv2dShape, pool: &Pool2dShape) -> bool;
    /// [`Backend::conv2d_relu_avg_pool_forward`] keeping only `pooled`: `y` is not written
    /// (its backward is [`Backend::conv2d_relu_avg_pool_backward_recomputed`]).
    fn conv2d_relu_avg_pool_forward_pooled<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<Self, T>,
        w: &Buf<Self, T>,
        bias: Option<&Buf<Self, f32>>,
        pooled: &mut Buf<Self, T>,
    ) -> Result<(), BackendError>;
    /// [`Backend::conv2d_relu_avg_pool_backward`] for a first layer (no input gradient) whose
    /// forward kept no `y`: the ReLU's output is recomputed from `x`, `w` and `bias` (the
    /// forward's operands, rounded to `T` as the forward would have stored it), so the
    /// gradients are the same bits as from the stored `y`.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_relu_avg_pool_backward_recomputed<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<Self, T>,
        w: &Buf<Self, T>,
        bias: Option<&Buf<Self, f32>>,
        d_pooled: &Buf<Self, T>,
        dw: &mut Buf<Self, f32>,
        db: &mut Buf<Self, f32>,
    ) -> Result<(), BackendError>;

    /// [`Backend::sgd_step`] on every tensor of `tensors` (at least one), in one launch on
    /// a kernel device: a grid whose second dimension is the tensor, the tensors' addresses
    /// read from `table` (rewritten only when they change). The flag, `step` and `at` are
    /// shared; the whole update is skipped when `found[0] != 0`.
    fn sgd_step_many<T: Precision>(
        &self,
        tensors: Vec<SgdTensor<'_, Self, T>>,
        table: &mut TensorTable<Self>,
        step: SgdStep,
        at: Option<&StepScalars<Self>>,
        found: Option<&Buf<Self, i32>>,
    ) -> Result<(), BackendError>;

    /// [`Backend::grad_check`] over every gradient of `grads` (f32, at least one), in one
    /// launch on a kernel device (as [`Backend::sgd_step_many`], through `table`).
    fn grad_check_many(
        &self,
        grads: &[&Buf<Self, f32>],
        table: &mut TensorTable<Self>,
        found: &mut Buf<Self, i32>,
    ) -> Result<(), BackendError>;

    /// Per-row softmax cross-entropy loss, optionally its logits' gradient times
    /// `grad_scale`, and `correct[0] +=` the number of rows whose argmax is the label.
    /// With `at`, the factor is `at.grad_scale`, read from device memory when the kernel
    /// runs, and `grad_scale` is not used.
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
        at: Option<&StepScalars<Self>>,
    ) -> Result<(), BackendError>;

    /// A classifier's head, forward and backward: the linear layer `logits = h·wᵀ + b` (`h`
    /// rows x hidden, `w` classes x hidden), each row's softmax cross-entropy `loss` as
    /// [`Backend::softmax_cross_entropy`], and the shard's statistics into `stats` as
    /// [`Backend::shard_stats`] (added with `accumulate`). With `grad`, the backward pass
    /// too: the logits' gradient, the layer's weight and bias gradients (summed over the
    /// rows), the gradient of `h` through the ReLU that made it (`dh = (d_logits·w)` where
    /// `h > 0`, else 0) and its sum over the rows (the bias gradient of the layer below). The same results as those operations one after the other, which is
    /// what backends that do not fuse them run; the kernel backends run one launch.
    #[allow(clippy::too_many_arguments)]
    fn softmax_head<T: Precision>(
        &self,
        rows: usize,
        hidden: usize,
        classes: usize,
        h: &Buf<Self, T>,
        w: &Buf<Self, T>,
        b: &Buf<Self, f32>,
        labels: &Buf<Self, u8>,
        logits: &mut Buf<Self, T>,
        loss: &mut Buf<Self, f32>,
        stats: &mut Buf<Self, f32>,
        accumulate: bool,
        grad: Option<HeadGradient<'_, Self, T>>,
    ) -> Result<(), BackendError>;

    /// Sets `found[0] = 1` if any gradient is inf or NaN (leaves it alone otherwise).
    fn grad_check<G: Precision>(
        &self,
        grad: &Buf<Self, G>,
        found: &mut Buf<Self, i32>,
    ) -> Result<(), BackendError>;
    /// One fused SGD step (see `kernels/optim.cu`) on f32 master weights from f32
    /// gradients, writing `w_copy = T(w)` too when given (the next forward's weights in the
    /// run's storage type); skipped entirely when `found[0] != 0`. With `at`, the learning
    /// rate and the gradients' factor are `at.lr` and `at.inv_scale`, read from device
    /// memory when the kernel runs, and `step.lr` and `step.inv_scale` are not used.
    #[allow(clippy::too_many_arguments)]
    fn sgd_step<T: Precision>(
        &self,
        w: &mut Buf<Self, f32>,
        grad: &Buf<Self, f32>,
        velocity: Option<&mut Buf<Self, f32>>,
        w_copy: Option<&mut Buf<Self, T>>,
        step: SgdStep,
        at: Option<&StepScalars<Self>>,
        found: Option<&Buf<Self, i32>>,
    ) -> Result<(), BackendError>;

    /// A shard gathered from a data set the device holds (`pixels`: images of one size,
    /// `labels`: one byte each): image `i` of the shard is image `order[batch[0] · shard + i]`
    /// of the set, as `x[i][p] = T(pixel / 255)` (the division correctly rounded, as the
    /// host computes it) and `y[i]` its label. `y`'s length is the shard's size (at most
    /// `shard`, the stride between batches; the last batch of an epoch may be smaller). An
    /// index past `order` or past the set gives zeros and label 255, out of every class's
    /// range, so the loss is NaN instead of a read out of bounds.
    #[allow(clippy::too_many_arguments)]
    fn gather_batch<T: Precision>(
        &self,
        pixels: &Buf<Self, u8>,
        labels: &Buf<Self, u8>,
        order: &Buf<Self, u32>,
        batch: &Buf<Self, u32>,
        shard: usize,
        x: &mut Buf<Self, T>,
        y: &mut Buf<Self, u8>,
    ) -> Result<(), BackendError>;

    /// [`Backend::step_begin`] and [`Backend::gather_batch`] of one `batch`: a training
    /// step's first work, one launch on the kernel backends (the same results as the two one
    /// after the other, which the others run).
    #[allow(clippy::too_many_arguments)]
    fn gather_batch_and_begin<T: Precision>(
        &self,
        pixels: &Buf<Self, u8>,
        labels: &Buf<Self, u8>,
        order: &Buf<Self, u32>,
        batch: &Buf<Self, u32>,
        shard: usize,
        x: &mut Buf<Self, T>,
        y: &mut Buf<Self, u8>,
        begin: BeginStep<'_, Self>,
    ) -> Result<(), BackendError>;

    /// A step's scalars, in device memory: `out.lr = lr_table[batch[0]]` (NaN past the
    /// table), `out.grad_scale = loss_scale[0] / global`, `out.inv_scale = 1 / loss_scale[0]`.
    fn step_begin(
        &self,
        lr_table: &Buf<Self, f32>,
        batch: &Buf<Self, u32>,
        loss_scale: &Buf<Self, f32>,
        global: usize,
        out: &mut StepScalars<Self>,
    ) -> Result<(), BackendError>;

    /// A shard's statistics ([`STATS`](super::step::STATS)): `out = (Σ loss, correct[0],
    /// loss.len())`, or added to `out` with `accumulate`; then `correct[0] = 0`, ready for
    /// the next [`Backend::softmax_cross_entropy`]. The sum is in double, in a fixed order.
    fn shard_stats(
        &self,
        loss: &Buf<Self, f32>,
        correct: &mut Buf<Self, i32>,
        out: &mut Buf<Self, f32>,
        accumulate: bool,
    ) -> Result<(), BackendError>;

    /// The end of a step, in device memory. First the step's record (its statistics
    /// `current`, then the loss scale it ran with) goes to record `batch[0] % records` of
    /// `ring` (records of [`RECORD`](super::step::RECORD) values, in host memory the device
    /// writes: [`Memory::alloc_staging`]; the other records are left alone), and
    /// `batch[0] += 1`. Then,
    /// with `found` (a half-precision step's overflow flag) and `clean` (fp16's dynamic loss
    /// scaling), the scale moves by [`rescale`](super::step::rescale)'s rule, as
    /// [`LossScaler`](crate::train::LossScaler) does on the host; and `found[0] = 0`.
    #[allow(clippy::too_many_arguments)]
    fn step_end(
        &self,
        loss_scale: &mut Buf<Self, f32>,
        clean: Option<&mut Buf<Self, i32>>,
        found: Option<&mut Buf<Self, i32>>,
        growth_interval: usize,
        batch: &mut Buf<Self, u32>,
        current: &Buf<Self, f32>,
        ring: &mut Staging<f32>,
    ) -> Result<(), BackendError>;
}

/// Every call's checks ([`Checked::new`](super::op::Checked::new)), then the backend's own
/// implementation.
impl<B: BackendImpl> Backend for B {
    fn fill(&self, out: &mut Buf<B, f32>, value: f32) -> Result<(), BackendError> {
        run(self, Fill { out, value }, BackendImpl::fill)
    }

    fn scale(&self, x: &mut Buf<B, f32>, alpha: f32) -> Result<(), BackendError> {
        run(self, Scale { x, alpha }, BackendImpl::scale)
    }

    fn axpy(&self, alpha: f32, x: &Buf<B, f32>, y: &mut Buf<B, f32>) -> Result<(), BackendError> {
        run(self, Axpy { alpha, x, y }, BackendImpl::axpy)
    }

    fn add(
        &self,
        a: &Buf<B, f32>,
        b: &Buf<B, f32>,
        out: &mut Buf<B, f32>,
    ) -> Result<(), BackendError> {
        run(self, Add { a, b, out }, BackendImpl::add)
    }

    fn cast_from_f32<T: Precision>(
        &self,
        x: &Buf<B, f32>,
        out: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        run(self, Cast { x, out }, BackendImpl::cast_from_f32)
    }

    fn cast_to_f32<T: Precision>(
        &self,
        x: &Buf<B, T>,
        out: &mut Buf<B, f32>,
    ) -> Result<(), BackendError> {
        run(self, Cast { x, out }, BackendImpl::cast_to_f32)
    }

    fn relu_backward<T: Precision>(
        &self,
        y: &Buf<B, T>,
        dy: &Buf<B, T>,
        dx: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        run(self, ReluBackward { y, dy, dx }, BackendImpl::relu_backward)
    }

    fn gemm<A: Precision, O: Precision>(
        &self,
        shape: &GemmShape,
        a: &Buf<B, A>,
        b: &Buf<B, A>,
        bias: Option<&Buf<B, f32>>,
        c: &mut Buf<B, O>,
        epilogue: Epilogue,
    ) -> Result<(), BackendError> {
        let op = Gemm {
            shape,
            a,
            b,
            bias,
            c,
            epilogue,
        };
        run(self, op, BackendImpl::gemm)
    }

    fn conv2d_forward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<B, T>,
        w: &Buf<B, T>,
        bias: Option<&Buf<B, f32>>,
        y: &mut Buf<B, T>,
        relu: bool,
    ) -> Result<(), BackendError> {
        let op = Conv2dForward {
            shape,
            x,
            w,
            bias,
            y,
            relu,
        };
        run(self, op, BackendImpl::conv2d_forward)
    }

    fn conv2d_backward_input<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<B, T>,
        w: &Buf<B, T>,
        dx: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        let op = Conv2dBackwardInput { shape, dy, w, dx };
        run(self, op, BackendImpl::conv2d_backward_input)
    }

    fn conv2d_backward_filter<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<B, T>,
        dy: &Buf<B, T>,
        dw: &mut Buf<B, f32>,
    ) -> Result<(), BackendError> {
        let op = Conv2dBackwardFilter {
            shape,
            x,
            dy,
            dw,
            db: None,
        };
        run(self, op, BackendImpl::conv2d_backward_filter)
    }

    fn conv2d_backward_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        dy: &Buf<B, T>,
        db: &mut Buf<B, f32>,
    ) -> Result<(), BackendError> {
        let op = Conv2dBackwardBias { shape, dy, db };
        run(self, op, BackendImpl::conv2d_backward_bias)
    }

    fn max_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<B, T>,
        y: &mut Buf<B, T>,
        argmax: &mut Buf<B, i32>,
    ) -> Result<(), BackendError> {
        let op = MaxPoolForward {
            shape,
            x,
            y,
            argmax,
        };
        run(self, op, BackendImpl::max_pool_forward)
    }

    fn max_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<B, T>,
        argmax: &Buf<B, i32>,
        dx: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        let op = MaxPoolBackward {
            shape,
            dy,
            argmax,
            dx,
        };
        run(self, op, BackendImpl::max_pool_backward)
    }

    fn avg_pool_forward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        x: &Buf<B, T>,
        y: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        run(
            self,
            AvgPoolForward { shape, x, y },
            BackendImpl::avg_pool_forward,
        )
    }

    fn avg_pool_backward<T: Precision>(
        &self,
        shape: &Pool2dShape,
        dy: &Buf<B, T>,
        dx: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        run(
            self,
            AvgPoolBackward { shape, dy, dx },
            BackendImpl::avg_pool_backward,
        )
    }

    fn conv2d_relu_avg_pool_forward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<B, T>,
        w: &Buf<B, T>,
        bias: Option<&Buf<B, f32>>,
        y: &mut Buf<B, T>,
        pooled: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        let op = Conv2dReluAvgPoolForward {
            conv,
            pool,
            x,
            w,
            bias,
            y,
            pooled,
        };
        run(self, op, BackendImpl::conv2d_relu_avg_pool_forward)
    }

    fn avg_pool_relu_backward<T: Precision>(
        &self,
        pool: &Pool2dShape,
        d_pooled: &Buf<B, T>,
        y: &Buf<B, T>,
        dx: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        let op = AvgPoolReluBackward {
            pool,
            d_pooled,
            y,
            dx,
        };
        run(self, op, BackendImpl::avg_pool_relu_backward)
    }

    fn conv2d_backward_filter_bias<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<B, T>,
        dy: &Buf<B, T>,
        dw: &mut Buf<B, f32>,
        db: &mut Buf<B, f32>,
    ) -> Result<(), BackendError> {
        let op = Conv2dBackwardFilter {
            shape,
            x,
            dy,
            dw,
            db: Some(db),
        };
        run(self, op, BackendImpl::conv2d_backward_filter)
    }

    fn conv2d_backward<T: Precision>(
        &self,
        shape: &Conv2dShape,
        x: &Buf<B, T>,
        w: &Buf<B, T>,
        dy: &Buf<B, T>,
        dw: &mut Buf<B, f32>,
        db: &mut Buf<B, f32>,
        dx: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        let op = Conv2dBackward {
            shape,
            x,
            w,
            dy,
            dw,
            db,
            dx,
        };
        run(self, op, BackendImpl::conv2d_backward)
    }

    fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<B, T>,
        y: &Buf<B, T>,
        d_pooled: &Buf<B, T>,
        dw: &mut Buf<B, f32>,
        db: &mut Buf<B, f32>,
        input: Option<InputGradient<'_, B, T>>,
        workspace: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        let op = Conv2dReluAvgPoolBackward {
            conv,
            pool,
            x,
            y,
            d_pooled,
            dw,
            db,
            input,
            workspace,
        };
        run(self, op, BackendImpl::conv2d_relu_avg_pool_backward)
    }

    fn recomputes_relu(&self, conv: &Conv2dShape, pool: &Pool2dShape) -> bool {
        BackendImpl::recomputes_relu(self, conv, pool)
    }

    fn conv2d_relu_avg_pool_forward_pooled<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<B, T>,
        w: &Buf<B, T>,
        bias: Option<&Buf<B, f32>>,
        pooled: &mut Buf<B, T>,
    ) -> Result<(), BackendError> {
        let op = Conv2dReluAvgPoolForwardPooled {
            conv,
            pool,
            x,
            w,
            bias,
            pooled,
        };
        run(self, op, BackendImpl::conv2d_relu_avg_pool_forward_pooled)
    }

    fn conv2d_relu_avg_pool_backward_recomputed<T: Precision>(
        &self,
        conv: &Conv2dShape,
        pool: &Pool2dShape,
        x: &Buf<B, T>,
        w: &Buf<B, T>,
        bias: Option<&Buf<B, f32>>,
        d_pooled: &Buf<B, T>,
        dw: &mut Buf<B, f32>,
        db: &mut Buf<B, f32>,
    ) -> Result<(), BackendError> {
        let op = Conv2dReluAvgPoolBackwardRecomputed {
            conv,
            pool,
            x,
            w,
            bias,
            d_pooled,
            dw,
            db,
        };
        run(
            self,
            op,
            BackendImpl::conv2d_relu_avg_pool_backward_recomputed,
        )
    }

    fn softmax_cross_entropy<T: Precision>(
        &self,
        rows: usize,
        classes: usize,
        logits: &Buf<B, T>,
        labels: &Buf<B, u8>,
        loss: &mut Buf<B, f32>,
        grad: Option<&mut Buf<B, T>>,
        correct: &mut Buf<B, i32>,
        grad_scale: f32,
        at: Option<&StepScalars<B>>,
    ) -> Result<(), BackendError> {
        let op = SoftmaxCrossEntropy {
            rows,
            classes,
            logits,
            labels,
            loss,
            grad,
            correct,
            grad_scale,
            at,
        };
        run(self, op, BackendImpl::softmax_cross_entropy)
    }

    fn softmax_head<T: Precision>(
        &self,
        rows: usize,
        hidden: usize,
        classes: usize,
        h: &Buf<B, T>,
        w: &Buf<B, T>,
        b: &Buf<B, f32>,
        labels: &Buf<B, u8>,
        logits: &mut Buf<B, T>,
        loss: &mut Buf<B, f32>,
        stats: &mut Buf<B, f32>,
        accumulate: bool,
        grad: Option<HeadGradient<'_, B, T>>,
    ) -> Result<(), BackendError> {
        let op = SoftmaxHead {
            rows,
            hidden,
            classes,
            h,
            w,
            b,
            labels,
            logits,
            loss,
            stats,
            accumulate,
            grad,
        };
        run(self, op, BackendImpl::softmax_head)
    }

    fn grad_check<G: Precision>(
        &self,
        grad: &Buf<B, G>,
        found: &mut Buf<B, i32>,
    ) -> Result<(), BackendError> {
        run(self, GradCheck { grad, found }, BackendImpl::grad_check)
    }

    fn sgd_step<T: Precision>(
        &self,
        w: &mut Buf<B, f32>,
        grad: &Buf<B, f32>,
        velocity: Option<&mut Buf<B, f32>>,
        w_copy: Option<&mut Buf<B, T>>,
        step: SgdStep,
        at: Option<&StepScalars<B>>,
        found: Option<&Buf<B, i32>>,
    ) -> Result<(), BackendError> {
        let op = Sgd {
            w,
            grad,
            velocity,
            w_copy,
            step,
            at,
            found,
        };
        run(self, op, BackendImpl::sgd_step)
    }

    fn sgd_step_many<T: Precision>(
        &self,
        tensors: Vec<SgdTensor<'_, B, T>>,
        table: &mut TensorTable<B>,
        step: SgdStep,
        at: Option<&StepScalars<B>>,
        found: Option<&Buf<B, i32>>,
    ) -> Result<(), BackendError> {
        let op = SgdMany {
            tensors,
            table,
            step,
            at,
            found,
        };
        run(self, op, BackendImpl::sgd_step_many)
    }

    fn grad_check_many(
        &self,
        grads: &[&Buf<B, f32>],
        table: &mut TensorTable<B>,
        found: &mut Buf<B, i32>,
    ) -> Result<(), BackendError> {
        let op = GradCheckMany {
            grads,
            table,
            found,
        };
        run(self, op, BackendImpl::grad_check_many)
    }

    fn gather_batch<T: Precision>(
        &self,
        pixels: &Buf<B, u8>,
        labels: &Buf<B, u8>,
        order: &Buf<B, u32>,
        batch: &Buf<B, u32>,
        shard: usize,
        x: &mut Buf<B, T>,
        y: &mut Buf<B, u8>,
    ) -> Result<(), BackendError> {
        let op = GatherBatch {
            pixels,
            labels,
            order,
            batch,
            shard,
            x,
            y,
        };
        run(self, op, BackendImpl::gather_batch)
    }

    fn gather_batch_and_begin<T: Precision>(
        &self,
        pixels: &Buf<B, u8>,
        labels: &Buf<B, u8>,
        order: &Buf<B, u32>,
        batch: &Buf<B, u32>,
        shard: usize,
        x: &mut Buf<B, T>,
        y: &mut Buf<B, u8>,
        begin: BeginStep<'_, B>,
    ) -> Result<(), BackendError> {
        let gather = GatherBatch {
            pixels,
            labels,
            order,
            batch,
            shard,
            x,
            y,
        };
        let op = GatherAndBegin { gather, begin };
        run(self, op, BackendImpl::gather_batch_and_begin)
    }

    fn step_begin(
        &self,
        lr_table: &Buf<B, f32>,
        batch: &Buf<B, u32>,
        loss_scale: &Buf<B, f32>,
        global: usize,
        out: &mut StepScalars<B>,
    ) -> Result<(), BackendError> {
        let op = StepBegin {
            lr_table,
            batch,
            loss_scale,
            global,
            out,
        };
        run(self, op, BackendImpl::step_begin)
    }

    fn shard_stats(
        &self,
        loss: &Buf<B, f32>,
        correct: &mut Buf<B, i32>,
        out: &mut Buf<B, f32>,
        accumulate: bool,
    ) -> Result<(), BackendError> {
        let op = ShardStats {
            loss,
            correct,
            out,
            accumulate,
        };
        run(self, op, BackendImpl::shard_stats)
    }

    fn step_end(
        &self,
        loss_scale: &mut Buf<B, f32>,
        clean: Option<&mut Buf<B, i32>>,
        found: Option<&mut Buf<B, i32>>,
        growth_interval: usize,
        batch: &mut Buf<B, u32>,
        current: &Buf<B, f32>,
        ring: &mut Staging<f32>,
    ) -> Result<(), BackendError> {
        let op = StepEnd {
            loss_scale,
            clean,
            found,
            growth_interval,
            batch,
            current,
            ring,
        };
        run(self, op, BackendImpl::step_end)
    }
}
