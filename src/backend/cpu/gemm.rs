//! The linear layers' GEMM, with the transposes expressed as strides and the epilogue
//! applied after: f32 through `matrixmultiply` (packed panels, SIMD micro-kernels), bf16 on
//! a CPU with AVX512-BF16 through [`gemm_bf16`](super::pairs::gemm_bf16)
//! (`vdpbf16ps` on the bf16 values themselves). Both split C's rows over rayon's threads and
//! sum long products in blocks ([`K_BLOCK`]).

use rayon::prelude::*;

use crate::backend::shapes::{Epilogue, GemmShape};
use crate::backend::Precision;

use super::pairs::{self, PairPanels, PairRows};
use super::summation::Cascade;

/// Products longer than this many terms are summed in blocks of this length (each block a
/// product of its own, the blocks then added pairwise): a dot product summed in one running
/// chain carries every rounding error through all later additions, so its error grows with
/// K; in blocks, with [`K_BLOCK`] + log₂(K / [`K_BLOCK`]) (matrixmultiply's own K blocks are
/// 256 long, and the blocks added in order). This matters for the weight gradients
/// dW = dyᵀ·x, where K is the batch and the terms cancel. Measured on fc1's and fc2's weight
/// gradients at batch 256 (tests/numerics.rs): 2.9e-7 relative in one chain, 1.6e-7 in
/// blocks of 64, PyTorch float32 2.2e-7.
const K_BLOCK: usize = 64;

/// `C = α·op(A)·op(B) + β·C`, then the bias and the ReLU, through matrixmultiply's f32
/// product. Half operands are widened by each task into its thread's buffers (in that core's
/// cache, where one pass over the threads leaves half of them in the other core's; of op(A)
/// only its rows): the same products on the same values as widening first.
pub(super) fn gemm_f32<T: Precision, O: Precision>(
    shape: &GemmShape,
    a: &[T],
    b: &[T],
    bias: Option<&[f32]>,
    c: &mut [O],
    ep: Epilogue,
) {
    let ((rsa, csa), (rsb, csb)) = strides(shape);
    let n = shape.n;
    gemm_rows(shape, bias, c, ep, |row0, c_rows, [wide_a, wide_b]| {
        let (m, k) = (c_rows.len() / n, shape.k);
        // The task's rows of op(A) only: from row0 to its last element.
        let span = (m * k > 0).then(|| (m - 1) * rsa + (k - 1) * csa + 1);
        let a = super::widened(&a[(row0 * rsa).min(a.len())..][..span.unwrap_or(0)], wide_a);
        let b = super::widened(b, wide_b);
        in_k_blocks(k, ep.beta, c_rows, |(k0, len), beta, c_part| {
            // SAFETY: a holds the task's rows of op(A) from its first element, M x K at
            // strides (rsa, csa); b holds K·N, C M·N (checked by the caller); the columns
            // start at k0 < K, op(B)'s rows at k0 (rsb) inside b; k0 + len ≤ K, so every
            // (row stride, column stride) pair addresses inside its slice.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    len,
                    n,
                    ep.alpha,
                    a.as_ptr().add(k0 * csa),
                    rsa as isize,
                    csa as isize,
                    b.as_ptr().add(k0 * rsb),
                    rsb as isize,
                    csb as isize,
                    beta,
                    c_part.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
        })
    });
}

/// [`gemm_f32`] on bf16 operands (bit patterns) with `vdpbf16ps`: each task packs its rows
/// of op(A) and op(B) by pairs of k, a block of [`K_BLOCK`] at a time.
///
/// # Panics
/// If the CPU lacks AVX512-BF16.
pub(super) fn gemm_bf16<O: Precision>(
    shape: &GemmShape,
    a: &[u16],
    b: &[u16],
    bias: Option<&[f32]>,
    c: &mut [O],
    ep: Epilogue,
) {
    let ((rsa, csa), (rsb, csb)) = strides(shape);
    let n = shape.n;
    // op(B) packed once per block of k, shared by every task's rows.
    let blocks = shape.k.clamp(1, K_BLOCK);
    let packed_b: Vec<PairRows> = (0..shape.k.max(1))
        .step_by(blocks)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|k0| {
            let mut pb = PairRows::default();
            let len = blocks.min(shape.k - k0.min(shape.k));
            pb.pack_bits(&b[(k0 * rsb).min(b.len())..], len, n, (rsb, csb));
            pb
        })
        .collect();
    gemm_rows(shape, bias, c, ep, |row0, c_rows, _| {
        in_k_blocks(shape.k, ep.beta, c_rows, |(k0, len), beta, c_panel| {
            let m = c_panel.len() / n;
            let mut pa = PairPanels::default();
            let at = (row0 * rsa + k0 * csa).min(a.len());
            pa.pack_bits(&a[at..], m, len, (rsa, csa));
            let pb = &packed_b[k0 / blocks];
            if ep.alpha == 1.0 && (beta == 0.0 || beta == 1.0) {
                return pairs::gemm_bf16(&pa, pb, c_panel, n, beta == 1.0);
            }
            let mut product = vec![0.0f32; c_panel.len()];
            pairs::gemm_bf16(&pa, pb, &mut product, n, false);
            for (c, p) in c_panel.iter_mut().zip(&product) {
                // β = 0 ignores C's old contents, NaN included (BLAS semantics).
                *c = if beta == 0.0 {
                    ep.alpha * p
                } else {
                    ep.alpha.mul_add(*p, beta * *c)
                };
            }
        })
    });
}

/// The (row, column) strides of op(A) and op(B) in A and B as stored.
type Strides = ((usize, usize), (usize, usize));

fn strides(shape: &GemmShape) -> Strides {
    let (lda, ldb, _) = shape.leading_dims();
    (
        if shape.trans_a { (1, lda) } else { (lda, 1) },
        if shape.trans_b { (1, ldb) } else { (ldb, 1) },
    )
}

/// `c_rows = Σ block((k0, len), β, part) + β·c_rows` over K: `block` computes its part
/// `α·op(A)[.., k0..k0 + len]·op(B)[k0..k0 + len, :]` (plus β times what the part held):
/// over the whole K in one call (into C with the caller's β) or, past [`K_BLOCK`], in
/// blocks summed as a tree.
fn in_k_blocks(
    k: usize,
    beta: f32,
    c_rows: &mut [f32],
    mut block: impl FnMut((usize, usize), f32, &mut [f32]),
) {
    if k <= K_BLOCK {
        return block((0, k), beta, c_rows);
    }
    let mut blocks = Cascade::default();
    for k0 in (0..k).step_by(K_BLOCK) {
        let mut part = blocks.spare(c_rows.len());
        block((k0, K_BLOCK.min(k - k0)), 0.0, &mut part);
        blocks.push(part);
    }
    let total = blocks.total().expect("K > K_BLOCK: at least two blocks");
    if beta == 0.0 {
        // β = 0 ignores C's old contents, NaN included (BLAS semantics).
        c_rows.copy_from_slice(&total);
    } else {
        for (c, t) in c_rows.iter_mut().zip(&total) {
            *c = beta.mul_add(*c, *t);
        }
    }
}

/// The driver both element types share: C's rows split over rayon's tasks, each task's
/// `product(row0, c_rows, scratch)` (`c_rows = α·op(A)[row0..]·op(B) + β·c_rows` through
/// [`in_k_blocks`], widening into two of its thread's buffers), then the bias, the ReLU and
/// for half C the rounding (through the third), each task on its own rows: one pass in all.
fn gemm_rows<O: Precision>(
    shape: &GemmShape,
    bias: Option<&[f32]>,
    c: &mut [O],
    ep: Epilogue,
    product: impl Fn(usize, &mut [f32], [&mut Vec<f32>; 2]) + Sync,
) {
    let ldc = shape.n;
    // Big products are split by rows of C, a task per rayon thread (each packs, and widens
    // where half, all of op(B)), each task single-threaded in matrixmultiply (its own threads
    // would fight rayon's when the callers are already parallel, as the convolutions are).
    let rows_per_task = if shape.flops() < 4e6 {
        shape.m
    } else {
        shape.m.div_ceil(rayon::current_num_threads()).max(16)
    };
    c.par_chunks_mut(rows_per_task * ldc)
        .enumerate()
        .for_each(|(t, c_rows)| {
            super::with_kept(|[wide_a, wide_b, wide_c]: &mut [Vec<f32>; 3]| {
                // Half C: in f32 (widened where β reads it), then rounded.
                if ep.beta != 0.0 && O::as_f32(c_rows).is_none() {
                    O::widen_slice(c_rows, super::fitted(wide_c, c_rows.len()));
                }
                super::write_f32(c_rows, wide_c, |c_rows| {
                    product(t * rows_per_task, c_rows, [wide_a, wide_b]);
                    for row in c_rows.chunks_mut(ldc) {
                        row.iter_mut()
                            .zip(bias.unwrap_or_default())
                            .for_each(|(v, b)| *v += b);
                        if ep.relu {
                            row.iter_mut().for_each(|v| *v = v.max(0.0));
                        }
                    }
                });
            })
        });
}
