//! Pairwise (binary-tree) summation for the reductions whose length grows with the batch.
//!
//! A left-to-right f32 sum of N terms carries each rounding error through every later
//! addition, so its error bound grows like N·ε; summing two halves and adding them, all the
//! way down, bounds it by log₂N·ε. The register tiles already split their products into
//! fixed blocks (16 lanes, a group of images); what is left to sum is one partial per block
//! of images, and the number of those grows with the batch: they are added here, as a tree.
//! The tree's shape depends only on the number of parts, never on the threads, so results
//! stay bitwise reproducible.

/// A pairwise sum of parts that arrive one at a time, holding at most log₂(count) + 1 of
/// them: part i is added to the pending part of its level, and the sum carried up, as a
/// binary counter carries: a balanced tree for a power-of-two count.
/// Taken parts are handed back by [`Cascade::spare`] for reuse.
#[derive(Default)]
pub(super) struct Cascade {
    /// The pending sum of 2^level parts, per level.
    levels: Vec<Option<Vec<f32>>>,
    spares: Vec<Vec<f32>>,
}

impl Cascade {
    /// A buffer of `len` elements to compute the next part in: one handed back earlier, or
    /// new (its contents are not cleared).
    pub(super) fn spare(&mut self, len: usize) -> Vec<f32> {
        let mut v = self.spares.pop().unwrap_or_default();
        v.resize(len, 0.0);
        v
    }

    /// Adds the next part.
    ///
    /// # Panics
    /// If it differs in length from the parts before it.
    pub(super) fn push(&mut self, part: Vec<f32>) {
        let mut carry = part;
        for level in 0.. {
            if level == self.levels.len() {
                self.levels.push(None);
            }
            match self.levels[level].take() {
                None => {
                    self.levels[level] = Some(carry);
                    return;
                }
                Some(mut earlier) => {
                    assert_eq!(earlier.len(), carry.len(), "parts of different lengths");
                    earlier.iter_mut().zip(&carry).for_each(|(e, c)| *e += c);
                    self.spares.push(carry);
                    carry = earlier;
                }
            }
        }
    }

    /// The sum of `parts` written to `out` (zeros for no parts).
    ///
    /// # Panics
    /// If a part's length differs from `out`'s.
    pub(super) fn sum_into(parts: impl IntoIterator<Item = Vec<f32>>, out: &mut [f32]) {
        let mut c = Cascade::default();
        parts.into_iter().for_each(|p| c.push(p));
        match c.total() {
            Some(total) => out.copy_from_slice(&total),
            None => out.fill(0.0),
        }
    }

    /// The sum of every part pushed (None if there was none): the pending levels, the
    /// smallest (latest) first.
    pub(super) fn total(self) -> Option<Vec<f32>> {
        let mut pending = self.levels.into_iter().flatten();
        let mut total = pending.next()?;
        for earlier in pending {
            total.iter_mut().zip(&earlier).for_each(|(t, e)| *t += e);
        }
        Some(total)
    }
}

/// Blocks summed in order at the tree's leaves: short enough that their error stays at a
/// few ulps, long enough that the recursion costs nothing.
const LEAF: usize = 8;

/// `Σ v` as a binary tree over blocks of [`LEAF`] terms.
pub(super) fn pairwise_sum(v: &[f32]) -> f32 {
    if v.len() <= LEAF {
        return v.iter().sum();
    }
    let (left, right) = v.split_at(v.len() / 2);
    pairwise_sum(left) + pairwise_sum(right)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2^24 + 1 ones: a left-to-right f32 sum sticks at 2^24 (adding 1 to 2^24 rounds back
    /// to it), the tree is exact.
    #[test]
    fn the_tree_keeps_digits_a_running_sum_loses() {
        let ones = vec![1.0f32; (1 << 24) + 1];
        assert_eq!(ones.iter().sum::<f32>(), 16_777_216.0);
        assert_eq!(pairwise_sum(&ones), 16_777_217.0);
    }

    #[test]
    fn the_cascade_counts_every_part_once_and_keeps_digits() {
        for n in 0..40usize {
            let mut c = Cascade::default();
            for i in 0..n {
                let mut part = c.spare(2);
                part.copy_from_slice(&[i as f32, 1.0]);
                c.push(part);
            }
            let want = (n > 0).then(|| vec![(n * (n - 1) / 2) as f32, n as f32]);
            assert_eq!(c.total(), want, "{n} parts");
        }
        // Parts 2^24, 0, 1, 1 in order lose both ones (each rounds back to even 2^24);
        // (2^24 + 0) + (1 + 1) keeps them.
        let mut c = Cascade::default();
        for v in [16_777_216.0f32, 0.0, 1.0, 1.0] {
            c.push(vec![v]);
        }
        assert_eq!(c.total(), Some(vec![16_777_218.0]));
        let mut out = [f32::NAN; 2];
        Cascade::sum_into([], &mut out);
        assert_eq!(out, [0.0; 2], "no parts: zeros");
    }

    #[test]
    fn every_term_is_counted_once_for_any_count() {
        for n in 0..40 {
            let v: Vec<f32> = (0..n * 7).map(|i| i as f32).collect();
            assert_eq!(pairwise_sum(&v), v.iter().sum::<f32>(), "{} terms", v.len());
        }
    }
}
