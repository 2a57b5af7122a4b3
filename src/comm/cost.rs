//! Choosing an algorithm by size: a latency + bandwidth (α-β) model per algorithm.
//!
//! time ≈ rounds · α + traffic / (min(n, cores) · β)
//!
//! * α is the cost of one dependent step: raising a flag and a peer seeing it (spin, yield or
//!   a futex wake when ranks outnumber cores);
//! * β is the bytes/s one core streams when it reads and writes memory (copy bandwidth);
//! * traffic is the bytes all ranks read and write together; rounds the longest chain of
//!   dependent steps.
//!
//! The defaults were measured on this project's 2-core build machine with
//! `nanoddp bench allreduce` (α: the 4-byte allreduce time divided by its rounds; β: the
//! memory copy bandwidth the bench prints); `CostModel::measured` re-measures β.

use super::schedule::Algorithm;

/// The model's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Seconds per dependent step.
    pub alpha: f64,
    /// Bytes per second one core streams (read + write).
    pub beta: f64,
    /// Cores the ranks share.
    pub cores: usize,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            alpha: 2e-6,
            beta: 20e9,
            cores: std::thread::available_parallelism().map_or(1, |c| c.get()),
        }
    }
}

impl CostModel {
    /// The default α with β measured now (a 256 MiB copy, median of five).
    pub fn measured() -> Self {
        CostModel {
            beta: crate::system::copy_bandwidth(64 << 20),
            ..CostModel::default()
        }
    }

    /// Predicted seconds for an allreduce of `bytes` over `n` ranks.
    pub fn predict(&self, algorithm: Algorithm, n: usize, bytes: usize) -> f64 {
        if n <= 1 {
            return self.alpha;
        }
        let (nf, s) = (n as f64, bytes as f64);
        let depth = (usize::BITS - (n - 1).leading_zeros()) as f64; // ⌈log2 n⌉
        let (rounds, traffic) = match algorithm {
            // Each rank reads every input and writes its output.
            Algorithm::OneShot => (1.0, nf * (nf * s + s)),
            // Read its chunk of every input, write it to every output: S + S per rank.
            Algorithm::Direct => (1.0, nf * 2.0 * s),
            // Reduce-scatter reads two chunks and writes one per step; all-gather copies.
            Algorithm::Ring => (2.0 * (nf - 1.0), nf * (5.0 * s * (nf - 1.0) / nf)),
            // Interior nodes read three halves and write one, then copy down.
            Algorithm::Tree => (2.0 * depth, nf * 3.0 * s),
        };
        let parallel = n.min(self.cores.max(1)) as f64;
        rounds * self.alpha + traffic / (parallel * self.beta)
    }

    /// The algorithm with the smallest predicted time.
    pub fn choose(&self, n: usize, bytes: usize) -> Algorithm {
        Algorithm::ALL
            .into_iter()
            .min_by(|a, b| {
                self.predict(*a, n, bytes)
                    .total_cmp(&self.predict(*b, n, bytes))
            })
            .unwrap_or(Algorithm::Direct)
    }
}
