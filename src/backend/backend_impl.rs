//! [`BackendImpl`]: what a backend provides so that it is a [`Backend`](super::Backend).
//!
//! Each method does what the [`Backend`](super::Backend) method of the same name documents,
//! given that operation's arguments as a [`Checked`] struct ([`super::op`]): an
//! implementation may index by the shape without checking again. The fused operations have
//! defaults built from the plain ones (what the kernel devices use); a backend overrides
//! them where fusing pays (the CPU backend does for four of them). Workspace a default needs is
//! allocated here, from the backend itself, not passed in by every caller.

use super::op::{
    Add, Args, AvgPoolBackward, AvgPoolForward, AvgPoolReluBackward, Axpy, Cast, Checked,
    Conv2dBackward, Conv2dBackwardBias, Conv2dBackwardFilter, Conv2dBackwardInput, Conv2dForward,
    Conv2dReluAvgPoolBackward, Conv2dReluAvgPoolBackwardRecomputed, Conv2dReluAvgPoolForward,
    Conv2dReluAvgPoolForwardPooled, ConvOperands, Fill, GatherAndBegin, GatherBatch, Gemm,
    GradCheck, GradCheckMany, MaxPoolBackward, MaxPoolForward, ReluBackward, Scale, Sgd, SgdMany,
    ShardStats, SoftmaxCrossEntropy, SoftmaxHead, StepBegin, StepEnd,
};
use super::precision::Precision;
use super::shapes::{Conv2dShape, Epilogue, GemmShape, Pool2dShape};
use super::{BackendError, Memory};

/// What every backend operation returns.
pub type OpResult = Result<(), BackendError>;

/// A backend's own implementation of the operations, each taking the [`Checked`] arguments
/// of its [`Backend`](super::Backend) namesake (whose docs say what it computes).
/// Implemented by [`CpuDevice`](super::cpu::CpuDevice) and by every kernel
/// [`KernelDevice`](super::KernelDevice). [`Backend::conv2d_backward_filter`] and
/// [`Backend::conv2d_backward_filter_bias`] share
/// [`BackendImpl::conv2d_backward_filter`] (the bias gradient when `db` is given).
///
/// [`Backend::conv2d_backward_filter`]: super::Backend::conv2d_backward_filter
/// [`Backend::conv2d_backward_filter_bias`]: super::Backend::conv2d_backward_filter_bias
#[allow(missing_docs)] // each is documented on `Backend`
pub trait BackendImpl: Memory + Sized {
    fn fill(&self, op: Checked<Fill<'_, Self>>) -> OpResult;
    fn scale(&self, op: Checked<Scale<'_, Self>>) -> OpResult;
    fn axpy(&self, op: Checked<Axpy<'_, Self>>) -> OpResult;
    fn add(&self, op: Checked<Add<'_, Self>>) -> OpResult;
    fn cast_from_f32<T: Precision>(&self, op: Checked<Cast<'_, Self, f32, T>>) -> OpResult;
    fn cast_to_f32<T: Precision>(&self, op: Checked<Cast<'_, Self, T, f32>>) -> OpResult;
    fn relu_backward<T: Precision>(&self, op: Checked<ReluBackward<'_, Self, T>>) -> OpResult;
    fn gemm<A: Precision, O: Precision>(&self, op: Checked<Gemm<'_, Self, A, O>>) -> OpResult;
    fn conv2d_forward<T: Precision>(&self, op: Checked<Conv2dForward<'_, Self, T>>) -> OpResult;
    fn conv2d_backward_input<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardInput<'_, Self, T>>,
    ) -> OpResult;
    fn conv2d_backward_filter<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardFilter<'_, Self, T>>,
    ) -> OpResult;
    fn conv2d_backward_bias<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardBias<'_, Self, T>>,
    ) -> OpResult;
    fn max_pool_forward<T: Precision>(&self, op: Checked<MaxPoolForward<'_, Self, T>>) -> OpResult;
    fn max_pool_backward<T: Precision>(
        &self,
        op: Checked<MaxPoolBackward<'_, Self, T>>,
    ) -> OpResult;
    fn avg_pool_forward<T: Precision>(&self, op: Checked<AvgPoolForward<'_, Self, T>>) -> OpResult;
    fn avg_pool_backward<T: Precision>(
        &self,
        op: Checked<AvgPoolBackward<'_, Self, T>>,
    ) -> OpResult;
    fn softmax_cross_entropy<T: Precision>(
        &self,
        op: Checked<SoftmaxCrossEntropy<'_, Self, T>>,
    ) -> OpResult;
    fn grad_check<G: Precision>(&self, op: Checked<GradCheck<'_, Self, G>>) -> OpResult;
    fn sgd_step<T: Precision>(&self, op: Checked<Sgd<'_, Self, T>>) -> OpResult;
    fn sgd_step_many<T: Precision>(&self, op: Checked<SgdMany<'_, Self, T>>) -> OpResult;
    fn grad_check_many(&self, op: Checked<GradCheckMany<'_, Self>>) -> OpResult;
    fn gather_batch<T: Precision>(&self, op: Checked<GatherBatch<'_, Self, T>>) -> OpResult;
    fn step_begin(&self, op: Checked<StepBegin<'_, Self>>) -> OpResult;
    fn shard_stats(&self, op: Checked<ShardStats<'_, Self>>) -> OpResult;
    fn step_end(&self, op: Checked<StepEnd<'_, Self>>) -> OpResult;

    /// Default: the step's scalars, then the gather.
    fn gather_batch_and_begin<T: Precision>(
        &self,
        op: Checked<GatherAndBegin<'_, Self, T>>,
    ) -> OpResult {
        let GatherAndBegin { gather, begin } = op.into_inner();
        let scalars = StepBegin {
            lr_table: begin.lr_table,
            batch: gather.batch,
            loss_scale: begin.loss_scale,
            global: begin.global,
            out: begin.out,
        };
        run(self, scalars, Self::step_begin)?;
        run(self, gather, Self::gather_batch)
    }

    /// Default: the operations it fuses, one after the other (`head_unfused`).
    fn softmax_head<T: Precision>(&self, op: Checked<SoftmaxHead<'_, Self, T>>) -> OpResult {
        head_unfused(self, op)
    }

    /// Default: the convolution with its ReLU, then the pool reading `y` back
    /// (`conv_relu_then_pool`).
    fn conv2d_relu_avg_pool_forward<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolForward<'_, Self, T>>,
    ) -> OpResult {
        conv_relu_then_pool(self, op)
    }

    /// The pool's backward and the ReLU's in one pass (every backend implements it: the
    /// kernel backends with one kernel, the CPU backend fused into its loops).
    fn avg_pool_relu_backward<T: Precision>(
        &self,
        op: Checked<AvgPoolReluBackward<'_, Self, T>>,
    ) -> OpResult;

    /// Default: filter and bias gradients, then the input gradient.
    fn conv2d_backward<T: Precision>(&self, op: Checked<Conv2dBackward<'_, Self, T>>) -> OpResult {
        let op = op.into_inner();
        let filter = Conv2dBackwardFilter {
            shape: op.shape,
            x: op.x,
            dy: op.dy,
            dw: op.dw,
            db: Some(op.db),
        };
        run(self, filter, Self::conv2d_backward_filter)?;
        let input = Conv2dBackwardInput {
            shape: op.shape,
            dy: op.dy,
            w: op.w,
            dx: op.dx,
        };
        run(self, input, Self::conv2d_backward_input)
    }

    /// Default: the convolution's output gradient into the op's workspace
    /// ([`BackendImpl::avg_pool_relu_backward`]), then its filter and bias gradients (and the
    /// input gradient when asked).
    fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolBackward<'_, Self, T>>,
    ) -> OpResult {
        unpool_then_backward(self, op)
    }

    /// Default: false (the recomputing calls' defaults keep `y` for the call).
    fn recomputes_relu(&self, _conv: &Conv2dShape, _pool: &Pool2dShape) -> bool {
        false
    }

    /// Default: [`BackendImpl::conv2d_relu_avg_pool_forward`] into a `y` allocated here
    /// (`forward_into_temporary`).
    fn conv2d_relu_avg_pool_forward_pooled<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolForwardPooled<'_, Self, T>>,
    ) -> OpResult {
        forward_into_temporary(self, op)
    }

    /// Default: the forward again into a `y` allocated here, then
    /// [`BackendImpl::conv2d_relu_avg_pool_backward`] reading it (`recompute_then_backward`).
    fn conv2d_relu_avg_pool_backward_recomputed<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolBackwardRecomputed<'_, Self, T>>,
    ) -> OpResult {
        recompute_then_backward(self, op)
    }
}

/// [`BackendImpl::conv2d_relu_avg_pool_forward_pooled`] through the forward that keeps `y`,
/// into a `y` allocated here (the default, and a recomputing backend's way for shapes it
/// does not recompute).
pub(super) fn forward_into_temporary<B: BackendImpl, T: Precision>(
    backend: &B,
    op: Checked<Conv2dReluAvgPoolForwardPooled<'_, B, T>>,
) -> OpResult {
    let op = op.into_inner();
    let operands = (op.x, op.w, op.bias);
    forward_keeping_y(backend, (op.conv, op.pool), operands, op.pooled).map(drop)
}

/// [`BackendImpl::conv2d_relu_avg_pool_backward_recomputed`] as the forward again into a `y`
/// (and a pooled output) allocated here, then the backward reading it (the default, and a
/// recomputing backend's way for shapes it does not recompute).
pub(super) fn recompute_then_backward<B: BackendImpl, T: Precision>(
    backend: &B,
    op: Checked<Conv2dReluAvgPoolBackwardRecomputed<'_, B, T>>,
) -> OpResult {
    let op = op.into_inner();
    let mut pooled = backend.alloc_zeros::<T>(op.pool.sizes().1)?;
    let operands = (op.x, op.w, op.bias);
    let y = forward_keeping_y(backend, (op.conv, op.pool), operands, &mut pooled)?;
    let mut workspace = backend.alloc_zeros::<T>(op.conv.sizes().2)?;
    let backward = Conv2dReluAvgPoolBackward {
        conv: op.conv,
        pool: op.pool,
        x: op.x,
        y: &y,
        d_pooled: op.d_pooled,
        dw: op.dw,
        db: op.db,
        input: None,
        workspace: &mut workspace,
    };
    run(backend, backward, B::conv2d_relu_avg_pool_backward)
}

/// [`BackendImpl::conv2d_relu_avg_pool_forward`] into `pooled` and a `y` allocated here,
/// which it returns.
fn forward_keeping_y<B: BackendImpl, T: Precision>(
    backend: &B,
    (conv, pool): (&Conv2dShape, &Pool2dShape),
    (x, w, bias): ConvOperands<'_, B, T>,
    pooled: &mut B::Buffer<T>,
) -> Result<B::Buffer<T>, BackendError> {
    let mut y = backend.alloc_zeros::<T>(conv.sizes().2)?;
    let forward = Conv2dReluAvgPoolForward {
        conv,
        pool,
        x,
        w,
        bias,
        y: &mut y,
        pooled,
    };
    run(backend, forward, B::conv2d_relu_avg_pool_forward)?;
    Ok(y)
}

/// [`BackendImpl::conv2d_relu_avg_pool_backward`] unfused: the convolution's output gradient
/// into the op's workspace, then its gradients (the default, and a fusing backend's way for
/// pools it does not fuse).
pub(super) fn unpool_then_backward<B: BackendImpl, T: Precision>(
    backend: &B,
    op: Checked<Conv2dReluAvgPoolBackward<'_, B, T>>,
) -> OpResult {
    let op = op.into_inner();
    let d_y = op.workspace;
    let unpool = AvgPoolReluBackward {
        pool: op.pool,
        d_pooled: op.d_pooled,
        y: op.y,
        dx: &mut *d_y,
    };
    run(backend, unpool, B::avg_pool_relu_backward)?;
    match op.input {
        Some((w, dx)) => {
            let backward = Conv2dBackward {
                shape: op.conv,
                x: op.x,
                w,
                dy: &*d_y,
                dw: op.dw,
                db: op.db,
                dx,
            };
            run(backend, backward, B::conv2d_backward)
        }
        None => {
            let filter = Conv2dBackwardFilter {
                shape: op.conv,
                x: op.x,
                dy: &*d_y,
                dw: op.dw,
                db: Some(op.db),
            };
            run(backend, filter, B::conv2d_backward_filter)
        }
    }
}

/// [`BackendImpl::conv2d_relu_avg_pool_forward`] unfused: the convolution with its ReLU, then
/// the pool reading `y` back (the default, and a fusing backend's way for shapes it does not
/// fuse).
pub(super) fn conv_relu_then_pool<B: BackendImpl, T: Precision>(
    backend: &B,
    op: Checked<Conv2dReluAvgPoolForward<'_, B, T>>,
) -> OpResult {
    let op = op.into_inner();
    let relu = true;
    let forward = Conv2dForward {
        shape: op.conv,
        x: op.x,
        w: op.w,
        bias: op.bias,
        y: &mut *op.y,
        relu,
    };
    run(backend, forward, B::conv2d_forward)?;
    let pooling = AvgPoolForward {
        shape: op.pool,
        x: &*op.y,
        y: op.pooled,
    };
    run(backend, pooling, B::avg_pool_forward)
}

/// [`BackendImpl::softmax_head`] unfused: the layer's GEMM, the softmax cross-entropy, the
/// shard's statistics, then the weight gradient's GEMM, the bias gradient, the input
/// gradient's GEMM, the ReLU's backward and the bias gradient below (the default, and a fusing backend's way for
/// shapes it does not fuse). The correct count and the input gradient before the ReLU are
/// workspace allocated here.
pub(super) fn head_unfused<B: BackendImpl, T: Precision>(
    backend: &B,
    op: Checked<SoftmaxHead<'_, B, T>>,
) -> OpResult {
    let op = op.into_inner();
    let (rows, hidden, classes) = (op.rows, op.hidden, op.classes);
    let forward = Gemm {
        shape: &GemmShape {
            m: rows,
            n: classes,
            k: hidden,
            trans_a: false,
            trans_b: true,
        },
        a: op.h,
        b: op.w,
        bias: Some(op.b),
        c: &mut *op.logits,
        epilogue: Epilogue::default(),
    };
    run(backend, forward, B::gemm)?;
    let mut correct = backend.alloc_zeros::<i32>(1)?;
    let mut grad = op.grad;
    let grad_scale = grad.as_ref().map_or(0.0, |g| g.grad_scale);
    let at = grad.as_ref().and_then(|g| g.at);
    let loss = SoftmaxCrossEntropy {
        rows,
        classes,
        logits: &*op.logits,
        labels: op.labels,
        loss: &mut *op.loss,
        grad: grad.as_mut().map(|g| &mut *g.d_logits),
        correct: &mut correct,
        grad_scale,
        at,
    };
    run(backend, loss, B::softmax_cross_entropy)?;
    let stats = ShardStats {
        loss: &*op.loss,
        correct: &mut correct,
        out: op.stats,
        accumulate: op.accumulate,
    };
    run(backend, stats, B::shard_stats)?;
    let Some(g) = grad else {
        return Ok(());
    };
    let weight = Gemm {
        shape: &GemmShape {
            m: classes,
            n: hidden,
            k: rows,
            trans_a: true,
            trans_b: false,
        },
        a: &*g.d_logits,
        b: op.h,
        bias: None,
        c: g.dw,
        epilogue: Epilogue::default(),
    };
    run(backend, weight, B::gemm)?;
    let bias = Conv2dBackwardBias {
        shape: &Conv2dShape::columns(rows, classes),
        dy: &*g.d_logits,
        db: g.db,
    };
    run(backend, bias, B::conv2d_backward_bias)?;
    let mut before_relu = backend.alloc_zeros::<T>(rows * hidden)?;
    let input = Gemm {
        shape: &GemmShape {
            m: rows,
            n: hidden,
            k: classes,
            trans_a: false,
            trans_b: false,
        },
        a: &*g.d_logits,
        b: op.w,
        bias: None,
        c: &mut before_relu,
        epilogue: Epilogue::default(),
    };
    run(backend, input, B::gemm)?;
    let relu = ReluBackward {
        y: op.h,
        dy: &before_relu,
        dx: &mut *g.dh,
    };
    run(backend, relu, B::relu_backward)?;
    let below = Conv2dBackwardBias {
        shape: &Conv2dShape::columns(rows, hidden),
        dy: &*g.dh,
        db: g.dh_bias,
    };
    run(backend, below, B::conv2d_backward_bias)
}

/// Checks `args` and runs `op` on them: how the fused defaults call their parts (the checks
/// cost a few comparisons, next to a kernel launch).
pub(super) fn run<B: BackendImpl, A: Args>(
    backend: &B,
    args: A,
    op: impl FnOnce(&B, Checked<A>) -> OpResult,
) -> OpResult {
    op(backend, Checked::new(args)?)
}
