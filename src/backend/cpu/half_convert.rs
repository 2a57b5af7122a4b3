//! f16 <-> f32 slice conversion sixteen at a time (AVX-512F's `vcvtph2ps`/`vcvtps2ph`).
//!
//! Mixed precision on the CPU converts every activation it touches: through the `half`
//! crate's F16C path that is a function call per 8 elements, 14% of an fp16 training step.
//! Here the loop is compiled for AVX-512 and the conversions are inline, 16 lanes per
//! instruction; the rounding is the same (to nearest even, as `f16::from_f32`), so results
//! are unchanged bit for bit. Tails and CPUs without AVX-512 go through `half`.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// `dst[i] = f32(src[i])` (equal lengths).
pub(crate) fn widen(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    let done = simd_prefix(|| {
        // SAFETY: AVX-512F was detected by simd_prefix; lengths are equal.
        #[cfg(target_arch = "x86_64")]
        return unsafe { avx512::widen(src, dst) };
        #[allow(unreachable_code)]
        0
    });
    src[done..].convert_to_f32_slice(&mut dst[done..]);
}

/// `dst[i] = f16(src[i])`, rounded to nearest even (equal lengths).
pub(crate) fn narrow(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
    let done = simd_prefix(|| {
        // SAFETY: AVX-512F was detected by simd_prefix; lengths are equal.
        #[cfg(target_arch = "x86_64")]
        return unsafe { avx512::narrow(src, dst) };
        #[allow(unreachable_code)]
        0
    });
    dst[done..].convert_from_f32_slice(&src[done..]);
}

/// Runs `f` (which converts a prefix and returns its length) where AVX-512F is present.
fn simd_prefix(f: impl FnOnce() -> usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    if super::isa::isa().avx512 {
        return f();
    }
    let _ = f;
    0
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use half::f16;

    /// Converts the whole 16-element chunks; returns how many elements that was.
    ///
    /// # Safety
    /// AVX-512F, and `dst.len() == src.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) -> usize {
        let whole = src.len() / 16 * 16;
        for i in (0..whole).step_by(16) {
            // SAFETY: elements i..i+16 exist in both slices (i + 16 <= whole).
            unsafe {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
        }
        whole
    }

    /// Converts the whole 16-element chunks; returns how many elements that was.
    ///
    /// # Safety
    /// AVX-512F, and `dst.len() == src.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) -> usize {
        let whole = src.len() / 16 * 16;
        for i in (0..whole).step_by(16) {
            // SAFETY: elements i..i+16 exist in both slices (i + 16 <= whole).
            unsafe {
                let v = _mm512_loadu_ps(src.as_ptr().add(i));
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
            }
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    /// Every f16 bit pattern widens as `f16::to_f32` does, and narrowing a spread of f32
    /// values (ties, subnormals, overflow, NaN, infinities) rounds as `f16::from_f32`, at
    /// lengths that leave tails of every size.
    #[test]
    fn same_bits_as_half() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut wide = vec![0.0f32; all.len()];
        super::widen(&all, &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            assert_eq!(
                h.to_f32().to_bits(),
                w.to_bits(),
                "widen {:#06x}",
                h.to_bits()
            );
        }
        let mut probe: Vec<f32> = Vec::new();
        for bits in (0..=u32::MAX).step_by(65_537) {
            probe.push(f32::from_bits(bits));
        }
        probe.extend([
            0.5,
            65504.0,
            65520.0,
            1e-8,
            -6.1e-5,
            f32::INFINITY,
            f32::NAN,
        ]);
        for len in [probe.len(), 15, 16, 17, 33, 1, 0] {
            let src = &probe[..len];
            let mut got = vec![f16::ZERO; len];
            super::narrow(src, &mut got);
            for (s, g) in src.iter().zip(&got) {
                let want = f16::from_f32(*s);
                assert!(
                    want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                    "narrow {s:e}: {:#06x} vs {:#06x}",
                    g.to_bits(),
                    want.to_bits()
                );
            }
        }
    }
}
