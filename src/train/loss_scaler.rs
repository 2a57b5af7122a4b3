//! Dynamic loss scaling for half-precision training: [`LossScaler`].

/// Dynamic loss scaling, as PyTorch's GradScaler: multiply the loss (so the half-precision
/// gradients keep their small values) by a scale that starts at 2^16, halves and skips the
/// step when a gradient overflows, and doubles after 2000 clean steps in a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaler {
    /// The current scale (1 when disabled).
    pub scale: f32,
    /// Whether scaling (and the overflow check) is on.
    pub enabled: bool,
    clean: usize,
}

impl LossScaler {
    /// Starting scale.
    pub const INITIAL: f32 = 65536.0;
    /// Clean steps before the scale doubles.
    pub const GROWTH_INTERVAL: usize = 2000;

    /// A scaler; `enabled` for half precision.
    pub fn new(enabled: bool) -> Self {
        LossScaler {
            scale: if enabled { Self::INITIAL } else { 1.0 },
            enabled,
            clean: 0,
        }
    }

    /// A scaler continuing from a saved `(scale, clean steps)` (see [`LossScaler::state`]).
    pub fn restored(scale: f32, clean: usize) -> Self {
        LossScaler {
            scale,
            enabled: true,
            clean: clean % Self::GROWTH_INTERVAL,
        }
    }

    /// The scale and the clean steps since it last changed.
    pub fn state(&self) -> (f32, usize) {
        (self.scale, self.clean)
    }

    /// Records a step: `overflow` means it was skipped.
    pub fn update(&mut self, overflow: bool) {
        (self.scale, self.clean) =
            crate::backend::step::rescale(self.scale, self.clean, overflow, Self::GROWTH_INTERVAL);
    }
}
