//! Test helpers shared by the GEMM tiles' unit tests: the paths to test, random operands,
//! and a float64 check of a product.

use rand::{Rng, SeedableRng};

/// The tile paths this CPU can run: the portable one, and the AVX-512 one where present.
pub(super) fn tile_paths() -> &'static [bool] {
    if super::isa::isa().avx512 {
        &[false, true]
    } else {
        &[false]
    }
}

/// The tests' random numbers, reproducible from `seed`.
pub(super) fn seeded(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// `n` values uniform in [-1, 1).
pub(super) fn uniform(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

/// `c0` with each row's padding (columns `n..ldc`) set to NaN, to catch stray writes.
pub(super) fn poisoned(c0: &[f32], n: usize, ldc: usize) -> Vec<f32> {
    let mut c = c0.to_vec();
    for row in c.chunks_mut(ldc) {
        row[n..].fill(f32::NAN);
    }
    c
}

/// Asserts that every `c[i·ldc + j]` (i < m, j < n) equals the float64 sum of `c0`'s element
/// (when `accumulate`) and `term(i, j, k)` over k < depth, within 1e-6 + 2e-6 · Σ|terms|,
/// and that C's padding (columns n..ldc, poisoned by [`poisoned`]) is still NaN.
#[allow(clippy::too_many_arguments)]
pub(super) fn assert_product(
    c: &[f32],
    c0: &[f32],
    (m, n, ldc): (usize, usize, usize),
    depth: usize,
    accumulate: bool,
    term: impl Fn(usize, usize, usize) -> f64,
    what: &str,
) {
    for i in 0..m {
        for j in 0..n {
            let mut want = if accumulate {
                c0[i * ldc + j] as f64
            } else {
                0.0
            };
            let mut mag = want.abs();
            for k in 0..depth {
                let t = term(i, j, k);
                want += t;
                mag += t.abs();
            }
            let got = c[i * ldc + j] as f64;
            assert!(
                (got - want).abs() <= 1e-6 + 2e-6 * mag,
                "{what} accumulate {accumulate} at ({i}, {j}): {got} vs {want}"
            );
        }
        let pad = &c[i * ldc + n..(i + 1) * ldc];
        assert!(
            pad.iter().all(|v| v.is_nan()),
            "{what}: wrote past column {n}"
        );
    }
}

/// Runs `run(avx512, c, accumulate)` on every tile path, overwriting and accumulating into
/// a copy of `c0` with its padding poisoned, and checks each result with [`assert_product`].
pub(super) fn check_on_paths(
    c0: &[f32],
    (m, n, ldc): (usize, usize, usize),
    depth: usize,
    term: impl Fn(usize, usize, usize) -> f64,
    what: &str,
    mut run: impl FnMut(bool, &mut [f32], bool),
) {
    for &avx in tile_paths() {
        for accumulate in [false, true] {
            let mut c = poisoned(c0, n, ldc);
            run(avx, &mut c, accumulate);
            let what = format!("{what} avx512 {avx}");
            assert_product(&c, c0, (m, n, ldc), depth, accumulate, &term, &what);
        }
    }
}
