//! Problem shapes of the operations, with the validation every backend shares.

use super::BackendError;

fn bad(op: &'static str, detail: String) -> BackendError {
    BackendError::BadShape { op, detail }
}

/// `BadShape` naming the first of `dims` that is 0.
fn nonzero(op: &'static str, dims: &[(&str, usize)]) -> Result<(), BackendError> {
    match dims.iter().find(|(_, v)| *v == 0) {
        Some((what, _)) => Err(bad(op, format!("{what} is 0"))),
        None => Ok(()),
    }
}

pub(super) fn fits_i32(op: &'static str, what: &str, v: usize) -> Result<i32, BackendError> {
    i32::try_from(v).map_err(|_| bad(op, format!("{what} = {v} exceeds 2^31 - 1")))
}

/// `C (M x N) = op(A) (M x K) · op(B) (K x N)`, all row-major and packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The reduction length.
    pub k: usize,
    /// A is stored K x M and used transposed.
    pub trans_a: bool,
    /// B is stored N x K and used transposed.
    pub trans_b: bool,
}

impl GemmShape {
    /// `C = A·B`.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        GemmShape {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
        }
    }

    /// Leading dimension (row length) of A, B and C as stored.
    pub fn leading_dims(&self) -> (usize, usize, usize) {
        (
            if self.trans_a { self.m } else { self.k },
            if self.trans_b { self.k } else { self.n },
            self.n,
        )
    }

    /// Checks the sizes kernels can index.
    pub fn validate(&self) -> Result<(), BackendError> {
        let dims = [("M", self.m), ("N", self.n), ("K", self.k)];
        nonzero("gemm", &dims)?;
        for (what, v) in dims.into_iter().chain([
            ("M·K", self.m * self.k),
            ("K·N", self.k * self.n),
            ("M·N", self.m * self.n),
        ]) {
            fits_i32("gemm", what, v)?;
        }
        Ok(())
    }

    /// 2·M·N·K.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// What happens to `alpha·A·B` before it is stored in C.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Epilogue {
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C's previous contents (0: C is not read).
    pub beta: f32,
    /// Apply ReLU after the bias.
    pub relu: bool,
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue {
            alpha: 1.0,
            beta: 0.0,
            relu: false,
        }
    }
}

/// A 2-D convolution over NCHW tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dShape {
    /// Images.
    pub batch: usize,
    /// Input channels.
    pub in_c: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Output channels (filters).
    pub out_c: usize,
    /// Filter height.
    pub k_h: usize,
    /// Filter width.
    pub k_w: usize,
    /// Stride in both directions.
    pub stride: usize,
    /// Zero padding on every side.
    pub pad: usize,
}

impl Conv2dShape {
    /// A batch of `features`-wide rows seen as 1x1 images of `features` channels: the shape
    /// under which [`Backend::conv2d_backward_bias`](super::Backend::conv2d_backward_bias)
    /// sums a linear layer's output gradient over the batch (its bias gradient).
    pub fn columns(batch: usize, features: usize) -> Self {
        Conv2dShape {
            batch,
            in_c: 1,
            in_h: 1,
            in_w: 1,
            out_c: features,
            k_h: 1,
            k_w: 1,
            stride: 1,
            pad: 0,
        }
    }

    /// Output height.
    pub fn out_h(&self) -> usize {
        (self.in_h + 2 * self.pad).saturating_sub(self.k_h) / self.stride.max(1) + 1
    }

    /// Output width.
    pub fn out_w(&self) -> usize {
        (self.in_w + 2 * self.pad).saturating_sub(self.k_w) / self.stride.max(1) + 1
    }

    /// Elements of x, w, y.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (
            self.batch * self.in_c * self.in_h * self.in_w,
            self.out_c * self.in_c * self.k_h * self.k_w,
            self.batch * self.out_c * self.out_h() * self.out_w(),
        )
    }

    /// 2·batch·O·P·Q·C·KH·KW.
    pub fn flops(&self) -> f64 {
        2.0 * (self.batch * self.out_c * self.out_h() * self.out_w()) as f64
            * (self.in_c * self.k_h * self.k_w) as f64
    }

    /// Checks the shape is a convolution the kernels can run.
    pub fn validate(&self) -> Result<(), BackendError> {
        let op = "conv2d";
        nonzero(
            op,
            &[
                ("batch", self.batch),
                ("in_c", self.in_c),
                ("in_h", self.in_h),
                ("in_w", self.in_w),
                ("out_c", self.out_c),
                ("k_h", self.k_h),
                ("k_w", self.k_w),
                ("stride", self.stride),
            ],
        )?;
        if self.k_h > self.in_h + 2 * self.pad || self.k_w > self.in_w + 2 * self.pad {
            return Err(bad(
                op,
                format!(
                    "a {}x{} filter does not fit a {}x{} input padded by {}",
                    self.k_h, self.k_w, self.in_h, self.in_w, self.pad
                ),
            ));
        }
        if self.k_h * self.k_w > 1024 {
            return Err(bad(
                op,
                format!("filter window {}x{} exceeds 1024 taps", self.k_h, self.k_w),
            ));
        }
        if self.batch > 65_535 || self.out_c > 65_535 || self.in_c > 65_535 {
            return Err(bad(
                op,
                "batch and channel counts are limited to 65535 (grid dimensions)".into(),
            ));
        }
        let (x, w, y) = self.sizes();
        for (what, v) in [
            ("input size", x),
            ("filter size", w),
            ("output size", y),
            ("pad", self.pad),
        ] {
            fits_i32(op, what, v)?;
        }
        Ok(())
    }
}

/// A 2-D pooling window over `planes` (batch x channels) planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool2dShape {
    /// Planes: batch · channels.
    pub planes: usize,
    /// Input height.
    pub in_h: usize,
    /// Input width.
    pub in_w: usize,
    /// Window height.
    pub k_h: usize,
    /// Window width.
    pub k_w: usize,
    /// Stride in both directions.
    pub stride: usize,
}

impl Pool2dShape {
    /// Output height.
    pub fn out_h(&self) -> usize {
        self.in_h.saturating_sub(self.k_h) / self.stride.max(1) + 1
    }

    /// Output width.
    pub fn out_w(&self) -> usize {
        self.in_w.saturating_sub(self.k_w) / self.stride.max(1) + 1
    }

    /// Elements of x and y.
    pub fn sizes(&self) -> (usize, usize) {
        (
            self.planes * self.in_h * self.in_w,
            self.planes * self.out_h() * self.out_w(),
        )
    }

    /// Checks the window fits and sizes are indexable.
    pub fn validate(&self) -> Result<(), BackendError> {
        let op = "pool2d";
        nonzero(
            op,
            &[
                ("planes", self.planes),
                ("in_h", self.in_h),
                ("in_w", self.in_w),
                ("k_h", self.k_h),
                ("k_w", self.k_w),
                ("stride", self.stride),
            ],
        )?;
        if self.k_h > self.in_h || self.k_w > self.in_w {
            return Err(bad(
                op,
                format!(
                    "a {}x{} window does not fit a {}x{} input",
                    self.k_h, self.k_w, self.in_h, self.in_w
                ),
            ));
        }
        fits_i32(op, "planes", self.planes)?;
        fits_i32(op, "plane size", self.in_h * self.in_w)?;
        Ok(())
    }
}

/// One SGD update's hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f32,
    /// Gradients are multiplied by this first (1 / loss scale; 1 without scaling).
    pub inv_scale: f32,
    /// Momentum factor (used when a velocity buffer is given).
    pub momentum: f32,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f32,
}
