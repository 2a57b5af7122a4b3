//! Four in-process devices, one thread each, summing their buffers with ring and tree
//! allreduce; every rank's result is checked exactly.
//!
//! `cargo run --release --example allreduce [COUNT]` (default 1,000,003, a prime). Inputs
//! are small integers, so every sum is exact in f32 whatever the order of additions: any
//! difference is a bug, not rounding.

use std::error::Error;

use nanoddp::prelude::*;

type AnyError = Box<dyn Error + Send + Sync>;

fn main() -> Result<(), AnyError> {
    let count: usize = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| format!("not a count: {a}"))?,
        None => 1_000_003,
    };
    const RANKS: usize = 4;
    // Rank r holds x_r[i] = (r + 1) · (i mod 7): the sum is 10 · (i mod 7).
    let expected: Vec<f32> = (0..count).map(|i| (10 * (i % 7)) as f32).collect();
    for algorithm in [Algorithm::Ring, Algorithm::Tree] {
        let ranks = communicator(vec![CpuDevice::new(); RANKS], CommConfig::default())?;
        let start = std::time::Instant::now();
        let results = on_each_rank(ranks, |mut rank| -> Result<Vec<f32>, AnyError> {
            let dev = *rank.device();
            let r = rank.rank();
            let input: Vec<f32> = (0..count).map(|i| ((r + 1) * (i % 7)) as f32).collect();
            let mut x = dev.upload(&input)?;
            rank.all_reduce(&mut x, ReduceOp::Sum, Some(algorithm))?;
            Ok(dev.download(&x)?)
        })?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let seconds = start.elapsed().as_secs_f64();
        for (r, got) in results.iter().enumerate() {
            if let Some(i) = (0..count).find(|&i| got[i] != expected[i]) {
                return Err(format!(
                    "{algorithm:?}: rank {r} element {i} is {}, expected {}",
                    got[i], expected[i]
                )
                .into());
            }
        }
        println!(
            "{:<5} {RANKS} ranks x {count} floats: every rank exact ({:.1} ms including setup)",
            algorithm.name(),
            seconds * 1e3
        );
    }
    Ok(())
}
