//! The Rust types of the storage [`DType`]s ([`Precision`]: f32, or f16 or bf16 computed in
//! f32)
//! and the kernel that implements each operation at each of them ([`PrecisionOp`],
//! [`gemm_kernels`]).

use half::{bf16, f16};

use super::{BackendError, DeviceScalar};
use crate::dtype::DType;
use crate::kernels::{
    collective, conv, conv_direct, elementwise, gemm, loss, optim, pool, step, KernelSignature,
};

/// The kernels that exist per storage precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrecisionOp {
    /// `conv2d_forward_64x64_*` (the 64 x 64 tile, for more than 32 output channels)
    Conv2dForward64x64,
    /// `conv2d_forward_32x128_*` (the 32 x 128 tile, for at most 32)
    Conv2dForward32x128,
    /// `conv2d_backward_input_64x64_*` (for more than 32 input channels)
    Conv2dBackwardInput64x64,
    /// `conv2d_backward_input_32x128_*` (for at most 32)
    Conv2dBackwardInput32x128,
    /// `conv2d_backward_input_planes_*` (an image's planes a block: where they fit)
    Conv2dBackwardInputPlanes,
    /// `conv2d_backward_filter_64x64_*` (filter and bias gradients)
    Conv2dBackwardFilter64x64,
    /// `conv2d_backward_filter_32x16_*` (for at most 32 x 16 filter elements)
    Conv2dBackwardFilter32x16,
    /// `conv2d_backward_bias_*`
    Conv2dBackwardBias,
    /// `conv_direct_relu_pool_forward_*` (few filter taps, with the ReLU and a 2x2 pool)
    ConvDirectReluPoolForward,
    /// `conv_direct_relu_pool_filter_*` (its filter and bias gradients through them)
    ConvDirectReluPoolFilter,
    /// `max_pool_forward_*`
    MaxPoolForward,
    /// `max_pool_backward_*`
    MaxPoolBackward,
    /// `avg_pool_forward_*`
    AvgPoolForward,
    /// `avg_pool_backward_*`
    AvgPoolBackward,
    /// `avg_pool_relu_backward_*`
    AvgPoolReluBackward,
    /// `softmax_cross_entropy_*`
    SoftmaxCrossEntropy,
    /// `softmax_head_*` (a linear layer, the loss, their gradients)
    SoftmaxHead,
    /// `relu_backward_*`
    ReluBackward,
    /// `cast_from_f32_*` (by the output's type)
    CastFromF32,
    /// `cast_to_f32_*` (by the input's type)
    CastToF32,
    /// `grad_check_*`
    GradCheck,
    /// `sgd_step_*` (by the weight copy's type; gradients are f32)
    SgdStep,
    /// `reduce_sum_*` (the collectives' data movement)
    ReduceSum,
    /// `gather_batch_*` (by the images' type)
    GatherBatch,
    /// `sgd_step_tensors_*` (by the weight copies' type)
    SgdStepTensors,
}

impl PrecisionOp {
    /// The kernel implementing this operation on `dtype` storage.
    pub fn kernel(self, dtype: DType) -> &'static KernelSignature {
        // Each is one `NANODDP_ENTRY_EACH_TYPE` template: its entries in `DType::ALL` order.
        let per_type: &'static [&'static KernelSignature; DType::ALL.len()] = match self {
            Self::Conv2dForward64x64 => &conv::CONV2D_FORWARD_64X64,
            Self::Conv2dForward32x128 => &conv::CONV2D_FORWARD_32X128,
            Self::Conv2dBackwardInput64x64 => &conv::CONV2D_BACKWARD_INPUT_64X64,
            Self::Conv2dBackwardInput32x128 => &conv::CONV2D_BACKWARD_INPUT_32X128,
            Self::Conv2dBackwardInputPlanes => &conv::CONV2D_BACKWARD_INPUT_PLANES,
            Self::Conv2dBackwardFilter64x64 => &conv::CONV2D_BACKWARD_FILTER_64X64,
            Self::Conv2dBackwardFilter32x16 => &conv::CONV2D_BACKWARD_FILTER_32X16,
            Self::Conv2dBackwardBias => &conv::CONV2D_BACKWARD_BIAS,
            Self::ConvDirectReluPoolForward => &conv_direct::CONV_DIRECT_RELU_POOL_FORWARD,
            Self::ConvDirectReluPoolFilter => &conv_direct::CONV_DIRECT_RELU_POOL_FILTER,
            Self::MaxPoolForward => &pool::MAX_POOL_FORWARD,
            Self::MaxPoolBackward => &pool::MAX_POOL_BACKWARD,
            Self::AvgPoolForward => &pool::AVG_POOL_FORWARD,
            Self::AvgPoolBackward => &pool::AVG_POOL_BACKWARD,
            Self::AvgPoolReluBackward => &pool::AVG_POOL_RELU_BACKWARD,
            Self::SoftmaxCrossEntropy => &loss::SOFTMAX_CROSS_ENTROPY,
            Self::SoftmaxHead => &loss::SOFTMAX_HEAD,
            Self::ReluBackward => &elementwise::RELU_BACKWARD,
            Self::CastFromF32 => &elementwise::CAST_FROM_F32,
            Self::CastToF32 => &elementwise::CAST_TO_F32,
            Self::GradCheck => &optim::GRAD_CHECK,
            Self::SgdStep => &optim::SGD_STEP,
            Self::ReduceSum => &collective::REDUCE_SUM,
            Self::GatherBatch => &step::GATHER_BATCH,
            Self::SgdStepTensors => &optim::SGD_STEP_TENSORS,
        };
        per_type[dtype.code() as usize]
    }
}

/// The GEMM kernels for one pair of input and result types (`kernels/gemm.cu`).
#[derive(Debug, Clone, Copy)]
pub struct GemmKernels {
    /// 64x64 tiles of C, for a product with many tiles.
    pub tiled: &'static KernelSignature,
    /// 16x16 tiles of C with K cut among a block's warps, for a product with few.
    pub sliced: &'static KernelSignature,
}

/// The GEMM kernels for inputs of type `a` and a result of type `c`: f32 CUDA cores for f32,
/// tensor cores (wmma, f32 accumulation) for 16-bit inputs, with an f32 result or one of the
/// inputs' type. A pair no kernel implements is [`BackendError::Unsupported`], which
/// [`Backend::gemm`](super::Backend::gemm) returns on every backend.
pub fn gemm_kernels(a: DType, c: DType) -> Result<GemmKernels, BackendError> {
    let (tiled, sliced) = match (a, c) {
        (DType::F32, DType::F32) => (&gemm::GEMM_F32, &gemm::GEMM_F32_SLICED),
        (DType::F16, DType::F32) => (
            &gemm::GEMM_F16_WMMA_F32OUT,
            &gemm::GEMM_F16_WMMA_SLICED_F32OUT,
        ),
        (DType::F16, DType::F16) => (
            &gemm::GEMM_F16_WMMA_F16OUT,
            &gemm::GEMM_F16_WMMA_SLICED_F16OUT,
        ),
        (DType::BF16, DType::F32) => (
            &gemm::GEMM_BF16_WMMA_F32OUT,
            &gemm::GEMM_BF16_WMMA_SLICED_F32OUT,
        ),
        (DType::BF16, DType::BF16) => (
            &gemm::GEMM_BF16_WMMA_BF16OUT,
            &gemm::GEMM_BF16_WMMA_SLICED_BF16OUT,
        ),
        _ => {
            return Err(BackendError::Unsupported {
                op: "gemm",
                what: format!("{a} inputs with a {c} result"),
            })
        }
    };
    Ok(GemmKernels { tiled, sliced })
}

/// Storage precision of activations and gradients: `f32`, or `f16` or `bf16` computed in f32.
pub trait Precision: DeviceScalar {
    /// The type's name at run time.
    const DTYPE: DType;
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    /// Rounds from f32 (to nearest even for the 16-bit types).
    fn from_f32(v: f32) -> Self;
    /// Widens a whole slice into `dst` (same length): the fast path for many elements
    /// (vector conversions where the CPU has them, detected once per call rather than per
    /// element).
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
    }
    /// Rounds a whole slice into `dst` (same length), as [`Precision::from_f32`] does.
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = Self::from_f32(*s));
    }
    /// Whether the value is above zero (NaN is not): the ReLU backward's test, which the
    /// 16-bit types answer from their bits, without widening.
    fn above_zero(self) -> bool {
        self.to_f32() > 0.0
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
    const DTYPE: DType = DType::F32;
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
    #[inline]
    fn above_zero(self) -> bool {
        self > 0.0
    }
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
}

impl Precision for f16 {
    const DTYPE: DType = DType::F16;
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
    #[inline]
    fn above_zero(self) -> bool {
        // Sign clear, not zero, not NaN: the patterns from 1 to +infinity (0x7c00).
        self.to_bits().wrapping_sub(1) < 0x7c00
    }
}

impl Precision for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16_from_f32(v)
    }
    fn widen_slice(src: &[Self], dst: &mut [f32]) {
        super::cpu::half_convert::widen_bf16(src, dst);
    }
    fn narrow_slice(src: &[f32], dst: &mut [Self]) {
        super::cpu::half_convert::narrow_bf16(src, dst);
    }
    #[inline]
    fn above_zero(self) -> bool {
        // As for f16, up to bf16's +infinity (0x7f80).
        self.to_bits().wrapping_sub(1) < 0x7f80
    }
}

/// `f32 -> bf16` rounded to nearest even, NaN to the canonical quiet NaN `0x7fff`: exactly
/// what CUDA's `__float2bfloat16_rn` (PTX `cvt.rn.bf16.f32`) and the SIMT emulator give, so
/// every backend stores the same bits. (`half::bf16::from_f32` rounds alike but keeps a NaN's
/// sign and payload.)
#[inline(always)]
pub(crate) fn bf16_from_f32(v: f32) -> bf16 {
    let x = v.to_bits();
    // Adding 0x7fff rounds up past the halfway point; the low result bit breaks ties to even;
    // a carry into the exponent rounds up to the next binade or to infinity, as it should.
    let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
    let nan = (x & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits(if nan { 0x7fff } else { rounded })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two facts each Precision type states about itself agree: its DType's kernel C
    /// type is its own, and only f32 is its own f32 view.
    fn consistent<T: Precision>() {
        assert_eq!(T::DTYPE.scalar(), T::SCALAR, "{}", T::DTYPE);
        assert_eq!(
            T::as_f32(&[]).is_some(),
            T::DTYPE == DType::F32,
            "{}",
            T::DTYPE
        );
        assert_eq!(T::DTYPE.size(), std::mem::size_of::<T>(), "{}", T::DTYPE);
    }

    /// The 16-bit types' test on their bits says what the widened value's says, for every
    /// pattern (zeros, subnormals, infinities, NaNs of both signs).
    #[test]
    fn above_zero_from_the_bits_is_the_f32_test() {
        for b in 0..=u16::MAX {
            let (h, bh) = (f16::from_bits(b), bf16::from_bits(b));
            assert_eq!(h.above_zero(), h.to_f32() > 0.0, "f16 {b:#06x}");
            assert_eq!(bh.above_zero(), bh.to_f32() > 0.0, "bf16 {b:#06x}");
        }
        assert!(
            !f32::NAN.above_zero() && !(-0.0f32).above_zero() && f32::MIN_POSITIVE.above_zero()
        );
    }

    #[test]
    fn each_type_agrees_with_its_dtype() {
        consistent::<f32>();
        consistent::<f16>();
        consistent::<bf16>();
    }
}
