//! Epochs of global batches, each cut into one shard per device.

/// A global batch's share for one device: indices into the data set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Image indices, in order.
    pub indices: Vec<usize>,
}

/// The batches of one epoch.
#[derive(Debug, Clone)]
pub struct Batches {
    order: Vec<usize>,
    batch: usize,
}

/// A small, seedable, well-mixed generator (splitmix64), so data order depends only on the
/// seed: no dependency, and the same order on every platform.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Batches {
    /// `count` examples in batches of `batch` (the last one partial), shuffled by a
    /// Fisher-Yates pass seeded by (seed, epoch), or in file order when `shuffle` is false.
    pub fn new(count: usize, batch: usize, shuffle: bool, seed: u64, epoch: u64) -> Self {
        let mut order: Vec<usize> = (0..count).collect();
        if shuffle {
            let mut s = seed ^ epoch.wrapping_mul(0xd6e8_feb8_6659_fd93);
            for i in (1..count).rev() {
                let j = (splitmix(&mut s) % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        Batches {
            order,
            batch: batch.max(1),
        }
    }

    /// Number of batches.
    pub fn len(&self) -> usize {
        self.order.len().div_ceil(self.batch)
    }

    /// True when there is no batch.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Batch `b` cut into `devices` shards whose sizes differ by at most one (the first
    /// `len % devices` get one more); a device may get an empty shard on a tiny last batch.
    pub fn shards(&self, b: usize, devices: usize) -> Vec<Shard> {
        let start = b * self.batch;
        let batch = &self.order[start..(start + self.batch).min(self.order.len())];
        let (base, extra) = (batch.len() / devices, batch.len() % devices);
        let mut at = 0;
        (0..devices)
            .map(|d| {
                let n = base + usize::from(d < extra);
                let shard = Shard {
                    indices: batch[at..at + n].to_vec(),
                };
                at += n;
                shard
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_once_per_epoch_in_shards_that_differ_by_one() {
        for (count, batch, devices) in [(1000, 256, 3), (7, 4, 4), (257, 256, 2), (5, 10, 8)] {
            let b = Batches::new(count, batch, true, 42, 3);
            let mut seen = vec![0; count];
            for i in 0..b.len() {
                let shards = b.shards(i, devices);
                let sizes: Vec<usize> = shards.iter().map(|s| s.indices.len()).collect();
                assert!(
                    sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
                    "{sizes:?}"
                );
                for s in shards {
                    for j in s.indices {
                        seen[j] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1));
        }
        let a = Batches::new(100, 10, true, 1, 0);
        assert_eq!(
            a.order,
            Batches::new(100, 10, true, 1, 0).order,
            "same seed, same order"
        );
        assert_ne!(
            a.order,
            Batches::new(100, 10, true, 1, 1).order,
            "each epoch reshuffles"
        );
        assert_eq!(Batches::new(5, 2, false, 9, 9).order, vec![0, 1, 2, 3, 4]);
    }
}
