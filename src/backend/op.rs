//! Each [`Backend`](super::Backend) operation's arguments as one struct, and [`Checked`]:
//! arguments that passed their operation's checks.
//!
//! [`BackendImpl`](super::BackendImpl) takes its arguments only as `Checked<…>`, and the one
//! way to make a `Checked` is [`Checked::new`], which runs the checks. So an implementation
//! may index by the shape without checking again: a kernel device launches with the checked
//! lengths as the kernel's bounds, and the type system, not a comment, says they were
//! checked. Each struct's fields are the parameters of the [`Backend`](super::Backend)
//! method of the same name (`Conv2dForward` for `conv2d_forward`), documented there.

// The fields are the parameters of the `Backend` methods, documented there once.
#![allow(missing_docs)]

use std::ops::Deref;

use super::check::{self, ConvTensor::*};
use super::precision::Precision;
use super::shapes::{fits_i32, Conv2dShape, Epilogue, GemmShape, Pool2dShape, SgdStep};
use super::step::{StepScalars, TensorTable, RECORD, STATS};
use super::{BackendError, DeviceBuffer, DeviceScalar, Memory};
use crate::kernels::Scalar;

type Buf<B, T> = <B as Memory>::Buffer<T>;

/// A convolution's input, filter and bias.
pub(crate) type ConvOperands<'a, B, T> = (&'a Buf<B, T>, &'a Buf<B, T>, Option<&'a Buf<B, f32>>);

/// A convolution's filter and the buffer its input gradient goes to, for the backward passes
/// that compute one.
pub type InputGradient<'a, B, T> = (&'a Buf<B, T>, &'a mut Buf<B, T>);

/// An operation's arguments, with the checks they must pass before a backend runs them.
pub trait Args {
    /// Checks the shape, and every buffer's length against it.
    fn check(&self) -> Result<(), BackendError>;
}

/// Arguments `A` that passed [`Args::check`]. The buffers stay borrowed inside, so their
/// lengths cannot change between the check and the backend's use of them.
#[derive(Debug)]
pub struct Checked<A>(A);

impl<A: Args> Checked<A> {
    /// Checks `args` ([`BackendError::BadShape`], [`BackendError::BufferSize`],
    /// [`BackendError::LengthMismatch`] or [`BackendError::Unsupported`] when they fail).
    pub fn new(args: A) -> Result<Self, BackendError> {
        args.check()?;
        Ok(Checked(args))
    }
}

impl<A> Checked<A> {
    /// The arguments, to take apart.
    pub fn into_inner(self) -> A {
        self.0
    }
}

impl<A> Deref for Checked<A> {
    type Target = A;

    fn deref(&self) -> &A {
        &self.0
    }
}

fn len<B: Memory, T: DeviceScalar>(buf: &Buf<B, T>) -> usize {
    buf.len()
}

/// The checks of a convolution's forward pass (`bias` optional).
fn conv_forward(
    op: &'static str,
    shape: &Conv2dShape,
    [x, w, y]: [usize; 3],
    bias: Option<usize>,
) -> Result<(), BackendError> {
    let bias = bias.map(|b| ("bias", b, Bias));
    let buffers = [("x", x, Input), ("w", w, Filter), ("y", y, Output)];
    match bias {
        Some(bias) => check::conv(op, shape, [buffers[0], buffers[1], buffers[2], bias]),
        None => check::conv(op, shape, buffers),
    }
}

/// The checks of a convolution's filter gradient, and of its bias gradient (of length `db`)
/// when there is one: `dy` is the gradient at the convolution's output.
fn filter_gradients(
    shape: &Conv2dShape,
    [x, dy, dw]: [usize; 3],
    db: Option<usize>,
) -> Result<(), BackendError> {
    let buffers = [("x", x, Input), ("dy", dy, Output), ("dw", dw, Filter)];
    check::conv("conv2d_backward_filter", shape, buffers)?;
    match db {
        Some(db) => check::conv(
            "conv2d_backward_bias",
            shape,
            [("dy", dy, Output), ("db", db, Bias)],
        ),
        None => Ok(()),
    }
}

/// [`Backend::fill`](super::Backend::fill)'s arguments.
pub struct Fill<'a, B: Memory> {
    pub out: &'a mut Buf<B, f32>,
    pub value: f32,
}

impl<B: Memory> Args for Fill<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// [`Backend::scale`](super::Backend::scale)'s arguments.
pub struct Scale<'a, B: Memory> {
    pub x: &'a mut Buf<B, f32>,
    pub alpha: f32,
}

impl<B: Memory> Args for Scale<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// [`Backend::axpy`](super::Backend::axpy)'s arguments.
pub struct Axpy<'a, B: Memory> {
    pub alpha: f32,
    pub x: &'a Buf<B, f32>,
    pub y: &'a mut Buf<B, f32>,
}

impl<B: Memory> Args for Axpy<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        check::same_len("axpy", self.x.len(), self.y.len())
    }
}

/// [`Backend::add`](super::Backend::add)'s arguments.
pub struct Add<'a, B: Memory> {
    pub a: &'a Buf<B, f32>,
    pub b: &'a Buf<B, f32>,
    pub out: &'a mut Buf<B, f32>,
}

impl<B: Memory> Args for Add<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        check::same_len("add", self.a.len(), self.b.len())?;
        check::same_len("add", self.a.len(), self.out.len())
    }
}

/// The arguments of [`Backend::cast_from_f32`](super::Backend::cast_from_f32) (`S` = f32)
/// and [`Backend::cast_to_f32`](super::Backend::cast_to_f32) (`D` = f32).
pub struct Cast<'a, B: Memory, S: DeviceScalar, D: DeviceScalar> {
    pub x: &'a Buf<B, S>,
    pub out: &'a mut Buf<B, D>,
}

impl<B: Memory, S: DeviceScalar, D: DeviceScalar> Args for Cast<'_, B, S, D> {
    fn check(&self) -> Result<(), BackendError> {
        let op = if S::SCALAR == Scalar::F32 {
            "cast_from_f32"
        } else {
            "cast_to_f32"
        };
        check::same_len(op, self.x.len(), self.out.len())
    }
}

/// [`Backend::relu_backward`](super::Backend::relu_backward)'s arguments.
pub struct ReluBackward<'a, B: Memory, T: DeviceScalar> {
    pub y: &'a Buf<B, T>,
    pub dy: &'a Buf<B, T>,
    pub dx: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for ReluBackward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        check::same_len("relu_backward", self.y.len(), self.dy.len())?;
        check::same_len("relu_backward", self.y.len(), self.dx.len())
    }
}

/// [`Backend::gemm`](super::Backend::gemm)'s arguments: inputs of type `A`, result `O`.
pub struct Gemm<'a, B: Memory, A: DeviceScalar, O: DeviceScalar> {
    pub shape: &'a GemmShape,
    pub a: &'a Buf<B, A>,
    pub b: &'a Buf<B, A>,
    pub bias: Option<&'a Buf<B, f32>>,
    pub c: &'a mut Buf<B, O>,
    pub epilogue: Epilogue,
}

impl<B: Memory, A: Precision, O: Precision> Args for Gemm<'_, B, A, O> {
    fn check(&self) -> Result<(), BackendError> {
        check::gemm_types(A::DTYPE, O::DTYPE)?;
        let bias = self.bias.map(len::<B, _>);
        check::gemm(self.shape, self.a.len(), self.b.len(), self.c.len(), bias)
    }
}

/// [`Backend::conv2d_forward`](super::Backend::conv2d_forward)'s arguments.
pub struct Conv2dForward<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Conv2dShape,
    pub x: &'a Buf<B, T>,
    pub w: &'a Buf<B, T>,
    pub bias: Option<&'a Buf<B, f32>>,
    pub y: &'a mut Buf<B, T>,
    pub relu: bool,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dForward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        conv_forward(
            "conv2d_forward",
            self.shape,
            [self.x.len(), self.w.len(), self.y.len()],
            self.bias.map(len::<B, _>),
        )
    }
}

/// [`Backend::conv2d_backward_input`](super::Backend::conv2d_backward_input)'s arguments.
pub struct Conv2dBackwardInput<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Conv2dShape,
    pub dy: &'a Buf<B, T>,
    pub w: &'a Buf<B, T>,
    pub dx: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dBackwardInput<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let (dy, w, dx) = (self.dy.len(), self.w.len(), self.dx.len());
        let buffers = [("dy", dy, Output), ("w", w, Filter), ("dx", dx, Input)];
        check::conv("conv2d_backward_input", self.shape, buffers)
    }
}

/// The arguments of [`Backend::conv2d_backward_filter`](super::Backend::conv2d_backward_filter)
/// (`db` is `None`) and of
/// [`Backend::conv2d_backward_filter_bias`](super::Backend::conv2d_backward_filter_bias).
pub struct Conv2dBackwardFilter<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Conv2dShape,
    pub x: &'a Buf<B, T>,
    pub dy: &'a Buf<B, T>,
    pub dw: &'a mut Buf<B, f32>,
    pub db: Option<&'a mut Buf<B, f32>>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dBackwardFilter<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let db = self.db.as_deref().map(len::<B, _>);
        filter_gradients(self.shape, [self.x.len(), self.dy.len(), self.dw.len()], db)
    }
}

/// [`Backend::conv2d_backward_bias`](super::Backend::conv2d_backward_bias)'s arguments.
pub struct Conv2dBackwardBias<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Conv2dShape,
    pub dy: &'a Buf<B, T>,
    pub db: &'a mut Buf<B, f32>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dBackwardBias<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let buffers = [("dy", self.dy.len(), Output), ("db", self.db.len(), Bias)];
        check::conv("conv2d_backward_bias", self.shape, buffers)
    }
}

/// [`Backend::conv2d_backward`](super::Backend::conv2d_backward)'s arguments.
pub struct Conv2dBackward<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Conv2dShape,
    pub x: &'a Buf<B, T>,
    pub w: &'a Buf<B, T>,
    pub dy: &'a Buf<B, T>,
    pub dw: &'a mut Buf<B, f32>,
    pub db: &'a mut Buf<B, f32>,
    pub dx: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dBackward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        filter_gradients(
            self.shape,
            [self.x.len(), self.dy.len(), self.dw.len()],
            Some(self.db.len()),
        )?;
        let (dy, w, dx) = (self.dy.len(), self.w.len(), self.dx.len());
        let buffers = [("dy", dy, Output), ("w", w, Filter), ("dx", dx, Input)];
        check::conv("conv2d_backward_input", self.shape, buffers)
    }
}

/// [`Backend::max_pool_forward`](super::Backend::max_pool_forward)'s arguments.
pub struct MaxPoolForward<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Pool2dShape,
    pub x: &'a Buf<B, T>,
    pub y: &'a mut Buf<B, T>,
    pub argmax: &'a mut Buf<B, i32>,
}

impl<B: Memory, T: DeviceScalar> Args for MaxPoolForward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let (x, y, argmax) = (self.x.len(), self.y.len(), Some(self.argmax.len()));
        check::pool("max_pool_forward", self.shape, x, y, argmax)
    }
}

/// [`Backend::max_pool_backward`](super::Backend::max_pool_backward)'s arguments.
pub struct MaxPoolBackward<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Pool2dShape,
    pub dy: &'a Buf<B, T>,
    pub argmax: &'a Buf<B, i32>,
    pub dx: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for MaxPoolBackward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let (dx, dy, argmax) = (self.dx.len(), self.dy.len(), Some(self.argmax.len()));
        check::pool("max_pool_backward", self.shape, dx, dy, argmax)
    }
}

/// [`Backend::avg_pool_forward`](super::Backend::avg_pool_forward)'s arguments.
pub struct AvgPoolForward<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Pool2dShape,
    pub x: &'a Buf<B, T>,
    pub y: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for AvgPoolForward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        check::pool(
            "avg_pool_forward",
            self.shape,
            self.x.len(),
            self.y.len(),
            None,
        )
    }
}

/// [`Backend::avg_pool_backward`](super::Backend::avg_pool_backward)'s arguments.
pub struct AvgPoolBackward<'a, B: Memory, T: DeviceScalar> {
    pub shape: &'a Pool2dShape,
    pub dy: &'a Buf<B, T>,
    pub dx: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for AvgPoolBackward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        check::pool(
            "avg_pool_backward",
            self.shape,
            self.dx.len(),
            self.dy.len(),
            None,
        )
    }
}

/// The arguments of
/// [`Backend::conv2d_relu_avg_pool_forward`](super::Backend::conv2d_relu_avg_pool_forward).
pub struct Conv2dReluAvgPoolForward<'a, B: Memory, T: DeviceScalar> {
    pub conv: &'a Conv2dShape,
    pub pool: &'a Pool2dShape,
    pub x: &'a Buf<B, T>,
    pub w: &'a Buf<B, T>,
    pub bias: Option<&'a Buf<B, f32>>,
    pub y: &'a mut Buf<B, T>,
    pub pooled: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dReluAvgPoolForward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let (operands, y) = ((self.x, self.w, self.bias), Some(self.y.len()));
        let pooled = ("avg_pool_forward", self.pooled.len());
        fused_forward::<B, T>((self.conv, self.pool), operands, y, pooled).map(drop)
    }
}

/// The checks of a convolution with its ReLU and pool: its operands, `y` (of length `y`, or
/// where it is not kept, None: the shape's), and the pool's output or its gradient
/// (`pooled`: the pool operation's name and the length). Returns y's length.
fn fused_forward<B: Memory, T: DeviceScalar>(
    (conv, pool): (&Conv2dShape, &Pool2dShape),
    (x, w, bias): ConvOperands<'_, B, T>,
    y: Option<usize>,
    pooled: (&'static str, usize),
) -> Result<usize, BackendError> {
    check::conv_then_pool(conv, pool)?;
    let y = y.unwrap_or(conv.sizes().2);
    conv_forward(
        "conv2d_forward",
        conv,
        [x.len(), w.len(), y],
        bias.map(len::<B, _>),
    )?;
    check::pool(pooled.0, pool, y, pooled.1, None)?;
    Ok(y)
}

/// [`Backend::avg_pool_relu_backward`](super::Backend::avg_pool_relu_backward)'s arguments.
pub struct AvgPoolReluBackward<'a, B: Memory, T: DeviceScalar> {
    pub pool: &'a Pool2dShape,
    pub d_pooled: &'a Buf<B, T>,
    pub y: &'a Buf<B, T>,
    pub dx: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for AvgPoolReluBackward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let (d_pooled, dx) = (self.d_pooled.len(), self.dx.len());
        check::pool("avg_pool_backward", self.pool, dx, d_pooled, None)?;
        check::same_len("relu_backward", self.y.len(), dx)
    }
}

/// The arguments of
/// [`Backend::conv2d_relu_avg_pool_backward`](super::Backend::conv2d_relu_avg_pool_backward).
pub struct Conv2dReluAvgPoolBackward<'a, B: Memory, T: DeviceScalar> {
    pub conv: &'a Conv2dShape,
    pub pool: &'a Pool2dShape,
    pub x: &'a Buf<B, T>,
    pub y: &'a Buf<B, T>,
    pub d_pooled: &'a Buf<B, T>,
    pub dw: &'a mut Buf<B, f32>,
    pub db: &'a mut Buf<B, f32>,
    /// The filter and where the input gradient goes, when it is wanted.
    pub input: Option<InputGradient<'a, B, T>>,
    /// The size of `y`: where a backend that does not fuse holds the conv's output gradient.
    pub workspace: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dReluAvgPoolBackward<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        check::conv_then_pool(self.conv, self.pool)?;
        filter_gradients(
            self.conv,
            [self.x.len(), self.y.len(), self.dw.len()],
            Some(self.db.len()),
        )?;
        let (y, d_pooled) = (self.y.len(), self.d_pooled.len());
        check::pool("avg_pool_backward", self.pool, y, d_pooled, None)?;
        if let Some((w, dx)) = &self.input {
            let buffers = [
                ("dy", y, Output),
                ("w", w.len(), Filter),
                ("dx", dx.len(), Input),
            ];
            check::conv("conv2d_backward_input", self.conv, buffers)?;
        }
        check::same_len(
            "conv2d_relu_avg_pool_backward workspace",
            self.workspace.len(),
            y,
        )
    }
}

/// [`Backend::conv2d_relu_avg_pool_forward_pooled`](super::Backend::conv2d_relu_avg_pool_forward_pooled)'s
/// arguments.
pub struct Conv2dReluAvgPoolForwardPooled<'a, B: Memory, T: DeviceScalar> {
    pub conv: &'a Conv2dShape,
    pub pool: &'a Pool2dShape,
    pub x: &'a Buf<B, T>,
    pub w: &'a Buf<B, T>,
    pub bias: Option<&'a Buf<B, f32>>,
    pub pooled: &'a mut Buf<B, T>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dReluAvgPoolForwardPooled<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let pooled = ("avg_pool_forward", self.pooled.len());
        let operands = (self.x, self.w, self.bias);
        fused_forward::<B, T>((self.conv, self.pool), operands, None, pooled).map(drop)
    }
}

/// [`Backend::conv2d_relu_avg_pool_backward_recomputed`](super::Backend::conv2d_relu_avg_pool_backward_recomputed)'s
/// arguments.
pub struct Conv2dReluAvgPoolBackwardRecomputed<'a, B: Memory, T: DeviceScalar> {
    pub conv: &'a Conv2dShape,
    pub pool: &'a Pool2dShape,
    pub x: &'a Buf<B, T>,
    pub w: &'a Buf<B, T>,
    pub bias: Option<&'a Buf<B, f32>>,
    pub d_pooled: &'a Buf<B, T>,
    pub dw: &'a mut Buf<B, f32>,
    pub db: &'a mut Buf<B, f32>,
}

impl<B: Memory, T: DeviceScalar> Args for Conv2dReluAvgPoolBackwardRecomputed<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let d_pooled = ("avg_pool_backward", self.d_pooled.len());
        let operands = (self.x, self.w, self.bias);
        let y = fused_forward::<B, T>((self.conv, self.pool), operands, None, d_pooled)?;
        filter_gradients(
            self.conv,
            [self.x.len(), y, self.dw.len()],
            Some(self.db.len()),
        )
    }
}

/// [`Backend::softmax_cross_entropy`](super::Backend::softmax_cross_entropy)'s arguments.
pub struct SoftmaxCrossEntropy<'a, B: Memory, T: DeviceScalar> {
    pub rows: usize,
    pub classes: usize,
    pub logits: &'a Buf<B, T>,
    pub labels: &'a Buf<B, u8>,
    pub loss: &'a mut Buf<B, f32>,
    pub grad: Option<&'a mut Buf<B, T>>,
    pub correct: &'a mut Buf<B, i32>,
    pub grad_scale: f32,
    pub at: Option<&'a StepScalars<B>>,
}

impl<B: Memory, T: DeviceScalar> Args for SoftmaxCrossEntropy<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        let lengths = check::SoftmaxLengths {
            logits: self.logits.len(),
            labels: self.labels.len(),
            loss: self.loss.len(),
            grad: self.grad.as_deref().map(len::<B, _>),
            correct: self.correct.len(),
        };
        if let Some(at) = self.at {
            at.check("softmax_cross_entropy")?;
        }
        check::softmax(self.rows, self.classes, lengths)
    }
}

/// The backward half of [`Backend::softmax_head`](super::Backend::softmax_head): the
/// factor on the logits' gradient and the buffers the gradients go to.
pub struct HeadGradient<'a, B: Memory, T: DeviceScalar> {
    /// The logits' gradient's factor, as
    /// [`Backend::softmax_cross_entropy`](super::Backend::softmax_cross_entropy)'s
    /// `grad_scale`; with `at`, read from `at.grad_scale` on the device instead.
    pub grad_scale: f32,
    /// Where the device holds the factor, if it does.
    pub at: Option<&'a StepScalars<B>>,
    /// The logits' gradient (rows x classes).
    pub d_logits: &'a mut Buf<B, T>,
    /// The layer's weight gradient (classes x hidden).
    pub dw: &'a mut Buf<B, f32>,
    /// The layer's bias gradient (classes).
    pub db: &'a mut Buf<B, f32>,
    /// The input's gradient through the ReLU that made it (rows x hidden).
    pub dh: &'a mut Buf<B, T>,
    /// `dh` summed over the rows (hidden): the bias gradient of the layer that made `h`.
    pub dh_bias: &'a mut Buf<B, f32>,
}

/// [`Backend::softmax_head`](super::Backend::softmax_head)'s arguments.
pub struct SoftmaxHead<'a, B: Memory, T: DeviceScalar> {
    pub rows: usize,
    pub hidden: usize,
    pub classes: usize,
    pub h: &'a Buf<B, T>,
    pub w: &'a Buf<B, T>,
    pub b: &'a Buf<B, f32>,
    pub labels: &'a Buf<B, u8>,
    pub logits: &'a mut Buf<B, T>,
    pub loss: &'a mut Buf<B, f32>,
    pub stats: &'a mut Buf<B, f32>,
    pub accumulate: bool,
    pub grad: Option<HeadGradient<'a, B, T>>,
}

impl<B: Memory, T: DeviceScalar> Args for SoftmaxHead<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        const OP: &str = "softmax_head";
        let (rows, hidden, classes) = (self.rows, self.hidden, self.classes);
        let fits = |a: usize, b: usize| a.checked_mul(b).is_some_and(|n| n <= i32::MAX as usize);
        if rows == 0
            || hidden == 0
            || classes == 0
            || !fits(rows, hidden.max(classes))
            || !fits(classes, hidden)
        {
            return Err(BackendError::BadShape {
                op: OP,
                detail: format!("{rows} rows x {hidden} inputs x {classes} classes"),
            });
        }
        let mut buffers = vec![
            ("h", self.h.len(), rows * hidden),
            ("w", self.w.len(), classes * hidden),
            ("b", self.b.len(), classes),
            ("labels", self.labels.len(), rows),
            ("logits", self.logits.len(), rows * classes),
            ("loss", self.loss.len(), rows),
            ("stats", self.stats.len(), STATS),
        ];
        if let Some(g) = &self.grad {
            if let Some(at) = g.at {
                at.check(OP)?;
            }
            buffers.extend([
                ("d_logits", g.d_logits.len(), rows * classes),
                ("dw", g.dw.len(), classes * hidden),
                ("db", g.db.len(), classes),
                ("dh", g.dh.len(), rows * hidden),
                ("dh_bias", g.dh_bias.len(), hidden),
            ]);
        }
        buffers
            .into_iter()
            .try_for_each(|(name, got, expected)| check::expect_len(OP, name, got, expected))
    }
}

/// [`Backend::grad_check`](super::Backend::grad_check)'s arguments.
pub struct GradCheck<'a, B: Memory, G: DeviceScalar> {
    pub grad: &'a Buf<B, G>,
    pub found: &'a mut Buf<B, i32>,
}

impl<B: Memory, G: DeviceScalar> Args for GradCheck<'_, B, G> {
    fn check(&self) -> Result<(), BackendError> {
        check::expect_len("grad_check", "found", self.found.len(), 1)
    }
}

/// [`Backend::sgd_step`](super::Backend::sgd_step)'s arguments (`step` holds the
/// hyperparameters).
pub struct Sgd<'a, B: Memory, T: DeviceScalar> {
    pub w: &'a mut Buf<B, f32>,
    pub grad: &'a Buf<B, f32>,
    pub velocity: Option<&'a mut Buf<B, f32>>,
    pub w_copy: Option<&'a mut Buf<B, T>>,
    pub step: SgdStep,
    pub at: Option<&'a StepScalars<B>>,
    pub found: Option<&'a Buf<B, i32>>,
}

impl<B: Memory, T: DeviceScalar> Args for Sgd<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        if let Some(at) = self.at {
            at.check("sgd_step")?;
        }
        check::sgd(check::SgdLengths {
            weights: self.w.len(),
            grad: self.grad.len(),
            velocity: self.velocity.as_deref().map(len::<B, _>),
            w_copy: self.w_copy.as_deref().map(len::<B, _>),
            found: self.found.map(len::<B, _>),
        })
    }
}

/// The checks every step operation shares: `name` holds exactly one element.
fn one(op: &'static str, name: &'static str, got: usize) -> Result<(), BackendError> {
    check::expect_len(op, name, got, 1)
}

/// [`Backend::gather_batch`](super::Backend::gather_batch)'s arguments.
pub struct GatherBatch<'a, B: Memory, T: DeviceScalar> {
    pub pixels: &'a Buf<B, u8>,
    pub labels: &'a Buf<B, u8>,
    pub order: &'a Buf<B, u32>,
    pub batch: &'a Buf<B, u32>,
    pub shard: usize,
    pub x: &'a mut Buf<B, T>,
    pub y: &'a mut Buf<B, u8>,
}

impl<B: Memory, T: DeviceScalar> GatherBatch<'_, B, T> {
    /// Bytes per image: the data set's pixels over its images.
    pub fn image(&self) -> usize {
        self.pixels.len() / self.labels.len().max(1)
    }
}

impl<B: Memory, T: DeviceScalar> Args for GatherBatch<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        const OP: &str = "gather_batch";
        let (count, n) = (self.labels.len(), self.y.len());
        if count == 0 || self.pixels.len() % count != 0 {
            return Err(BackendError::BadShape {
                op: OP,
                detail: format!(
                    "{} pixels do not make {count} images of one size",
                    self.pixels.len()
                ),
            });
        }
        check::expect_len(OP, "x", self.x.len(), n * self.image())?;
        one(OP, "batch", self.batch.len())?;
        fits_i32(OP, "the image size", self.image())?;
        fits_i32(OP, "the shard", self.shard)?;
        fits_i32(OP, "the batch", n).map(drop)
    }
}

/// [`Backend::step_begin`](super::Backend::step_begin)'s arguments.
pub struct StepBegin<'a, B: Memory> {
    pub lr_table: &'a Buf<B, f32>,
    pub batch: &'a Buf<B, u32>,
    pub loss_scale: &'a Buf<B, f32>,
    pub global: usize,
    pub out: &'a mut StepScalars<B>,
}

impl<B: Memory> Args for StepBegin<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        const OP: &str = "step_begin";
        one(OP, "batch", self.batch.len())?;
        begin_checks(OP, self.loss_scale, self.global, self.out)
    }
}

/// A step's scalars' checks, but for the batch index: one loss scale, scalars of one element
/// each, a global batch of at least one image.
fn begin_checks<B: Memory>(
    op: &'static str,
    loss_scale: &Buf<B, f32>,
    global: usize,
    out: &StepScalars<B>,
) -> Result<(), BackendError> {
    one(op, "loss_scale", loss_scale.len())?;
    out.check(op)?;
    if global == 0 {
        return Err(BackendError::BadShape {
            op,
            detail: "a global batch of 0 images".into(),
        });
    }
    Ok(())
}

/// [`Backend::step_begin`](super::Backend::step_begin)'s inputs and result but the batch
/// index, which the shard's gather shares
/// ([`Backend::gather_batch_and_begin`](super::Backend::gather_batch_and_begin)).
pub struct BeginStep<'a, B: Memory> {
    /// The learning rate of each batch of the epoch.
    pub lr_table: &'a Buf<B, f32>,
    /// The loss scale (one element).
    pub loss_scale: &'a Buf<B, f32>,
    /// Images in the step's batch over every rank.
    pub global: usize,
    /// The step's scalars.
    pub out: &'a mut StepScalars<B>,
}

/// [`Backend::gather_batch_and_begin`](super::Backend::gather_batch_and_begin)'s arguments.
pub struct GatherAndBegin<'a, B: Memory, T: DeviceScalar> {
    pub gather: GatherBatch<'a, B, T>,
    pub begin: BeginStep<'a, B>,
}

impl<B: Memory, T: DeviceScalar> Args for GatherAndBegin<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        self.gather.check()?;
        let b = &self.begin;
        begin_checks("gather_batch_and_begin", b.loss_scale, b.global, b.out)
    }
}

/// [`Backend::shard_stats`](super::Backend::shard_stats)'s arguments.
pub struct ShardStats<'a, B: Memory> {
    pub loss: &'a Buf<B, f32>,
    pub correct: &'a mut Buf<B, i32>,
    pub out: &'a mut Buf<B, f32>,
    pub accumulate: bool,
}

impl<B: Memory> Args for ShardStats<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        const OP: &str = "shard_stats";
        one(OP, "correct", self.correct.len())?;
        check::expect_len(OP, "out", self.out.len(), STATS)?;
        fits_i32(OP, "the shard", self.loss.len()).map(drop)
    }
}

/// [`Backend::step_end`](super::Backend::step_end)'s arguments.
pub struct StepEnd<'a, B: Memory> {
    pub loss_scale: &'a mut Buf<B, f32>,
    pub clean: Option<&'a mut Buf<B, i32>>,
    pub found: Option<&'a mut Buf<B, i32>>,
    pub growth_interval: usize,
    pub batch: &'a mut Buf<B, u32>,
    pub current: &'a Buf<B, f32>,
    pub ring: &'a mut super::Staging<f32>,
}

impl<B: Memory> Args for StepEnd<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        const OP: &str = "step_end";
        one(OP, "loss_scale", self.loss_scale.len())?;
        one(OP, "batch", self.batch.len())?;
        check::expect_len(OP, "current", self.current.len(), STATS)?;
        if let Some(c) = &self.clean {
            one(OP, "clean", c.len())?;
            if self.found.is_none() {
                return Err(BackendError::BadShape {
                    op: OP,
                    detail: "dynamic loss scaling (`clean`) needs the overflow flag (`found`)"
                        .into(),
                });
            }
            if self.growth_interval == 0 || self.growth_interval > i32::MAX as usize {
                return Err(BackendError::BadShape {
                    op: OP,
                    detail: format!("a growth interval of {}", self.growth_interval),
                });
            }
        }
        if let Some(f) = &self.found {
            one(OP, "found", f.len())?;
        }
        let ring = self.ring.len();
        if ring == 0 || !ring.is_multiple_of(RECORD) {
            return Err(BackendError::BadShape {
                op: OP,
                detail: format!("a ring of {ring} values is not whole records of {RECORD}"),
            });
        }
        fits_i32(OP, "the ring's records", ring / RECORD).map(drop)
    }
}

/// One tensor of [`Backend::sgd_step_many`](super::Backend::sgd_step_many): the arguments
/// [`Backend::sgd_step`](super::Backend::sgd_step) takes per tensor.
pub struct SgdTensor<'a, B: Memory, T: DeviceScalar> {
    pub w: &'a mut Buf<B, f32>,
    pub grad: &'a Buf<B, f32>,
    pub velocity: Option<&'a mut Buf<B, f32>>,
    pub w_copy: Option<&'a mut Buf<B, T>>,
}

impl<B: Memory, T: DeviceScalar> SgdTensor<'_, B, T> {
    /// The tensor's words in a [`TensorTable`] (addresses, 0 for none, then its length).
    pub fn words(&self) -> [u64; super::step::TENSOR_WORDS] {
        [
            self.w.device_addr(),
            self.grad.device_addr(),
            self.velocity.as_deref().map_or(0, |v| v.device_addr()),
            self.w_copy.as_deref().map_or(0, |c| c.device_addr()),
            self.w.len() as u64,
        ]
    }
}

/// Checks that `count` tensors fit `table` and a grid's second dimension.
fn table_room<B: Memory>(
    op: &'static str,
    count: usize,
    table: &TensorTable<B>,
) -> Result<(), BackendError> {
    if count == 0 || count > table.capacity() || count > u16::MAX as usize {
        return Err(BackendError::BadShape {
            op,
            detail: format!(
                "{count} tensors for a table of {} (1 to 65,535)",
                table.capacity()
            ),
        });
    }
    Ok(())
}

/// [`Backend::sgd_step_many`](super::Backend::sgd_step_many)'s arguments.
pub struct SgdMany<'a, B: Memory, T: DeviceScalar> {
    pub tensors: Vec<SgdTensor<'a, B, T>>,
    pub table: &'a mut TensorTable<B>,
    pub step: SgdStep,
    pub at: Option<&'a StepScalars<B>>,
    pub found: Option<&'a Buf<B, i32>>,
}

impl<B: Memory, T: DeviceScalar> Args for SgdMany<'_, B, T> {
    fn check(&self) -> Result<(), BackendError> {
        table_room("sgd_step_many", self.tensors.len(), self.table)?;
        if let Some(at) = self.at {
            at.check("sgd_step_many")?;
        }
        self.tensors.iter().try_for_each(|t| {
            check::sgd(check::SgdLengths {
                weights: t.w.len(),
                grad: t.grad.len(),
                velocity: t.velocity.as_deref().map(len::<B, _>),
                w_copy: t.w_copy.as_deref().map(len::<B, _>),
                found: self.found.map(len::<B, _>),
            })
        })
    }
}

/// [`Backend::grad_check_many`](super::Backend::grad_check_many)'s arguments.
pub struct GradCheckMany<'a, B: Memory> {
    pub grads: &'a [&'a Buf<B, f32>],
    pub table: &'a mut TensorTable<B>,
    pub found: &'a mut Buf<B, i32>,
}

impl<B: Memory> Args for GradCheckMany<'_, B> {
    fn check(&self) -> Result<(), BackendError> {
        table_room("grad_check_many", self.grads.len(), self.table)?;
        check::expect_len("grad_check_many", "found", self.found.len(), 1)
    }
}
