//! The element types data is stored in and moved in: one vocabulary for the kernels, the
//! backends, the collectives, MPI, the trainer, checkpoints and the command line.
//!
//! [`DType`] names a type at run time (a setting, a wire code, a message); the Rust type
//! that holds it implements [`Precision`](crate::backend::Precision), whose
//! [`DTYPE`](crate::backend::Precision::DTYPE) links the two. A new type is a variant here,
//! a `Precision` implementation and its kernels.

use crate::kernels::Scalar;

/// A floating-point storage type: of activations and weight copies, of gradients on the
/// wire, of a training run. Arithmetic and accumulation are f32 whatever the storage; a
/// 16-bit type (IEEE binary16 for `F16`, bfloat16 for `BF16`) keeps f32 master weights,
/// gradients and optimizer state beside it. The variants' one-line docs are
/// `nanoddp train --precision`'s help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DType {
    /// f32 everywhere.
    #[cfg_attr(feature = "cli", value(name = "fp32"))]
    F32,
    /// Mixed precision: half activations, f32 master weights, loss scaling.
    #[cfg_attr(feature = "cli", value(name = "fp16"))]
    F16,
    /// Mixed precision: bfloat16 activations, f32 master weights, no loss scaling (bf16 has
    /// f32's range), non-finite steps still skipped.
    #[cfg_attr(feature = "cli", value(name = "bf16"))]
    BF16,
}

impl DType {
    /// Every type, in wire-code order.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// The kernels' C type.
    pub const fn scalar(self) -> Scalar {
        match self {
            DType::F32 => Scalar::F32,
            DType::F16 => Scalar::F16,
            DType::BF16 => Scalar::BF16,
        }
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        self.scalar().size()
    }

    /// The name the command line, checkpoints and reports use (`fp32`, `fp16`, `bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "fp32",
            DType::F16 => "fp16",
            DType::BF16 => "bf16",
        }
    }

    /// Narrower than f32: stored in half a word, so activations need a copy of the weights in
    /// this type, and the optimizer skips a step whose gradients are not all finite.
    pub const fn is_half(self) -> bool {
        !matches!(self, DType::F32)
    }

    /// Gradients need loss scaling to stay representable: fp16 only (its smallest normal is
    /// 6.1e-5; bf16 shares f32's exponent range, so scaling would only risk overflow).
    pub const fn needs_loss_scaling(self) -> bool {
        matches!(self, DType::F16)
    }

    /// The code this type travels as between processes (its index in [`DType::ALL`]).
    pub const fn code(self) -> u64 {
        self as u64
    }

    /// The type with wire code `code`, if any.
    pub fn from_code(code: u64) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::DType;
    use crate::kernels::declarations::ENTRY_TYPES;

    #[test]
    fn codes_round_trip_and_sizes_match_the_kernels() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
        }
        assert_eq!(DType::from_code(DType::ALL.len() as u64), None);
        let sizes = DType::ALL.map(DType::size);
        assert_eq!(sizes, [4, 2, 2]);
    }

    /// `simt.cuh`'s per-type kernel entries are the DTypes, in order: `PrecisionOp::kernel`
    /// picks an entry by the DType's position.
    #[test]
    fn the_kernels_entry_types_are_the_dtypes_in_order() {
        let entry_scalars = ENTRY_TYPES.map(|(_, scalar)| scalar);
        assert_eq!(entry_scalars, DType::ALL.map(DType::scalar));
        for ((suffix, _), d) in ENTRY_TYPES.iter().zip(DType::ALL) {
            assert_eq!(*suffix, d.scalar().code(), "{d}");
        }
    }
}
