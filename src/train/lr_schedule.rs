//! The learning-rate schedule of each recipe.

use super::{Recipe, TrainConfig};

/// The learning rate of `step` (0-based) of `total`.
pub fn learning_rate(cfg: &TrainConfig, step: usize, total: usize) -> f32 {
    match cfg.recipe {
        Recipe::Chapter => cfg.lr,
        // Cosine decay to zero over the run: large steps early, fine ones at the end.
        Recipe::Default => {
            let t = step as f64 / total.max(1) as f64;
            (cfg.lr as f64 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())) as f32
        }
    }
}
