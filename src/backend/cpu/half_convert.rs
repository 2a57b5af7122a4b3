//! f16 and bf16 to and from f32, for whole slices.
//!
//! Mixed precision on the CPU converts every activation it touches: through the `half`
//! crate that is a function call per 8 elements. On x86 (both vector engines) f16 converts
//! inline with F16C, 16 elements a step, and bf16 rounds in AVX2's integer lanes, the
//! forward's epilogue (bias and ReLU) fused in where it asks ([`narrow_epilogue`]); elsewhere
//! f16 goes through `half` and bf16 through a plain loop. The rounding is to nearest even
//! everywhere (as `f16::from_f32`, and [`bf16_from_f32`]), so each path gives the same bits.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::isa::{isa, EngineKind};
use crate::backend::precision::{bf16_from_f32, Precision};
use crate::dtype::DType;

/// Whether this thread's engine ([`isa`]) converts a slice of `n` elements with F16C and
/// AVX2 ([`avx2`]): both x86 vector engines (every CPU with either has them), 16 or more.
fn by_avx2(n: usize) -> bool {
    let x86 = matches!(isa().engine(), EngineKind::Avx512 | EngineKind::Avx2);
    cfg!(target_arch = "x86_64") && n >= 16 && x86 && super::isa::cpu().avx2
}

/// `dst[i] = f32(src[i])` (equal lengths): [`avx2`] where [`by_avx2`], else through `half`.
pub(crate) fn widen(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    match by_avx2(src.len()) {
        // SAFETY: AVX2 and F16C are there (checked); lengths are equal, at least 16.
        #[cfg(target_arch = "x86_64")]
        true => unsafe { avx2::widen(src, dst) },
        _ => src.convert_to_f32_slice(dst),
    }
}

/// `dst[i] = f16(src[i])`, rounded to nearest even (equal lengths), as [`widen`] converts.
pub(crate) fn narrow(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
    match by_avx2(src.len()) {
        // SAFETY: as in `widen`.
        #[cfg(target_arch = "x86_64")]
        true => unsafe { avx2::narrow(src, bytemuck::cast_slice_mut(dst), false) },
        _ => dst.convert_from_f32_slice(src),
    }
}

/// The forward's epilogue and its rounding in one pass, where [`by_avx2`]: `wide[i] = v`
/// (resized to fit) and `dst[i] = v` rounded to T (f16 or bf16), for `v = src[i] + bias`
/// through the ReLU where `relu` (equal lengths). False, and nothing written, elsewhere (and
/// for f32).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables, clippy::ptr_arg))]
pub(super) fn narrow_epilogue<T: Precision>(
    src: &[f32],
    epilogue: (f32, bool),
    wide: &mut Vec<f32>,
    dst: &mut [T],
) -> bool {
    assert_eq!(src.len(), dst.len(), "narrow_epilogue: lengths differ");
    let fused = by_avx2(src.len()) && T::DTYPE != DType::F32;
    #[cfg(target_arch = "x86_64")]
    if fused {
        wide.resize(src.len(), 0.0);
        let (bits, bf16) = (bytemuck::cast_slice_mut(dst), T::DTYPE == DType::BF16);
        // SAFETY: as in `widen`.
        unsafe { avx2::narrow_epilogue(src, epilogue, wide, bits, bf16) };
    }
    fused
}

super::engine::multiversion!(
    /// `dst[i] = f32(src[i])` (equal lengths): exact, a 16-bit shift.
    pub(crate) fn widen_bf16(src: &[bf16], dst: &mut [f32]) = widen_bf16_body
);

#[inline(always)]
fn widen_bf16_body(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen_bf16: lengths differ");
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, s)| *d = f32::from_bits(u32::from(s.to_bits()) << 16))
}

/// `dst[i] = bf16(src[i])` as [`bf16_from_f32`] (equal lengths), as [`widen`] converts (else
/// a plain loop).
pub(crate) fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "narrow_bf16: lengths differ");
    match by_avx2(src.len()) {
        // SAFETY: as in `widen`.
        #[cfg(target_arch = "x86_64")]
        true => unsafe { avx2::narrow(src, bytemuck::cast_slice_mut(dst), true) },
        _ => dst
            .iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = bf16_from_f32(*s)),
    }
}

/// F16C with AVX2, 16 elements a step; and bf16 rounded in AVX2's integer lanes.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    /// Runs `block(at)` over `0..n` (n at least 16) 16 at a time, a ragged tail as the last
    /// 16, overlapping the block before (each element converts on its own: converting one
    /// twice writes the same value). So a plane-sized call costs no call into `half` or libc.
    #[inline(always)]
    fn by_sixteens(n: usize, mut block: impl FnMut(usize)) {
        (0..n / 16).for_each(|i| block(16 * i));
        if !n.is_multiple_of(16) {
            block(n - 16);
        }
    }

    /// [`super::widen`].
    ///
    /// # Safety
    /// AVX2 and F16C; equal lengths, at least 16.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        // SAFETY: `at + 16` is within both slices; F16C is enabled here.
        by_sixteens(src.len(), |at| unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(at).cast());
            let (lo, hi) = (_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            _mm256_storeu_ps(dst.as_mut_ptr().add(at), _mm256_cvtph_ps(lo));
            _mm256_storeu_ps(dst.as_mut_ptr().add(at + 8), _mm256_cvtph_ps(hi));
        })
    }

    /// [`super::bf16_from_f32`] on 8 values' bits, each lane's low half (safe with AVX2);
    /// `no_nan` where none is NaN (a ReLU's output), which skips NaN's quieting.
    #[inline(always)]
    unsafe fn round_bf16(v: __m256, no_nan: bool) -> __m256i {
        let x = _mm256_castps_si256(v);
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let up = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd);
        if no_nan {
            return _mm256_srli_epi32::<16>(up);
        }
        let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
        _mm256_blendv_epi8(_mm256_srli_epi32::<16>(up), _mm256_set1_epi32(0x7fff), nan)
    }

    /// [`super::narrow`] (`bf16` false) and [`super::narrow_bf16`] (true) of 16 values: F16C,
    /// or [`super::bf16_from_f32`]'s rounding on the bits, packed (safe with AVX2 and F16C).
    #[inline(always)]
    unsafe fn narrow_16(lo: __m256, hi: __m256, bf16: bool, no_nan: bool) -> __m256i {
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT;
        if bf16 {
            // The pack interleaves the vectors' 128-bit halves: put them in order.
            let packed = _mm256_packus_epi32(round_bf16(lo, no_nan), round_bf16(hi, no_nan));
            return _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
        }
        let mut l = _mm256_cvtps_ph::<NEAREST>(lo);
        let mut h = _mm256_cvtps_ph::<NEAREST>(hi);
        // Keeps the conversions' results in registers: LLVM otherwise folds the stores into
        // `vcvtps2ph`'s memory form, which AMD's cores run at less than half the rate of the
        // register form and a store. SAFETY: the `asm!` is empty.
        std::arch::asm!("/* {l} {h} */", l = inout(xmm_reg) l, h = inout(xmm_reg) h,
            options(pure, nomem, nostack, preserves_flags));
        _mm256_set_m128i(h, l)
    }

    /// [`super::narrow`] and [`super::narrow_bf16`] (as [`narrow_16`]) on the bits.
    ///
    /// # Safety
    /// AVX2 and F16C; equal lengths, at least 16.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [u16], bf16: bool) {
        // SAFETY: `at + 16` is within both slices; AVX2 and F16C are enabled here.
        by_sixteens(src.len(), |at| unsafe {
            let lo = _mm256_loadu_ps(src.as_ptr().add(at));
            let hi = _mm256_loadu_ps(src.as_ptr().add(at + 8));
            let v = narrow_16(lo, hi, bf16, false);
            _mm256_storeu_si256(dst.as_mut_ptr().add(at).cast(), v);
        })
    }

    /// [`super::narrow_epilogue`], rounding as [`narrow`] (to bf16 where `bf16`). The ReLU is
    /// `max(v, 0)`, as `f32::max` (0 for NaN).
    ///
    /// # Safety
    /// AVX2 and F16C; equal lengths, at least 16.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn narrow_epilogue(
        src: &[f32],
        (bias, relu): (f32, bool),
        wide: &mut [f32],
        dst: &mut [u16],
        bf16: bool,
    ) {
        let (b, zero, out) = (_mm256_set1_ps(bias), _mm256_setzero_ps(), dst.as_mut_ptr());
        // SAFETY: `at + 16` is within the three slices; AVX2 and F16C are enabled here.
        let mut at8 = |at: usize| unsafe {
            let v = _mm256_add_ps(_mm256_loadu_ps(src.as_ptr().add(at)), b);
            let v = if relu { _mm256_max_ps(v, zero) } else { v };
            _mm256_storeu_ps(wide.as_mut_ptr().add(at), v);
            v
        };
        by_sixteens(src.len(), |at| {
            let (lo, hi) = (at8(at), at8(at + 8));
            // SAFETY: as above.
            unsafe { _mm256_storeu_si256(out.add(at).cast(), narrow_16(lo, hi, bf16, relu)) }
        })
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::super::isa::{levels, set_thread_isa};
    use super::narrow_epilogue;
    use crate::backend::Precision;

    /// Runs `check` on this thread under every level this CPU can run, naming it.
    fn on_each_level(check: impl Fn(&str)) {
        for (name, level) in levels() {
            set_thread_isa(Some(level));
            check(name);
        }
        set_thread_isa(None);
    }

    /// Every f16 bit pattern widens as `f16::to_f32` does, and narrowing a spread of f32
    /// values (ties, subnormals, overflow, NaN, infinities) rounds as `f16::from_f32`, at
    /// lengths that leave tails of every size: through `half` and through F16C where the CPU
    /// has it.
    #[test]
    fn same_bits_as_half() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut probe: Vec<f32> = (0..=u32::MAX).step_by(65_537).map(f32::from_bits).collect();
        probe.extend([
            0.5,
            65504.0,
            65520.0,
            1e-8,
            -6.1e-5,
            f32::INFINITY,
            f32::NAN,
        ]);
        on_each_level(|level| {
            let mut wide = vec![0.0f32; all.len()];
            super::widen(&all, &mut wide);
            let mut pairs = all.iter().zip(&wide);
            let bad = pairs.find(|(h, w)| h.to_f32().to_bits() != w.to_bits());
            assert!(bad.is_none(), "{level}: widen {bad:?}");
            for len in [probe.len(), 15, 16, 17, 33, 1, 0] {
                let mut got = vec![f16::ZERO; len];
                super::narrow(&probe[..len], &mut got);
                for (s, g) in probe.iter().zip(&got) {
                    let (g, want) = (g.to_bits(), f16::from_f32(*s));
                    let same = want.to_bits() == g || (want.is_nan() && f16::from_bits(g).is_nan());
                    assert!(same, "{level}: narrow {s:e}: {g:#06x} vs {want}");
                }
            }
        });
    }

    /// The fused epilogue against its two passes (`f32::max`, then [`Precision::from_f32`]),
    /// bit for bit, for f16 and bf16, with and without the ReLU, at lengths with tails of each
    /// size, at every level; it must run wherever [`super::by_avx2`] says it does.
    #[test]
    fn narrow_epilogue_is_the_epilogue_then_the_rounding() {
        fn check<T: Precision>(level: &str) {
            let mut src: Vec<f32> = (0..40).map(|i| (i * 37 % 23) as f32 * 0.37 - 4.1).collect();
            src.extend([f32::NAN, -0.0, 1e-9, 7e4, -f32::INFINITY, 0.5]);
            for (len, bias) in [(46, -0.25), (8, 1.5), (17, 0.0), (23, 2.0), (24, 0.0)] {
                let relu = len % 2 == 0;
                let (mut wide, mut got) = (vec![0.0f32; len], vec![T::from_f32(0.0); len]);
                let done = narrow_epilogue(&src[..len], (bias, relu), &mut wide, &mut got);
                assert_eq!(done, super::by_avx2(len), "{level}");
                for ((s, w), g) in src.iter().zip(&wide).zip(&got).filter(|_| done) {
                    let v = if relu { (s + bias).max(0.0) } else { s + bias };
                    let bits = |x: T| bytemuck::cast::<T, u16>(x);
                    let nan = v.is_nan() && g.to_f32().is_nan();
                    let same = bits(*g) == bits(T::from_f32(v)) || nan;
                    assert!(w.to_bits() == v.to_bits() && same, "{level}: {s} {bias}");
                }
            }
        }
        on_each_level(|level| (check::<f16>(level), check::<half::bf16>(level)).1);
    }

    /// bf16: every bit pattern widens to its top-half f32 exactly, and narrowing rounds to
    /// nearest even (ties both ways, carries into the exponent and to infinity, subnormals)
    /// with NaN to 0x7fff, at every level (a plain loop, or AVX2) and tail length.
    #[test]
    fn bf16_conversions_are_exact_and_round_to_nearest_even() {
        use half::bf16;
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let mut wide = vec![0.0f32; all.len()];
        super::widen_bf16(&all, &mut wide);
        let mut pairs = all.iter().zip(&wide);
        let bad = pairs.find(|(h, w)| u32::from(h.to_bits()) << 16 != w.to_bits());
        assert!(bad.is_none(), "widen {bad:?}");
        // The rule, stated independently: the nearest bf16 in f64, ties to the even one.
        let reference = |x: f32| -> u16 {
            if x.is_nan() {
                return 0x7fff;
            }
            let lo = (x.to_bits() >> 16) as u16; // truncation: toward zero
            let hi = lo.wrapping_add(1);
            // Past the largest bf16 lies infinity, at the distance 2^128 would be.
            let widen = |b: u16| match b & 0x7fff {
                0x7f80 => f64::powi(2.0, 128).copysign(f64::from(x)),
                _ => f64::from(f32::from_bits(u32::from(b) << 16)),
            };
            let (dlo, dhi) = (
                (f64::from(x) - widen(lo)).abs(),
                (widen(hi) - f64::from(x)).abs(),
            );
            if x.to_bits() & 0xffff == 0 || dlo < dhi || (dlo == dhi && lo & 1 == 0) {
                lo
            } else {
                hi
            }
        };
        let mut probe: Vec<f32> = (0..=u32::MAX).step_by(40_503).map(f32::from_bits).collect();
        for base in [
            0x3f80_0000u32,
            0x0000_0001,
            0x7f7f_0000,
            0x807f_8000,
            0x4049_0fdb,
        ] {
            for off in [
                0x7fffu32, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x1_8001, 0xffff,
            ] {
                probe.push(f32::from_bits(base.wrapping_add(off)));
            }
        }
        probe.extend([
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xff80_0001),
            0.0,
            -0.0,
        ]);
        on_each_level(|level| {
            for len in [probe.len(), 15, 16, 17, 33, 1, 0] {
                let mut got = vec![bf16::ZERO; len];
                super::narrow_bf16(&probe[..len], &mut got);
                for (s, g) in probe.iter().zip(&got) {
                    let bits = s.to_bits();
                    assert_eq!(g.to_bits(), reference(*s), "{level}: {s:e} ({bits:#010x})");
                }
            }
        });
    }
}
