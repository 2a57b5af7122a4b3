//! Test helpers shared by the GEMM tiles' unit tests: random operands and a float64 check of
//! a product.

use half::bf16;
use rand::{Rng, SeedableRng};

use super::pairs::{pairs, PairImage, PairWindows};

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

/// [`assert_product`] on what `run(c, accumulate)` writes over a poisoned copy of `c0`,
/// overwriting and accumulating.
pub(super) fn check_product(
    c0: &[f32],
    (m, n, ldc): (usize, usize, usize),
    depth: usize,
    term: &impl Fn(usize, usize, usize) -> f64,
    what: &str,
    mut run: impl FnMut(&mut [f32], bool),
) {
    for accumulate in [false, true] {
        let mut c = poisoned(c0, n, ldc);
        run(&mut c, accumulate);
        assert_product(&c, c0, (m, n, ldc), depth, accumulate, term, what);
    }
}

/// Offsets of `n` taps of conv2's filter in its 13 x 13 input planes (5-wide rows).
pub(super) fn conv2_taps(n: usize) -> Vec<usize> {
    (0..n)
        .map(|t| (t / 25) * 169 + (t / 5 % 5) * 13 + t % 5)
        .collect()
}

/// Offsets of `n` of conv2's output pixels (9 x 9 per image) in its images, two planes apart.
pub(super) fn conv2_pixels(n: usize) -> Vec<usize> {
    (0..n)
        .map(|p| (p / 81) * 338 + (p % 81 / 9) * 13 + p % 9)
        .collect()
}

/// The bf16 window products' check (`vdpbf16ps` and AMX): for each case (columns, rows,
/// steps), random bf16 images in which every element no step reads is inf (a single's
/// partner must not leak in) and a random bf16 W (`columns` rows of `steps.len()` values, 3
/// more apart); `product(windows, w, (columns, ld), c, ldc, accumulate)` packs W for its
/// engine and multiplies, overwriting (blocks of 3 pairs) and accumulating (one block) into C with its
/// padding poisoned; [`assert_product`] checks it against float64.
#[allow(clippy::type_complexity)]
pub(super) fn check_pair_product(
    seed: u64,
    cases: &[(usize, &[usize], &[usize])],
    mut product: impl FnMut(&PairWindows, &[u16], (usize, usize), &mut [f32], usize, bool),
) {
    let mut rng = seeded(seed);
    let bf = |v: f32| bf16::from_f32(v).to_bits();
    let value = |b: u16| f64::from(bf16::from_bits(b).to_f32());
    for &(cols, rows, steps) in cases {
        let (n, depth) = (rows.len(), steps.len());
        let len = rows.iter().max().unwrap() + steps.iter().max().unwrap() + 2;
        let read: std::collections::HashSet<usize> = rows
            .iter()
            .flat_map(|r| steps.iter().map(move |s| r + s))
            .collect();
        let x: Vec<u16> = (0..len)
            .map(|i| match read.contains(&i) {
                true => bf(rng.gen_range(-1.0..1.0)),
                false => bf16::INFINITY.to_bits(),
            })
            .collect();
        let ld = depth + 3;
        let w: Vec<u16> = (0..cols * ld)
            .map(|_| bf(rng.gen_range(-1.0..1.0)))
            .collect();
        let grouped = pairs(steps);
        let src = PairImage::default().build(&x).to_vec();
        let ldc = n + 2;
        let c0 = uniform(&mut rng, cols * ldc);
        for (accumulate, block) in [(false, 3), (true, usize::MAX)] {
            let windows = PairWindows {
                src: &src,
                rows,
                pairs: &grouped,
                block,
            };
            let mut c = poisoned(&c0, n, ldc);
            product(&windows, &w, (cols, ld), &mut c, ldc, accumulate);
            let term =
                |o: usize, r: usize, k: usize| value(w[o * ld + k]) * value(x[rows[r] + steps[k]]);
            let what = format!("{cols} x {n} x {depth} block {block}");
            assert_product(&c, &c0, (cols, n, ldc), depth, accumulate, term, &what);
        }
    }
}
