//! Max and average pooling, one plane per rayon task. Backward gathers per input element
//! (like the kernels), so overlapping windows need no atomics and results are exact.

use rayon::prelude::*;

use crate::backend::shapes::Pool2dShape;
use crate::backend::Precision;

use super::engine::multiversion;
#[cfg(target_arch = "x86_64")]
use super::isa::isa;
use super::{widened, write_f32};

/// Output rows (or columns) whose window covers input row `i`: `ceil((i-k+1)/s) ..= min(i/s, out-1)`.
fn covering(i: usize, k: usize, stride: usize, out: usize) -> std::ops::RangeInclusive<usize> {
    let first = (i + 1).saturating_sub(k).div_ceil(stride);
    first..=(i / stride).min(out - 1)
}

pub(super) fn max_forward<T: Precision>(s: &Pool2dShape, x: &[T], y: &mut [T], argmax: &mut [i32]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    y.par_chunks_mut(oh * ow)
        .zip(argmax.par_chunks_mut(oh * ow))
        .enumerate()
        .for_each(|(pl, (y, am))| {
            let x = &x[pl * plane_in..(pl + 1) * plane_in];
            for p in 0..oh {
                for q in 0..ow {
                    let mut arg = p * s.stride * s.in_w + q * s.stride;
                    let mut best = x[arg].to_f32();
                    for i in 0..s.k_h {
                        for j in 0..s.k_w {
                            let idx = (p * s.stride + i) * s.in_w + q * s.stride + j;
                            let v = x[idx].to_f32();
                            if v > best || (v.is_nan() && !best.is_nan()) {
                                best = v;
                                arg = idx;
                            }
                        }
                    }
                    y[p * ow + q] = T::from_f32(best);
                    am[p * ow + q] = arg as i32;
                }
            }
        });
}

pub(super) fn max_backward<T: Precision>(s: &Pool2dShape, dy: &[T], argmax: &[i32], dx: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    dx.par_chunks_mut(plane_in)
        .enumerate()
        .for_each(|(pl, dx)| {
            let planes = pl * oh * ow..(pl + 1) * oh * ow;
            let (dy, am) = (&dy[planes.clone()], &argmax[planes]);
            for ih in 0..s.in_h {
                for iw in 0..s.in_w {
                    let here = (ih * s.in_w + iw) as i32;
                    let mut acc = 0.0f32;
                    for p in covering(ih, s.k_h, s.stride, oh) {
                        for q in covering(iw, s.k_w, s.stride, ow) {
                            if am[p * ow + q] == here {
                                acc += dy[p * ow + q].to_f32();
                            }
                        }
                    }
                    dx[ih * s.in_w + iw] = T::from_f32(acc);
                }
            }
        });
}

/// Body of [`avg_plane`].
#[inline(always)]
fn avg_plane_body(s: &Pool2dShape, wide: &[f32], out: &mut [f32]) {
    let (oh, ow) = (s.out_h(), s.out_w());
    let inv = 1.0 / (s.k_h * s.k_w) as f32;
    if is_2x2(s) {
        // LeNet's pools: written out so the compiler vectorizes the pairs (the general loop
        // below adds in the same order, so both give the same bits).
        for (p, out_row) in out.chunks_exact_mut(ow).take(oh).enumerate() {
            let r0 = &wide[2 * p * s.in_w..][..2 * ow];
            let r1 = &wide[(2 * p + 1) * s.in_w..][..2 * ow];
            for (q, o) in out_row.iter_mut().enumerate() {
                *o = (((r0[2 * q] + r0[2 * q + 1]) + r1[2 * q]) + r1[2 * q + 1]) * inv;
            }
        }
        return;
    }
    for p in 0..oh {
        for q in 0..ow {
            let mut acc = 0.0f32;
            for i in 0..s.k_h {
                for j in 0..s.k_w {
                    acc += wide[(p * s.stride + i) * s.in_w + q * s.stride + j];
                }
            }
            out[p * ow + q] = acc * inv;
        }
    }
}

pub(super) fn avg_forward<T: Precision>(s: &Pool2dShape, x: &[T], y: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    y.par_chunks_mut(oh * ow).enumerate().for_each_init(
        || (Vec::new(), Vec::new()),
        |(wide, out), (pl, y)| {
            let x = widened(&x[pl * plane_in..(pl + 1) * plane_in], wide);
            write_f32(y, out, |y| avg_plane(s, x, y));
        },
    );
}

/// Body of [`avg_backward_plane`]: the gradients `g` spread over the input plane `dx`, kept
/// where `y` (if given: the ReLU's backward too) is above zero, else +0.0.
#[inline(always)]
fn avg_backward_plane_body<T: Precision>(
    s: &Pool2dShape,
    g: &[f32],
    y: Option<&[T]>,
    dx: &mut [f32],
) {
    let (oh, ow) = (s.out_h(), s.out_w());
    let inv = 1.0 / (s.k_h * s.k_w) as f32;
    if is_2x2(s) {
        // LeNet's pools: the windows tile the plane, so each input element takes at most one
        // gradient (the same bits as the gather below; rows and columns past the last window
        // get zero).
        if s.in_h != 2 * oh || s.in_w != 2 * ow {
            dx.fill(0.0);
        }
        // Index loops, not iterator adapters (a `fold` left as a call is compiled for the
        // baseline); the ReLU as a mask on each value written (a branch mispredicts, and a
        // ReLU applied in place compiles to a masked store, which AMD's cores run slowly).
        for h in 0..2 * oh {
            let (g_row, d) = (&g[h / 2 * ow..][..ow], &mut dx[h * s.in_w..][..2 * ow]);
            let a = y.map(|y| &y[h * s.in_w..][..2 * ow]);
            let keep = |i: usize| u32::from(a.is_none_or(|a| a[i].above_zero())).wrapping_neg();
            for q in 0..ow {
                let v = (g_row[q] * inv).to_bits();
                let (lo, hi) = (v & keep(2 * q), v & keep(2 * q + 1));
                (d[2 * q], d[2 * q + 1]) = (f32::from_bits(lo), f32::from_bits(hi));
            }
        }
        return;
    }
    for ih in 0..s.in_h {
        for iw in 0..s.in_w {
            let mut acc = 0.0f32;
            for p in covering(ih, s.k_h, s.stride, oh) {
                for q in covering(iw, s.k_w, s.stride, ow) {
                    acc += g[p * ow + q];
                }
            }
            dx[ih * s.in_w + iw] = acc * inv;
        }
    }
    for (d, a) in dx.iter_mut().zip(y.unwrap_or_default()) {
        *d = if a.above_zero() { *d } else { 0.0 };
    }
}

pub(super) fn avg_backward<T: Precision>(s: &Pool2dShape, dy: &[T], dx: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    dx.par_chunks_mut(plane_in).enumerate().for_each_init(
        || (Vec::new(), Vec::new()),
        |(g, wide), (pl, dx)| {
            let g = widened(&dy[pl * oh * ow..(pl + 1) * oh * ow], g);
            write_f32(dx, wide, |dx| avg_backward_plane::<f32>(s, g, None, dx));
        },
    );
}

/// `dx = (y > 0) ⊙ avg_backward(dy)`: the pooling's and the ReLU's backward in one pass over
/// each plane instead of two over the whole tensor.
pub(super) fn avg_relu_backward<T: Precision>(s: &Pool2dShape, dy: &[T], y: &[T], dx: &mut [T]) {
    let (oh, ow, plane_in) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
    dx.par_chunks_mut(plane_in).enumerate().for_each_init(
        || (Vec::new(), Vec::new(), Vec::new()),
        |(g, wide, act), (pl, dx)| {
            let g = widened(&dy[pl * oh * ow..(pl + 1) * oh * ow], g);
            let y = &y[pl * plane_in..(pl + 1) * plane_in];
            write_f32(dx, wide, |dx| relu_pool_backward(s, g, y, act, dx));
        },
    );
}

/// One plane of [`avg_relu_backward`] (`dx.len()` long) in f32: `y` tested as stored
/// ([`Precision::above_zero`]), except where AVX-512's 2x2 kernel serves, which takes y
/// widened (into `scratch`). The same bits either way.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables, clippy::ptr_arg))]
pub(super) fn relu_pool_backward<T: Precision>(
    s: &Pool2dShape,
    g: &[f32],
    y: &[T],
    scratch: &mut Vec<f32>,
    dx: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if avx512_2x2(s) {
        let act = widened(y, scratch);
        // SAFETY: AVX-512 F, VL, BW and DQ were detected (`Isa::avx512`).
        return unsafe { avx512::avg_relu_backward_2x2(s, g, act, dx) };
    }
    avg_backward_plane(s, g, Some(y), dx)
}

// The plane loops are compiled for the process's engine (`multiversion!`), picked at run time
// per plane. Element-wise arithmetic in the same order, so every engine gives the same bits.

multiversion!(
    /// [`avg_plane`] for any window: the loops above, vectorized.
    fn avg_plane_loops(s: &Pool2dShape, wide: &[f32], out: &mut [f32]) = avg_plane_body
);

/// Whether `s` is LeNet's pool (2x2 windows, stride 2), which [`avx512`] has kernels for.
fn is_2x2(s: &Pool2dShape) -> bool {
    s.k_h == 2 && s.k_w == 2 && s.stride == 2
}

/// Average-pools one f32 plane (`s.in_h x s.in_w`) into `out` (`out_h x out_w`).
pub(super) fn avg_plane(s: &Pool2dShape, wide: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512_2x2(s) {
        // SAFETY: AVX-512 F, VL, BW and DQ were detected (`Isa::avx512`).
        return unsafe { avx512::avg_2x2(s, wide, out) };
    }
    avg_plane_loops(s, wide, out)
}
multiversion!(
    /// Spreads one f32 plane of output gradients `g` (`out_h x out_w`) over the input plane
    /// `dx` (`in_h x in_w`, overwritten), through the ReLU's backward where `y` is given.
    fn avg_backward_plane<T: Precision>(
        s: &Pool2dShape,
        g: &[f32],
        y: Option<&[T]>,
        dx: &mut [f32],
    ) = avg_backward_plane_body
);

/// Whether [`avx512`]'s 2x2 kernels serve pools of shape `s` on this CPU.
#[cfg(target_arch = "x86_64")]
fn avx512_2x2(s: &Pool2dShape) -> bool {
    is_2x2(s) && isa().avx512
}

/// LeNet's pools (2x2 windows, stride 2) in AVX-512 registers. The loops above cannot be
/// vectorized by the compiler for LeNet's planes (13 and 4 outputs per row: fewer than a
/// vector, and the inputs interleaved by pairs), and run one element at a time, the
/// additions waiting on each other (docs/cpu-backend.md has the cost). Here a row's pairs are split
/// into even and odd lanes by one permute, and the gradient is spread to pairs by another.
/// The arithmetic is the loops', in their order, so both give the same bits (tested).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::Pool2dShape;
    use crate::backend::cpu::engine::avx512::lanes;

    /// [`super::avg_plane`] for 2x2 windows of stride 2: each output row from its two input
    /// rows, 16 outputs per step, `((r0[2q] + r0[2q+1]) + r1[2q]) + r1[2q+1]` times 1/4.
    ///
    /// # Safety
    /// AVX-512F.
    ///
    /// # Panics
    /// If `wide` or `out` is shorter than the shape's plane.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avg_2x2(s: &Pool2dShape, wide: &[f32], out: &mut [f32]) {
        let (oh, ow) = (s.out_h(), s.out_w());
        assert!(wide.len() >= s.in_h * s.in_w && out.len() >= oh * ow);
        assert!(2 * oh <= s.in_h && 2 * ow <= s.in_w);
        let (x, y) = (wide.as_ptr(), out.as_mut_ptr());
        for p in 0..oh {
            for q0 in (0..ow).step_by(16) {
                let n = (ow - q0).min(16);
                // Inputs 2·q0 .. 2·(q0 + n) of rows 2p and 2p + 1: two vectors each.
                let (lo, hi) = (lanes((2 * n).min(16)), lanes((2 * n).saturating_sub(16)));
                // SAFETY: the masks keep every lane inside rows 2p, 2p + 1 (2·ow ≤ in_w,
                // 2·oh ≤ in_h, asserted) and output row p; pointers are only formed for
                // lanes that the masks keep or that lie inside the plane.
                unsafe {
                    let r0 = x.add(2 * p * s.in_w + 2 * q0);
                    let r1 = r0.add(s.in_w);
                    let load = |r: *const f32| {
                        let a = _mm512_maskz_loadu_ps(lo, r);
                        (a, _mm512_maskz_loadu_ps(hi, r.wrapping_add(16)))
                    };
                    let avg = windows_2x2(load(r0), load(r1));
                    _mm512_mask_storeu_ps(y.add(p * ow + q0), lanes(n), avg);
                }
            }
        }
    }

    /// The averages of 16 windows of 2x2 from two rows of 32 values each (two vectors per
    /// row): `((r0[2q] + r0[2q+1]) + r1[2q]) + r1[2q+1]` times 1/4, the loops' order.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn windows_2x2(r0: (__m512, __m512), r1: (__m512, __m512)) -> __m512 {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        let split = |(a, b): (__m512, __m512)| {
            (
                _mm512_permutex2var_ps(a, even, b),
                _mm512_permutex2var_ps(a, odd, b),
            )
        };
        let ((e0, o0), (e1, o1)) = (split(r0), split(r1));
        let sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e0, o0), e1), o1);
        _mm512_mul_ps(sum, _mm512_set1_ps(0.25))
    }

    /// [`super::relu_pool_backward`] for 2x2 windows of stride 2: input row h takes
    /// output row h / 2's gradients, each duplicated to its pair of columns and times 1/4,
    /// kept where `act > 0`; rows and columns in no window get zero.
    ///
    /// # Safety
    /// AVX-512F.
    ///
    /// # Panics
    /// If `g`, `act` or `dx` is shorter than its plane.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avg_relu_backward_2x2(
        s: &Pool2dShape,
        g: &[f32],
        act: &[f32],
        dx: &mut [f32],
    ) {
        let (oh, ow, plane) = (s.out_h(), s.out_w(), s.in_h * s.in_w);
        assert!(g.len() >= oh * ow && act.len() >= plane && dx.len() >= plane);
        assert!(2 * oh <= s.in_h && 2 * ow <= s.in_w);
        let inv = _mm512_set1_ps(0.25);
        let spread = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        let zero = _mm512_setzero_ps();
        let (g, a, d) = (g.as_ptr(), act.as_ptr(), dx.as_mut_ptr());
        for h in 0..s.in_h {
            for w0 in (0..s.in_w).step_by(16) {
                let width = lanes((s.in_w - w0).min(16));
                // SAFETY: lanes of `width` lie in row h of act and dx; the gradient load
                // keeps outputs w0/2 .. of row h/2 below ow (none past the last window row).
                unsafe {
                    let q0 = w0 / 2;
                    let covered = if h < 2 * oh {
                        ow.saturating_sub(q0).min(8)
                    } else {
                        0
                    };
                    let gv = _mm512_maskz_loadu_ps(lanes(covered), g.wrapping_add(h / 2 * ow + q0));
                    let v = _mm512_mul_ps(_mm512_permutexvar_ps(spread, gv), inv);
                    let av = _mm512_maskz_loadu_ps(width, a.add(h * s.in_w + w0));
                    let live = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(av, zero);
                    let out = _mm512_maskz_mov_ps(live, v);
                    _mm512_mask_storeu_ps(d.add(h * s.in_w + w0), width, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::super::product_check::{seeded, uniform};
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    /// LeNet's pools (2x2 windows, stride 2; the backward with and without the ReLU's), as
    /// the loops compute them and, on a CPU with AVX-512, its kernels, give the definition's
    /// bits on every plane from 2 x 2 to 9 x 70 (LeNet's 26 x 26 and 9 x 9 among them; odd
    /// sizes leave a row and a column in no window; rows of up to five vectors with ragged
    /// ends), on random values with zeros, negative zeros and NaN among the activations (as
    /// f32, f16 and bf16) and gradients; outputs poisoned, slices ending where the plane does.
    #[test]
    fn the_2x2_pools_give_the_definitions_bits() {
        let mut rng = seeded(5);
        for (in_h, in_w) in (2..=9).flat_map(|h| (2..=40).chain([64, 65, 70]).map(move |w| (h, w)))
        {
            let (k_h, k_w, stride, planes) = (2, 2, 2, 1);
            let s = Pool2dShape {
                planes,
                in_h,
                in_w,
                k_h,
                k_w,
                stride,
            };
            let (oh, ow, w, what) = (s.out_h(), s.out_w(), in_w, format!("{in_h} x {in_w}"));
            let (mut x, mut g) = (uniform(&mut rng, in_h * w), uniform(&mut rng, oh * ow));
            let mut act = uniform(&mut rng, in_h * w);
            for (i, v) in act.iter_mut().enumerate().step_by(5) {
                *v = [0.0, -0.0, f32::NAN][i % 3];
            }
            (x[0], g[0], g[oh * ow / 2]) = (f32::NAN, -0.0, f32::NAN);
            let at = |i: usize| 2 * (i / ow) * w + 2 * (i % ow);
            let want: Vec<f32> = (0..oh * ow)
                .map(|i| (((x[at(i)] + x[at(i) + 1]) + x[at(i) + w]) + x[at(i) + w + 1]) * 0.25)
                .collect();
            let (mut got, mut loops) = (vec![-1.0; oh * ow], vec![f32::NAN; oh * ow]);
            avg_plane(&s, &x, &mut got);
            avg_plane_loops(&s, &x, &mut loops);
            assert_eq!(
                (bits(&got), bits(&loops)),
                (bits(&want), bits(&want)),
                "{what}"
            );

            // dx: g spread to its window times 1/4 where act > 0 (not NaN), else +0.0.
            let backward = |act: &[f32]| -> Vec<f32> {
                let live = |i: usize| i / w < 2 * oh && i % w < 2 * ow && act[i] > 0.0;
                let dx = |i: usize| g[i / w / 2 * ow + i % w / 2] * 0.25;
                (0..in_h * w)
                    .map(|i| if live(i) { dx(i) } else { 0.0 })
                    .collect()
            };
            let mut got = vec![-1.0; in_h * w];
            avg_backward_plane::<f32>(&s, &g, None, &mut got);
            assert_eq!(bits(&got), bits(&backward(&vec![1.0; in_h * w])), "{what}");
            relu_backward_matches::<f32>(&s, &g, &act, &backward);
            relu_backward_matches::<f16>(&s, &g, &act, &backward);
            relu_backward_matches::<bf16>(&s, &g, &act, &backward);
        }
    }

    /// Asserts that [`relu_pool_backward`] (the process's kernel) and the loops as compiled
    /// for its engine give `backward`'s bits for `act` stored as T (and widened), outputs
    /// poisoned first.
    fn relu_backward_matches<T: Precision>(
        s: &Pool2dShape,
        g: &[f32],
        act: &[f32],
        backward: &dyn Fn(&[f32]) -> Vec<f32>,
    ) {
        let act: Vec<T> = act.iter().map(|v| T::from_f32(*v)).collect();
        let want = backward(&act.iter().map(|v| v.to_f32()).collect::<Vec<_>>());
        let (mut got, mut loops) = (vec![-1.0; want.len()], vec![f32::NAN; want.len()]);
        relu_pool_backward(s, g, &act, &mut Vec::new(), &mut got);
        avg_backward_plane(s, g, Some(&act[..]), &mut loops);
        let what = format!("ReLU backward, {} x {}, {:?}", s.in_h, s.in_w, T::DTYPE);
        assert_eq!(
            (bits(&got), bits(&loops)),
            (bits(&want), bits(&want)),
            "{what}"
        );
    }
}
