//! f16 and bf16 to and from f32, for whole slices.
//!
//! Mixed precision on the CPU converts every activation it touches: through the `half`
//! crate that is a function call per 8 elements. On x86 (both vector engines) f16 converts
//! inline with F16C, 16 elements a step, and bf16 rounds in AVX2's integer lanes; elsewhere
//! f16 goes through `half` and bf16 through loops the compiler vectorizes for the process's
//! engine. The rounding is to nearest even everywhere (as `f16::from_f32`, and
//! [`bf16_from_f32`]), so each path gives the same bits.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::isa::{isa, EngineKind};

/// `dst[i] = f32(src[i])` (equal lengths).
pub(crate) fn widen(src: &[f16], dst: &mut [f32]) {
    widen_on(isa().engine(), src, dst);
}

/// `dst[i] = f16(src[i])`, rounded to nearest even (equal lengths).
pub(crate) fn narrow(src: &[f32], dst: &mut [f16]) {
    narrow_on(isa().engine(), src, dst);
}

/// [`widen`] as `engine` converts: both x86 vector engines with AVX2 and F16C ([`avx2`];
/// every AVX-512 CPU has them), the others through `half`.
fn widen_on(engine: EngineKind, src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    match engine {
        // SAFETY: AVX2 and F16C are there (checked); lengths are equal.
        #[cfg(target_arch = "x86_64")]
        EngineKind::Avx512 | EngineKind::Avx2 if super::isa::cpu().avx2 => unsafe {
            avx2::widen(src, dst)
        },
        _ => src.convert_to_f32_slice(dst),
    }
}

/// [`narrow`] as `engine` converts, as [`widen_on`].
fn narrow_on(engine: EngineKind, src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
    match engine {
        // SAFETY: as in `widen_on`.
        #[cfg(target_arch = "x86_64")]
        EngineKind::Avx512 | EngineKind::Avx2 if super::isa::cpu().avx2 => unsafe {
            avx2::narrow(src, dst)
        },
        _ => dst.convert_from_f32_slice(src),
    }
}

/// Runs `block` on each 16 elements of `src` and `dst` (equal lengths). A ragged tail is
/// converted as the last 16 elements, overlapping the block before (each element converts
/// on its own, so converting one twice writes the same value); only a slice shorter than 16
/// goes through zero-padded copies. So a plane-sized call costs no call into `half` or libc.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn by_blocks<S: Copy + Default, D: Copy + Default>(
    src: &[S],
    dst: &mut [D],
    block: impl Fn(&[S; 16], &mut [D; 16]),
) {
    let n = src.len();
    if n < 16 {
        let (mut sb, mut db) = ([S::default(); 16], [D::default(); 16]);
        sb[..n].copy_from_slice(src);
        block(&sb, &mut db);
        dst.copy_from_slice(&db[..n]);
        return;
    }
    for (s, d) in src.chunks_exact(16).zip(dst.chunks_exact_mut(16)) {
        block(s.try_into().expect("16"), d.try_into().expect("16"));
    }
    if !n.is_multiple_of(16) {
        let last = n - 16;
        block(
            src[last..].try_into().expect("16"),
            (&mut dst[last..]).try_into().expect("16"),
        );
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

/// `dst[i] = bf16(src[i])` as [`bf16_from_f32`] (equal lengths).
pub(crate) fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
    narrow_bf16_on(isa().engine(), src, dst);
}

/// [`narrow_bf16`] as `engine` converts: AVX2 by hand where it is the engine (its compiled
/// loop packs each 8 results to 16 bits apart, which costs more than the rounding), else the
/// compiled loop.
fn narrow_bf16_on(engine: EngineKind, src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "narrow_bf16: lengths differ");
    match engine {
        // SAFETY: AVX2 is there (checked); lengths are equal.
        #[cfg(target_arch = "x86_64")]
        EngineKind::Avx2 if super::isa::cpu().avx2 => unsafe { avx2::narrow_bf16(src, dst) },
        _ => narrow_bf16_loops(src, dst),
    }
}

super::engine::multiversion!(
    /// [`narrow_bf16`]'s loop, compiled for the process's engine.
    fn narrow_bf16_loops(src: &[f32], dst: &mut [bf16]) = narrow_bf16_body
);

#[inline(always)]
fn narrow_bf16_body(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "narrow_bf16: lengths differ");
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, s)| *d = bf16_from_f32(*s))
}

/// F16C with AVX: 8 lanes per conversion; and bf16 rounded in AVX2's integer lanes.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::{bf16, f16};

    /// [`super::narrow_bf16`], 16 at a time: [`super::bf16_from_f32`]'s rounding in two
    /// vectors of 8, packed to 16 bits together.
    ///
    /// # Safety
    /// AVX2, and `dst.len() == src.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
        let round = |x: __m256i| {
            let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
            let up = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd);
            let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
            let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
            _mm256_blendv_epi8(_mm256_srli_epi32::<16>(up), _mm256_set1_epi32(0x7fff), nan)
        };
        super::by_blocks(src, dst, |s, d| {
            // SAFETY: 16 elements in each block; AVX2 enabled here.
            unsafe {
                let lo = round(_mm256_loadu_si256(s.as_ptr().cast()));
                let hi = round(_mm256_loadu_si256(s.as_ptr().add(8).cast()));
                // The pack interleaves the vectors' 128-bit halves: put them in order.
                let packed = _mm256_packus_epi32(lo, hi);
                let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
                _mm256_storeu_si256(d.as_mut_ptr().cast(), ordered);
            }
        })
    }

    /// [`super::widen`], 8 at a time.
    ///
    /// # Safety
    /// AVX and F16C, and `dst.len() == src.len()`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
        super::by_blocks(src, dst, |s, d| {
            for half in 0..2 {
                // SAFETY: 16 elements in each block; AVX and F16C enabled here.
                unsafe {
                    let h = _mm_loadu_si128(s.as_ptr().add(8 * half).cast());
                    _mm256_storeu_ps(d.as_mut_ptr().add(8 * half), _mm256_cvtph_ps(h));
                }
            }
        })
    }

    /// [`super::narrow`], 8 at a time.
    ///
    /// # Safety
    /// AVX and F16C, and `dst.len() == src.len()`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
        super::by_blocks(src, dst, |s, d| {
            for half in 0..2 {
                // SAFETY: 16 elements in each block; AVX and F16C enabled here; the `asm!` is
                // empty (it only names `h` in a register).
                unsafe {
                    let v = _mm256_loadu_ps(s.as_ptr().add(8 * half));
                    let mut h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                    // Keeps the conversion's result in a register: LLVM otherwise folds the
                    // store into `vcvtps2ph`'s memory form, which AMD's cores run at less than
                    // half the rate of the register form and a store.
                    std::arch::asm!("/* {h} */", h = inout(xmm_reg) h,
                        options(pure, nomem, nostack, preserves_flags));
                    _mm_storeu_si128(d.as_mut_ptr().add(8 * half).cast(), h);
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::super::isa::{cpu, EngineKind};

    /// Every f16 bit pattern widens as `f16::to_f32` does, and narrowing a spread of f32
    /// values (ties, subnormals, overflow, NaN, infinities) rounds as `f16::from_f32`, at
    /// lengths that leave tails of every size: through `half` and through F16C where the CPU
    /// has it.
    #[test]
    fn same_bits_as_half() {
        let mut engines = vec![EngineKind::Portable];
        engines.extend(cpu().avx2.then_some(EngineKind::Avx2));
        for engine in engines {
            println!("{engine:?}");
            same_bits_as_half_on(engine);
        }
    }

    fn same_bits_as_half_on(engine: EngineKind) {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut wide = vec![0.0f32; all.len()];
        super::widen_on(engine, &all, &mut wide);
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
            super::narrow_on(engine, src, &mut got);
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

    /// bf16: every bit pattern widens to its top-half f32 exactly, and narrowing rounds to
    /// nearest even (ties both ways, carries into the exponent and to infinity, subnormals)
    /// with NaN to 0x7fff, on every path (the compiled loop, and AVX2 by hand where the CPU has it) and tail length.
    #[test]
    fn bf16_conversions_are_exact_and_round_to_nearest_even() {
        use half::bf16;
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let mut wide = vec![0.0f32; all.len()];
        super::widen_bf16(&all, &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            assert_eq!(
                u32::from(h.to_bits()) << 16,
                w.to_bits(),
                "widen {:#06x}",
                h.to_bits()
            );
        }
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
        let mut engines = vec![EngineKind::Portable];
        engines.extend(cpu().avx2.then_some(EngineKind::Avx2));
        for (engine, len) in engines
            .into_iter()
            .flat_map(|e| [probe.len(), 15, 16, 17, 33, 1, 0].map(|len| (e, len)))
        {
            let src = &probe[..len];
            let mut got = vec![bf16::ZERO; len];
            super::narrow_bf16_on(engine, src, &mut got);
            for (s, g) in src.iter().zip(&got) {
                assert_eq!(
                    g.to_bits(),
                    reference(*s),
                    "{engine:?}: narrow {s:e} ({:#010x})",
                    s.to_bits()
                );
            }
        }
    }
}
