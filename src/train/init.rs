//! The starting point of a run: seeded initial weights (splitmix64 and Box-Muller, the same
//! on every device) and a fresh start from given weights.

use super::{checkpoint, Recipe};
use crate::model::PARAMS;

/// splitmix64: the seeded generator of the initial weights.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A standard normal draw (Box-Muller).
fn normal(state: &mut u64) -> f64 {
    let u1 = ((splitmix(state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (splitmix(state) >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Initial weights for `recipe`, one vector per tensor of [`PARAMS`]; the same on every device.
pub fn initial_weights(recipe: Recipe, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed ^ 0x5eed_1e7e_0000_0000;
    PARAMS
        .iter()
        .map(|p| {
            let std = match (recipe, p.fan_in) {
                (_, 0) => 0.0, // biases start at zero
                (Recipe::Chapter, _) => 0.01,
                (Recipe::Default, fan_in) => (2.0 / fan_in as f64).sqrt(), // He: keeps ReLU activations' scale
            };
            (0..p.len())
                .map(|_| (normal(&mut state) * std) as f32)
                .collect()
        })
        .collect()
}

/// A fresh start from `weights`.
pub fn from_weights(weights: Vec<Vec<f32>>) -> checkpoint::Checkpoint {
    checkpoint::Checkpoint {
        weights,
        velocity: None,
        epoch: 0,
        step: 0,
        loss_scale: None,
        settings: Vec::new(),
    }
}
