//! [`BackendImpl`]: what a backend provides so that it is a [`Backend`](super::Backend).
//!
//! Each method does what the [`Backend`](super::Backend) method of the same name documents,
//! given that operation's arguments as a [`Checked`] struct ([`super::op`]): an
//! implementation may index by the shape without checking again. The fused operations have
//! defaults built from the plain ones (what the kernel devices use); a backend overrides
//! them where fusing pays (the CPU backend does for all four). Workspace a default needs is
//! allocated here, from the backend itself, not passed in by every caller.

use super::op::{
    Add, Args, AvgPoolBackward, AvgPoolForward, AvgPoolReluBackward, Axpy, Cast, Checked,
    Conv2dBackward, Conv2dBackwardBias, Conv2dBackwardFilter, Conv2dBackwardInput, Conv2dForward,
    Conv2dReluAvgPoolBackward, Conv2dReluAvgPoolForward, Fill, GatherBatch, Gemm, GradCheck,
    GradCheckMany, MaxPoolBackward, MaxPoolForward, ReluBackward, Scale, Sgd, SgdMany, ShardStats,
    SoftmaxCrossEntropy, StepBegin, StepEnd,
};
use super::precision::Precision;
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

/// Checks `args` and runs `op` on them: how the fused defaults call their parts (the checks
/// cost a few comparisons, next to a kernel launch).
pub(super) fn run<B: BackendImpl, A: Args>(
    backend: &B,
    args: A,
    op: impl FnOnce(&B, Checked<A>) -> OpResult,
) -> OpResult {
    op(backend, Checked::new(args)?)
}
