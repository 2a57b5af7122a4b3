//! A training step's bookkeeping in the CPU backend's memory: what `kernels/step.cu` does on
//! a GPU, element for element (see [`Backend::gather_batch`](crate::backend::Backend) and
//! the step operations beside it for what each computes).

use super::CpuDevice;
use crate::backend::backend_impl::OpResult;
use crate::backend::op::{Checked, GatherBatch, ShardStats, StepBegin, StepEnd};
use crate::backend::step::{rescale, RECORD, STATS};
use crate::backend::Precision;

/// Gathers the shard; an index past the order or the set gives zeros and label 255.
pub(super) fn gather_batch<T: Precision>(op: Checked<GatherBatch<'_, CpuDevice, T>>) -> OpResult {
    let op = op.into_inner();
    let (image, count) = (op.image(), op.labels.0.len());
    let first = op.batch.0[0] as usize * op.shard;
    // Each image scaled in f32, then narrowed as one slice (vector conversions, not one call
    // per pixel).
    let mut scaled = vec![0.0f32; image];
    for (i, (x, y)) in op.x.0.chunks_mut(image).zip(&mut op.y.0).enumerate() {
        let k = op
            .order
            .0
            .get(first + i)
            .map_or(count, |&k| k as usize)
            .min(count);
        if k < count {
            let pixels = &op.pixels.0[k * image..(k + 1) * image];
            for (v, &p) in scaled.iter_mut().zip(pixels) {
                *v = p as f32 / 255.0;
            }
            T::narrow_slice(&scaled, x);
            *y = op.labels.0[k];
        } else {
            x.fill(T::from_f32(0.0));
            *y = u8::MAX;
        }
    }
    Ok(())
}

/// The step's scalars from the table and the loss scale.
pub(super) fn step_begin(op: Checked<StepBegin<'_, CpuDevice>>) -> OpResult {
    let op = op.into_inner();
    let b = op.batch.0[0] as usize;
    let scale = op.loss_scale.0[0];
    op.out.lr.0[0] = op.lr_table.0.get(b).copied().unwrap_or(f32::NAN);
    op.out.grad_scale.0[0] = scale / op.global as f32;
    op.out.inv_scale.0[0] = 1.0 / scale;
    Ok(())
}

/// The shard's loss sum (in double, in order), correct count and size.
pub(super) fn shard_stats(op: Checked<ShardStats<'_, CpuDevice>>) -> OpResult {
    let op = op.into_inner();
    let sum: f64 = op.loss.0.iter().map(|&l| l as f64).sum();
    let values = [sum as f32, op.correct.0[0] as f32, op.loss.0.len() as f32];
    for (o, v) in op.out.0.iter_mut().zip(values) {
        *o = if op.accumulate { *o + v } else { v };
    }
    op.correct.0[0] = 0;
    Ok(())
}

/// The step's record into the ring, the next batch, the loss scaler's update, the flag
/// cleared.
pub(super) fn step_end(op: Checked<StepEnd<'_, CpuDevice>>) -> OpResult {
    let op = op.into_inner();
    let b = op.batch.0[0];
    let at = b as usize % (op.ring.len() / RECORD) * RECORD;
    for (i, &v) in op.current.0.iter().enumerate() {
        op.ring.set(at + i, v);
    }
    op.ring.set(at + STATS, op.loss_scale.0[0]);
    op.batch.0[0] = b.wrapping_add(1);
    if let Some(found) = op.found {
        if let Some(clean) = op.clean {
            let (scale, count) = rescale(
                op.loss_scale.0[0],
                clean.0[0] as usize,
                found.0[0] != 0,
                op.growth_interval,
            );
            op.loss_scale.0[0] = scale;
            clean.0[0] = count as i32;
        }
        found.0[0] = 0;
    }
    Ok(())
}
