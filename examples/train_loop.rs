//! A training loop of your own, written against the library instead of `nanoddp train`:
//! two CPU devices, one thread and one LeNet replica each, the gradients summed by the
//! hand-rolled allreduce, plain SGD with momentum. This is `nanoddp::train::train` with
//! everything but the essentials taken out, to show the building blocks.
//!
//! `cargo run --release --example train_loop` trains 3 epochs on the 3,000-image subset
//! that ships in `tests/data/` (about 10 seconds) and checks that the loss fell and that
//! the two replicas ended bitwise identical.

use std::error::Error;

use nanoddp::data::{locate, Batches};
use nanoddp::prelude::*;
use nanoddp::train::{initial_weights, Recipe};

type AnyError = Box<dyn Error + Send + Sync>;

const DEVICES: usize = 2;
const BATCH: usize = 100; // global: each device takes 50
const EPOCHS: usize = 3;

/// One device's loop; returns its per-step mean losses (of its own shard) and final weights.
fn replica_loop(
    mut rank: Rank<CpuDevice>,
    data: &Dataset,
    weights: &[Vec<f32>],
) -> Result<(Vec<f64>, Vec<Vec<f32>>), AnyError> {
    let dev = *rank.device();
    let mut replica = Replica::<CpuDevice>::new(dev, weights)?;
    let mut losses = Vec::new();
    for epoch in 0..EPOCHS as u64 {
        // Every rank computes the same seeded order and takes its own shard of each batch.
        let batches = Batches::new(data.train_labels.len(), BATCH, true, 1, epoch);
        for b in 0..batches.len() {
            let shards = batches.shards(b, rank.size());
            let global: usize = shards.iter().map(|s| s.indices.len()).sum();
            let mine = &shards[rank.rank()].indices;
            let pixels = data.train_images.rows * data.train_images.cols;
            let images: Vec<u8> = mine
                .iter()
                .flat_map(|&i| data.train_images.pixels[i * pixels..(i + 1) * pixels].to_vec())
                .collect();
            let labels: Vec<u8> = mine.iter().map(|&i| data.train_labels[i]).collect();
            // Forward and backward: gradients of (1/global)·Σ loss over this shard, so that
            // summing them over the ranks gives the global batch's mean-loss gradient.
            let stats = replica.step(&images, &labels, Some(1.0 / global as f32))?;
            for g in &mut replica.grads {
                rank.all_reduce(g, ReduceOp::Sum, None)?;
            }
            replica.update(
                SgdStep {
                    // Our recipe's constant peak rate and momentum, without its weight decay.
                    lr: Recipe::Default.lr(),
                    inv_scale: 1.0,
                    momentum: Recipe::Default.momentum(),
                    weight_decay: 0.0,
                },
                None,
                None,
            )?;
            losses.push(stats.loss_sum / stats.count.max(1) as f64);
        }
    }
    Ok((losses, replica.weights()?))
}

fn main() -> Result<(), AnyError> {
    let data = locate::load(&locate::shipped_subset())?;
    let weights = initial_weights(Recipe::Default, 0);
    let ranks = communicator(vec![CpuDevice::new(); DEVICES], CommConfig::default())?;
    let results = on_each_rank(ranks, |rank| replica_loop(rank, &data, &weights))?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let (losses, first) = &results[0];
    let steps_per_epoch = losses.len() / EPOCHS;
    for (e, chunk) in losses.chunks(steps_per_epoch).enumerate() {
        let mean = chunk.iter().sum::<f64>() / chunk.len() as f64;
        println!("epoch {}: mean loss of rank 0's shards {mean:.4}", e + 1);
    }
    let start = losses[..10].iter().sum::<f64>() / 10.0;
    let end = losses[losses.len() - 10..].iter().sum::<f64>() / 10.0;
    if end > 0.8 * start {
        return Err(format!("the loss did not fall: {start:.3} -> {end:.3}").into());
    }
    if results.iter().any(|(_, w)| w != first) {
        return Err("the replicas diverged".into());
    }
    println!(
        "loss {start:.3} -> {end:.3}; both replicas hold bitwise identical weights ({} parameters)",
        first.iter().map(Vec::len).sum::<usize>()
    );
    Ok(())
}
