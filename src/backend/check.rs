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
    expect_len(op, "logits", lengths.logits, rows * classes)?;
    expect_len(op, "labels", lengths.labels, rows)?;
    expect_len(op, "loss", lengths.loss, rows)?;
    expect_len(op, "correct", lengths.correct, 1)?;
    if let Some(g) = lengths.grad {
        expect_len(op, "grad", g, rows * classes)?;
    }
    Ok(())
}

/// The buffer lengths of an SGD step.
pub(crate) struct SgdLengths {
    pub(crate) weights: usize,
    pub(crate) grad: usize,
    pub(crate) velocity: Option<usize>,
    pub(crate) w_half: Option<usize>,
    pub(crate) found: Option<usize>,
}

/// Validates an SGD step: every per-weight buffer as long as the weights, `found` one flag.
pub(crate) fn sgd(lengths: SgdLengths) -> Result<(), BackendError> {
    let n = lengths.weights;
    expect_len("sgd_step", "grad", lengths.grad, n)?;
    if let Some(v) = lengths.velocity {
        expect_len("sgd_step", "velocity", v, n)?;
    }
    if let Some(h) = lengths.w_half {
        expect_len("sgd_step", "w_half", h, n)?;
    }
    if let Some(f) = lengths.found {
        expect_len("sgd_step", "found", f, 1)?;
    }
    Ok(())
}

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

/// Validates a convolution's filter-gradient call.
pub(crate) fn conv_backward_filter(
    s: &Conv2dShape,
    x: usize,
    dy: usize,
    dw: usize,
) -> Result<(), BackendError> {
    s.validate()?;
    let (xs, ws, ys) = s.sizes();
    expect_len("conv2d_backward_filter", "x", x, xs)?;
    expect_len("conv2d_backward_filter", "dy", dy, ys)?;
    expect_len("conv2d_backward_filter", "dw", dw, ws)
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
    let forward = op.ends_with("forward");
    expect_len(op, if forward { "x" } else { "dx" }, input, xs)?;
    expect_len(op, if forward { "y" } else { "dy" }, output, ys)?;
    if let Some(a) = argmax {
        expect_len(op, "argmax", a, ys)?;
    }
    Ok(())
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
    expect_len("gemm", "a", a, shape.m * shape.k)?;
    expect_len("gemm", "b", b, shape.k * shape.n)?;
    expect_len("gemm", "c", c, shape.m * shape.n)?;
    if let Some(bias) = bias {
        expect_len("gemm", "bias", bias, shape.n)?;
    }
    Ok(())
}

/// Validates a GEMM's element types (inputs `a`, result `c`): a pair some kernel implements.
pub(crate) fn gemm_types(a: DType, c: DType) -> Result<(), BackendError> {
    super::precision::gemm_kernel(a, c).map(|_| ())
}
