//! What a training step keeps in device memory so that the host neither feeds it nor waits
//! for it: the step's scalars ([`StepScalars`]) that [`Backend::step_begin`] writes and the
//! loss and optimizer kernels read as they run, and the layout of a shard's statistics
//! ([`STATS`]) that [`Backend::shard_stats`] writes. The kernels are `kernels/step.cu`.
//!
//! A value in device memory, unlike a kernel argument, may change between two replays of a
//! captured CUDA graph: that is why these live here.
//!
//! [`Backend::step_begin`]: super::Backend::step_begin
//! [`Backend::shard_stats`]: super::Backend::shard_stats

use super::{BackendError, Memory};

/// Values in a shard's statistics, in order: the sum of the per-example losses, the examples
/// classified correctly, the examples (all as f32: exact up to 2^24 examples).
pub const STATS: usize = 3;

/// Values in a step's record in [`Backend::step_end`](super::Backend::step_end)'s ring: the
/// step's statistics ([`STATS`]), then the loss scale it ran with.
pub const RECORD: usize = STATS + 1;

/// A step's scalars in device memory, one element each: written by
/// [`Backend::step_begin`](super::Backend::step_begin), read when they run by
/// [`Backend::softmax_cross_entropy`](super::Backend::softmax_cross_entropy) (`grad_scale`)
/// and [`Backend::sgd_step`](super::Backend::sgd_step) (`lr`, `inv_scale`) when given them.
pub struct StepScalars<B: Memory> {
    /// The learning rate.
    pub lr: B::Buffer<f32>,
    /// The loss's gradient factor: the loss scale over the global batch.
    pub grad_scale: B::Buffer<f32>,
    /// 1 / the loss scale, applied to the gradients before the update.
    pub inv_scale: B::Buffer<f32>,
}

impl<B: Memory> StepScalars<B> {
    /// Zeroed scalars on `dev`.
    pub fn new(dev: &B) -> Result<Self, BackendError> {
        Ok(StepScalars {
            lr: dev.alloc_zeros(1)?,
            grad_scale: dev.alloc_zeros(1)?,
            inv_scale: dev.alloc_zeros(1)?,
        })
    }

    /// Checks that each holds one element (scalars built by hand may not).
    pub(crate) fn check(&self, op: &'static str) -> Result<(), BackendError> {
        use super::DeviceBuffer;
        for (name, b) in [
            ("lr", &self.lr),
            ("grad_scale", &self.grad_scale),
            ("inv_scale", &self.inv_scale),
        ] {
            super::check::expect_len(op, name, b.len(), 1)?;
        }
        Ok(())
    }
}

/// Dynamic loss scaling's rule for one step, as PyTorch's GradScaler: on an `overflow` the
/// scale halves (not below 1) and the clean-step count restarts; otherwise the count grows
/// and the scale doubles after `growth_interval` clean steps in a row. Returns the new
/// `(scale, clean)`. `kernels/step.cu`'s `step_end` applies the same rule on the device.
pub fn rescale(scale: f32, clean: usize, overflow: bool, growth_interval: usize) -> (f32, usize) {
    if overflow {
        ((scale / 2.0).max(1.0), 0)
    } else if clean + 1 == growth_interval {
        (scale * 2.0, 0)
    } else {
        (scale, clean + 1)
    }
}

/// Words per tensor in a [`TensorTable`]: its weights', gradient's, velocity's (0: none) and
/// weight copy's (0: none) addresses, then its length (`TENSOR_WORDS` in `kernels/optim.cu`).
pub const TENSOR_WORDS: usize = 5;

/// A table in device memory of the tensors one launch updates
/// ([`Backend::sgd_step_many`](super::Backend::sgd_step_many),
/// [`Backend::grad_check_many`](super::Backend::grad_check_many)): [`TENSOR_WORDS`] words
/// per tensor. It is rewritten only when the tensors' addresses change, so a step that
/// passes the buffers it kept for the run copies nothing (and can be captured).
pub struct TensorTable<B: Memory> {
    pub(crate) table: B::Buffer<u64>,
    /// What `table` holds now.
    written: Vec<u64>,
}

impl<B: Memory> TensorTable<B> {
    /// Room for `tensors` tensors on `dev`.
    pub fn new(dev: &B, tensors: usize) -> Result<Self, BackendError> {
        Ok(TensorTable {
            table: dev.alloc_zeros(tensors.max(1) * TENSOR_WORDS)?,
            written: Vec::new(),
        })
    }

    /// Tensors it has room for.
    pub fn capacity(&self) -> usize {
        super::DeviceBuffer::len(&self.table) / TENSOR_WORDS
    }

    /// Makes the table hold `words` (whole tensors, at most its capacity), copying them only
    /// when they differ from what it holds.
    pub(crate) fn point(&mut self, dev: &B, words: &[u64]) -> Result<(), BackendError> {
        if self.written == words {
            return Ok(());
        }
        let mut padded = vec![0u64; super::DeviceBuffer::len(&self.table)];
        padded[..words.len()].copy_from_slice(words);
        dev.write(&padded, &mut self.table)?;
        self.written = words.to_vec();
        Ok(())
    }
}
