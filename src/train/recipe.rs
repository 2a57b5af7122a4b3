//! Recipes: how the weights start and the optimizer behaves, with each recipe's default
//! hyper-parameters (the one place they are written: [`TrainConfig`](super::TrainConfig),
//! the command line, the examples and the tests read them from here).

/// How the weights start and the optimizer behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// The reference chapter exactly: N(0, 0.01²) weights, zero biases, plain SGD.
    Chapter,
    /// Ours: He-scaled init, SGD with momentum 0.9, cosine learning-rate decay.
    Default,
}

impl Recipe {
    /// The recipe's peak learning rate: 0.2 for the chapter's, 0.05 for ours.
    pub const fn lr(self) -> f32 {
        match self {
            Recipe::Chapter => 0.2,
            Recipe::Default => 0.05,
        }
    }

    /// The recipe's momentum: 0 (plain SGD) for the chapter's, 0.9 for ours.
    pub const fn momentum(self) -> f32 {
        match self {
            Recipe::Chapter => 0.0,
            Recipe::Default => 0.9,
        }
    }

    /// The recipe's L2 weight decay: 0 for the chapter's, 5e-4 for ours.
    pub const fn weight_decay(self) -> f32 {
        match self {
            Recipe::Chapter => 0.0,
            Recipe::Default => 5e-4,
        }
    }
}
