//! The shape and buffer-length checks of every [`Backend`](super::Backend) operation. They
//! run once, in [`Backend`](super::Backend)'s implementation above every backend, so a
//! wrong call fails the same way (and before any work) on all of them, and a new backend
//! cannot forget one.

use super::shapes::{Conv2dShape, GemmShape, Pool2dShape};
use super::BackendError;
use crate::dtype::DType;

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

/// The buffer lengths of a softmax cross-entropy call.
pub(crate) struct SoftmaxLengths {
    pub(crate) logits: usize,
    pub(crate) labels: usize,
    pub(crate) loss: usize,
    pub(crate) grad: Option<usize>,
    pub(crate) correct: usize,
}

/// Validates a softmax cross-entropy call (sizes the kernels index with 32-bit ints).
pub(crate) fn softmax(
    rows: usize,
    classes: usize,
    lengths: SoftmaxLengths,
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
    let buffers = [
        ("logits", lengths.logits, rows * classes),
        ("labels", lengths.labels, rows),
        ("loss", lengths.loss, rows),
        ("correct", lengths.correct, 1),
    ];
    let grad = lengths.grad.map(|g| ("grad", g, rows * classes));
    buffer_lengths(op, buffers.into_iter().chain(grad))
}

/// The buffer lengths of an SGD step.
pub(crate) struct SgdLengths {
    pub(crate) weights: usize,
    pub(crate) grad: usize,
    pub(crate) velocity: Option<usize>,
    pub(crate) w_copy: Option<usize>,
    pub(crate) found: Option<usize>,
}

/// Validates an SGD step: every per-weight buffer as long as the weights, `found` one flag.
pub(crate) fn sgd(lengths: SgdLengths) -> Result<(), BackendError> {
    let n = lengths.weights;
    let optional = [
        lengths.velocity.map(|v| ("velocity", v, n)),
        lengths.w_copy.map(|h| ("w_copy", h, n)),
        lengths.found.map(|f| ("found", f, 1)),
    ];
    buffer_lengths(
        "sgd_step",
        [("grad", lengths.grad, n)]
            .into_iter()
            .chain(optional.into_iter().flatten()),
    )
}

/// Checks each `(buffer, length, expected length)` of `op`, in order.
fn buffer_lengths(
    op: &'static str,
    buffers: impl IntoIterator<Item = (&'static str, usize, usize)>,
) -> Result<(), BackendError> {
    buffers
        .into_iter()
        .try_for_each(|(name, got, expected)| expect_len(op, name, got, expected))
}

/// Which of a convolution's tensors a buffer holds (its gradient has the same length).
#[derive(Clone, Copy)]
pub(crate) enum ConvTensor {
    /// The input, batch x in_c x in_h x in_w.
    Input,
    /// The filters, out_c x in_c x k_h x k_w.
    Filter,
    /// The output, batch x out_c x out_h x out_w.
    Output,
    /// The bias, out_c.
    Bias,
}

/// Validates a convolution's shape and each `(buffer, length, tensor it holds)` of `op`.
pub(crate) fn conv<const N: usize>(
    op: &'static str,
    s: &Conv2dShape,
    buffers: [(&'static str, usize, ConvTensor); N],
) -> Result<(), BackendError> {
    s.validate()?;
    let (xs, ws, ys) = s.sizes();
    let expected = |tensor| match tensor {
        ConvTensor::Input => xs,
        ConvTensor::Filter => ws,
        ConvTensor::Output => ys,
        ConvTensor::Bias => s.out_c,
    };
    buffer_lengths(
        op,
        buffers.map(|(name, got, tensor)| (name, got, expected(tensor))),
    )
}

/// Validates that `pool` pools exactly the planes `conv` produces.
pub(crate) fn conv_then_pool(conv: &Conv2dShape, pool: &Pool2dShape) -> Result<(), BackendError> {
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
/// index buffer.
pub(crate) fn pool(
    op: &'static str,
    s: &Pool2dShape,
    input: usize,
    output: usize,
    argmax: Option<usize>,
) -> Result<(), BackendError> {
    s.validate()?;
    let (xs, ys) = s.sizes();
    let (x, y) = if op.ends_with("forward") {
        ("x", "y")
    } else {
        ("dx", "dy")
    };
    let argmax = argmax.map(|a| ("argmax", a, ys));
    buffer_lengths(
        op,
        [(x, input, xs), (y, output, ys)].into_iter().chain(argmax),
    )
}

/// Validates a GEMM call: `a` is m x k, `b` k x n, `c` m x n, `bias` n.
pub(crate) fn gemm(
    shape: &GemmShape,
    a: usize,
    b: usize,
    c: usize,
    bias: Option<usize>,
) -> Result<(), BackendError> {
    shape.validate()?;
    let (m, n, k) = (shape.m, shape.n, shape.k);
    let bias = bias.map(|b| ("bias", b, n));
    let buffers = [("a", a, m * k), ("b", b, k * n), ("c", c, m * n)];
    buffer_lengths("gemm", buffers.into_iter().chain(bias))
}

/// Validates a GEMM's element types (inputs `a`, result `c`): a pair some kernel implements.
pub(crate) fn gemm_types(a: DType, c: DType) -> Result<(), BackendError> {
    super::precision::gemm_kernels(a, c).map(|_| ())
}
