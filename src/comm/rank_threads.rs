//! [`on_each_rank`]: every rank of a communicator on a thread of its own, the way a
//! collective needs them (each rank waits for the others, so they must all run at once).

use thiserror::Error;

/// A rank's thread panicked (rank in communicator order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("rank {0}'s thread panicked")]
pub struct RankPanicked(pub usize);

/// Runs `f` on each of `ranks` on a scoped thread of its own, so `f` may borrow from the
/// caller, and returns the results in rank order.
///
/// ```
/// use nanoddp::backend::{cpu::CpuDevice, Memory};
/// use nanoddp::comm::communicator::{communicator, CommConfig, ReduceOp};
/// use nanoddp::comm::rank_threads::on_each_rank;
///
/// type Error = Box<dyn std::error::Error + Send + Sync>;
/// let ranks = communicator(vec![CpuDevice::new(); 3], CommConfig::default())?;
/// let sums = on_each_rank(ranks, |mut rank| -> Result<Vec<f32>, Error> {
///     let dev = *rank.device();
///     let mut grads = dev.upload(&[rank.rank() as f32 + 1.0; 5])?;
///     rank.all_reduce(&mut grads, ReduceOp::Sum, None)?;
///     Ok(dev.download(&grads)?)
/// })?;
/// for sum in sums {
///     assert_eq!(sum?, vec![6.0; 5]); // 1 + 2 + 3 on every rank
/// }
/// # Ok::<(), Error>(())
/// ```
pub fn on_each_rank<R, T, F>(ranks: Vec<R>, f: F) -> Result<Vec<T>, RankPanicked>
where
    R: Send,
    T: Send,
    F: Fn(R) -> T + Sync,
{
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|rank| scope.spawn(move || f(rank)))
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| h.join().map_err(|_| RankPanicked(i)))
            .collect()
    })
}
