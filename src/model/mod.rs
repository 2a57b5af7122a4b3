//! LeNet, as the reference chapter builds it, on any [`Backend`]:
//!
//! ```text
//! x 1x28x28 → conv 20@3x3 + ReLU → avg-pool 2 → conv 50@5x5 + ReLU → avg-pool 2
//!           → flatten 800 → linear 128 + ReLU → linear 10 → softmax cross-entropy
//! ```
//!
//! Every size derives from one description, [`LENET`] (`architecture.rs`): the layer
//! shapes, the activation buffers, the parameter table [`PARAMS`] and the order
//! [`BACKWARD_ORDER`] in which the backward pass finishes it.
//!
//! One [`Replica`] per device holds the parameters, their gradients, the optimizer state and
//! the activations of the current shard. Parameters are named and laid out as PyTorch does
//! (conv OIHW, linear out x in), so checkpoints load into `torch.nn` directly.

use std::any::Any;

use crate::backend::op::{BeginStep, HeadGradient, SgdTensor};
use crate::backend::{
    Backend, BackendError, Conv2dShape, Epilogue, Pool2dShape, Precision, SgdStep, StepScalars,
    TensorTable, STATS,
};

mod architecture;

pub use architecture::{Architecture, ConvLayer, Linear, LENET};

/// Input image side.
pub const IMAGE: usize = LENET.image;
/// Classes.
pub const CLASSES: usize = LENET.classes;

/// A parameter tensor: name and PyTorch shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    /// PyTorch name, e.g. `conv1.weight`.
    pub name: &'static str,
    /// Shape, PyTorch layout.
    pub shape: &'static [usize],
    /// Inputs feeding one output (for He initialisation); 0 for biases.
    pub fan_in: usize,
}

impl ParamSpec {
    /// A tensor of `shape` whose outputs each read `fan_in` inputs (0 for a bias).
    const fn new(name: &'static str, shape: &'static [usize], fan_in: usize) -> Self {
        ParamSpec {
            name,
            shape,
            fan_in,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for an empty tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The layers with parameters, in forward order; layer `l`'s weight is [`PARAMS`]`[2l]`
/// and its bias `[2l + 1]`.
const LAYERS: usize = 4;
const CONV1: usize = 0;
const CONV2: usize = 1;
const FC1: usize = 2;
const FC2: usize = 3;
const fn weight(layer: usize) -> usize {
    2 * layer
}
const fn bias(layer: usize) -> usize {
    2 * layer + 1
}

/// The order in which the backward pass finishes the gradient tensors (indices into
/// [`PARAMS`]): the last layer's first, each layer's weight before its bias.
pub const BACKWARD_ORDER: [usize; 2 * LAYERS] = {
    let mut order = [0; 2 * LAYERS];
    let mut i = 0;
    while i < LAYERS {
        let layer = LAYERS - 1 - i;
        order[2 * i] = weight(layer);
        order[2 * i + 1] = bias(layer);
        i += 1;
    }
    order
};

const C1: ConvLayer = LENET.conv1;
const C2: ConvLayer = LENET.conv2;

/// The eight parameter tensors, in checkpoint order, with their shapes from [`LENET`].
pub const PARAMS: [ParamSpec; 2 * LAYERS] = [
    ParamSpec::new(
        "conv1.weight",
        &[C1.out_c, LENET.in_c, C1.kernel, C1.kernel],
        LENET.in_c * C1.kernel * C1.kernel,
    ),
    ParamSpec::new("conv1.bias", &[C1.out_c], 0),
    ParamSpec::new(
        "conv2.weight",
        &[C2.out_c, C1.out_c, C2.kernel, C2.kernel],
        C1.out_c * C2.kernel * C2.kernel,
    ),
    ParamSpec::new("conv2.bias", &[C2.out_c], 0),
    ParamSpec::new(
        "fc1.weight",
        &[LENET.hidden, LENET.features()],
        LENET.features(),
    ),
    ParamSpec::new("fc1.bias", &[LENET.hidden], 0),
    ParamSpec::new("fc2.weight", &[LENET.classes, LENET.hidden], LENET.hidden),
    ParamSpec::new("fc2.bias", &[LENET.classes], 0),
];

/// The shape of conv1 at `batch` images (see [`Architecture::conv1`]).
pub fn conv1(batch: usize) -> Conv2dShape {
    LENET.conv1(batch)
}
/// The shape of pool1 (see [`Architecture::pool1`]).
pub fn pool1(batch: usize) -> Pool2dShape {
    LENET.pool1(batch)
}
/// The shape of conv2 (see [`Architecture::conv2`]).
pub fn conv2(batch: usize) -> Conv2dShape {
    LENET.conv2(batch)
}
/// The shape of pool2 (see [`Architecture::pool2`]).
pub fn pool2(batch: usize) -> Pool2dShape {
    LENET.pool2(batch)
}

/// Activations of one shard size.
struct Activations<B: Backend, T: Precision> {
    batch: usize,
    x: B::Buffer<T>,
    labels: B::Buffer<u8>,
    /// conv1's ReLU output and the workspace of its backward (each conv1's output size),
    /// where the backend does not recompute the ReLU's output ([`Backend::recomputes_relu`]).
    c1: Option<(B::Buffer<T>, B::Buffer<T>)>,
    p1: B::Buffer<T>,
    c2: B::Buffer<T>,
    p2: B::Buffer<T>,
    h: B::Buffer<T>,
    logits: B::Buffer<T>,
    loss: B::Buffer<f32>,
    /// The shard's statistics ([`STATS`]) when the caller keeps none.
    stats: B::Buffer<f32>,
    // Gradients flowing back (after each ReLU's mask).
    d_logits: B::Buffer<T>,
    d_h: B::Buffer<T>,
    d_p2: B::Buffer<T>,
    /// conv2's output gradient, where a backend that does not fuse its backward holds it.
    d_c2: B::Buffer<T>,
    d_p1: B::Buffer<T>,
}

impl<B: Backend, T: Precision> Activations<B, T> {
    fn new(dev: &B, batch: usize) -> Result<Self, BackendError> {
        let f = |n| dev.alloc_zeros::<T>(n);
        let (x, _, c1) = conv1(batch).sizes();
        let keep_c1 = !dev.recomputes_relu(&conv1(batch), &pool1(batch));
        let (p1, _, c2) = conv2(batch).sizes();
        let (hidden, classes) = (batch * LENET.hidden, batch * CLASSES);
        let p2 = pool2(batch).sizes().1;
        Ok(Activations {
            batch,
            x: f(x)?,
            labels: dev.alloc_zeros::<u8>(batch)?,
            c1: keep_c1.then(|| Ok((f(c1)?, f(c1)?))).transpose()?,
            p1: f(p1)?,
            c2: f(c2)?,
            p2: f(p2)?,
            h: f(hidden)?,
            logits: f(classes)?,
            loss: dev.alloc_zeros::<f32>(batch)?,
            stats: dev.alloc_zeros::<f32>(STATS)?,
            d_logits: f(classes)?,
            d_h: f(hidden)?,
            d_p2: f(p2)?,
            d_c2: f(c2)?,
            d_p1: f(p1)?,
        })
    }
}

/// Totals of a forward pass over one shard.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ShardStats {
    /// Sum of the per-example losses.
    pub loss_sum: f64,
    /// Examples classified correctly.
    pub correct: usize,
    /// Examples.
    pub count: usize,
}

/// One device's copy of the model, with activations stored as `T`.
pub struct Replica<B: Backend, T: Precision = f32> {
    /// The device.
    pub dev: B,
    /// Parameters (f32 master weights), one buffer per tensor of [`PARAMS`].
    pub params: Vec<B::Buffer<f32>>,
    /// For half activations, the half copy of the weights that the forward and backward
    /// passes read (the optimizer writes it); f32 activations read the master weights.
    half: Option<Vec<B::Buffer<T>>>,
    /// Gradients (f32), same layout.
    pub grads: Vec<B::Buffer<f32>>,
    /// Momentum buffers, same layout.
    pub velocity: Vec<B::Buffer<f32>>,
    /// The tensors' addresses for the one-launch update and overflow check, written at the
    /// first step (and again only if a buffer above is replaced).
    update_table: TensorTable<B>,
    check_table: TensorTable<B>,
    /// Activations per shard size met so far (a run meets two: the full batch's shard and
    /// an epoch's last; evaluation may add its own). Each is kept for the run, so work
    /// captured in a graph keeps pointing at live buffers.
    acts: Vec<Activations<B, T>>,
}

/// The activations for a shard of `n` images, made the first time that size comes.
fn shaped<'a, B: Backend, T: Precision>(
    dev: &B,
    acts: &'a mut Vec<Activations<B, T>>,
    n: usize,
) -> Result<&'a mut Activations<B, T>, BackendError> {
    let at = match acts.iter().position(|a| a.batch == n) {
        Some(at) => at,
        None => {
            acts.push(Activations::new(dev, n)?);
            acts.len() - 1
        }
    };
    Ok(&mut acts[at])
}

/// A shard for the device to gather from the data set it holds ([`Backend::gather_batch`]):
/// images `order[batch[0] · stride + i]` for `i < n`.
pub struct GatheredShard<'a, B: Backend> {
    /// The data set's images, one byte per pixel.
    pub pixels: &'a B::Buffer<u8>,
    /// The data set's labels.
    pub labels: &'a B::Buffer<u8>,
    /// Indices into the data set, batch after batch.
    pub order: &'a B::Buffer<u32>,
    /// Which batch (one element, in device memory).
    pub batch: &'a B::Buffer<u32>,
    /// The stride between batches in `order`.
    pub stride: usize,
    /// Images in this shard (at most `stride`).
    pub n: usize,
}

fn to_compute<B: Backend, T: Precision>(dev: &B, w: &[f32]) -> Result<B::Buffer<T>, BackendError> {
    dev.upload(&w.iter().map(|v| T::from_f32(*v)).collect::<Vec<T>>())
}

/// The weights the passes read: the half copy, or (f32 activations) the master weights,
/// which then have exactly the type asked for.
fn compute_weights<'a, B: Backend + 'static, T: Precision>(
    params: &'a [B::Buffer<f32>],
    half: &'a Option<Vec<B::Buffer<T>>>,
) -> Vec<&'a B::Buffer<T>> {
    match half {
        Some(h) => h.iter().collect(),
        None => params
            .iter()
            .map(|p| {
                (p as &dyn Any)
                    .downcast_ref::<B::Buffer<T>>()
                    .expect("f32 activations read the f32 master weights")
            })
            .collect(),
    }
}

impl<B: Backend + 'static, T: Precision> Replica<B, T> {
    /// A replica holding `weights` (host values, one vector per tensor of [`PARAMS`]).
    pub fn new(dev: B, weights: &[Vec<f32>]) -> Result<Self, BackendError> {
        let params = weights
            .iter()
            .map(|w| dev.upload(w))
            .collect::<Result<Vec<_>, _>>()?;
        let half = if T::DTYPE.is_half() {
            Some(
                weights
                    .iter()
                    .map(|w| to_compute::<B, T>(&dev, w))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        } else {
            None
        };
        let zeros = || {
            PARAMS
                .iter()
                .map(|p| dev.alloc_zeros::<f32>(p.len()))
                .collect::<Result<Vec<_>, _>>()
        };
        let (grads, velocity) = (zeros()?, zeros()?);
        let (update_table, check_table) = (
            TensorTable::new(&dev, PARAMS.len())?,
            TensorTable::new(&dev, PARAMS.len())?,
        );
        Ok(Replica {
            dev,
            params,
            half,
            grads,
            velocity,
            update_table,
            check_table,
            acts: Vec::new(),
        })
    }

    /// The parameters, copied to the host.
    pub fn weights(&self) -> Result<Vec<Vec<f32>>, BackendError> {
        self.params.iter().map(|p| self.dev.download(p)).collect()
    }

    /// Forward pass over a shard (`images`: batch x 784 bytes, `labels`: batch). With
    /// `grad_scale` it also runs the backward pass, leaving in [`Replica::grads`] the gradient
    /// of `grad_scale · Σ loss` (grad_scale = loss scale / global batch gives the scaled mean
    /// loss's).
    pub fn step(
        &mut self,
        images: &[u8],
        labels: &[u8],
        grad_scale: Option<f32>,
    ) -> Result<ShardStats, BackendError> {
        self.step_with(images, labels, grad_scale, |_, _| {})
    }

    /// [`Replica::step`] that hands each gradient tensor to `ready` (its index in [`PARAMS`]
    /// and its buffer) as soon as the backward pass has finished writing it, in
    /// [`BACKWARD_ORDER`]. This is the hook gradient buckets hang on: a bucket's allreduce can
    /// start while the backward pass is still computing the layers before it.
    pub fn step_with<'s>(
        &'s mut self,
        images: &[u8],
        labels: &[u8],
        grad_scale: Option<f32>,
        ready: impl FnMut(usize, &'s mut B::Buffer<f32>),
    ) -> Result<ShardStats, BackendError> {
        let n = labels.len();
        let (dev, acts) = (&self.dev, &mut self.acts);
        if n > 0 {
            let a = shaped(dev, acts, n)?;
            let x: Vec<T> = images
                .iter()
                .map(|&p| T::from_f32(p as f32 / 255.0))
                .collect();
            dev.write(&x, &mut a.x)?;
            dev.write(labels, &mut a.labels)?;
        }
        let grad = grad_scale.map(|g| (g, None));
        Ok(match self.passes(n, grad, None, ready)? {
            Some(v) => ShardStats {
                loss_sum: v[0] as f64,
                correct: v[1] as usize,
                count: n,
            },
            None => ShardStats::default(),
        })
    }

    /// [`Replica::step_with`] on a shard the device gathers itself from a data set it holds
    /// ([`Backend::gather_batch`]), with nothing read back: the shard's statistics land in
    /// `out` ([`STATS`]; added to it with `accumulate`). With `train`, the step's scalars
    /// are computed first, by the gather's launch ([`Backend::gather_batch_and_begin`]), and
    /// the backward pass runs with their gradient factor, read from device memory. Every
    /// value the step uses is in device memory, so its work can be captured once and
    /// replayed.
    pub fn step_gathered<'s>(
        &'s mut self,
        shard: &GatheredShard<'_, B>,
        train: Option<BeginStep<'_, B>>,
        out: &mut B::Buffer<f32>,
        accumulate: bool,
        ready: impl FnMut(usize, &'s mut B::Buffer<f32>),
    ) -> Result<(), BackendError> {
        let n = shard.n;
        let (dev, acts) = (&self.dev, &mut self.acts);
        let scalars = match train {
            Some(begin) if n > 0 => {
                let a = shaped(dev, acts, n)?;
                // Handed to the launch, then read by the passes.
                let scalars = begin.out;
                let begin = BeginStep {
                    out: &mut *scalars,
                    ..begin
                };
                dev.gather_batch_and_begin(
                    shard.pixels,
                    shard.labels,
                    shard.order,
                    shard.batch,
                    shard.stride,
                    &mut a.x,
                    &mut a.labels,
                    begin,
                )?;
                Some(&*scalars)
            }
            Some(begin) => {
                dev.step_begin(
                    begin.lr_table,
                    shard.batch,
                    begin.loss_scale,
                    begin.global,
                    begin.out,
                )?;
                Some(&*begin.out)
            }
            None if n > 0 => {
                let a = shaped(dev, acts, n)?;
                dev.gather_batch(
                    shard.pixels,
                    shard.labels,
                    shard.order,
                    shard.batch,
                    shard.stride,
                    &mut a.x,
                    &mut a.labels,
                )?;
                None
            }
            None => None,
        };
        if n == 0 && !accumulate {
            dev.write(&[0.0; STATS], out)?;
        }
        let grad = scalars.map(|at| (0.0, Some(at)));
        self.passes(n, grad, Some((out, accumulate)), ready)?;
        Ok(())
    }

    /// The forward pass over the `n` images in the activations, the loss and the shard's
    /// statistics (into `out`, added with its flag, else into the activations' own), and
    /// with `grad` (the factor, or
    /// where the device holds it) the backward pass. Returns false for an empty shard,
    /// whose gradients are zeros (handed to `ready` all the same).
    fn passes<'s>(
        &'s mut self,
        n: usize,
        grad: Option<(f32, Option<&StepScalars<B>>)>,
        out: Option<(&mut B::Buffer<f32>, bool)>,
        mut ready: impl FnMut(usize, &'s mut B::Buffer<f32>),
    ) -> Result<Option<Vec<f32>>, BackendError> {
        if n == 0 {
            if grad.is_some() {
                let Replica { dev, grads, .. } = self;
                let mut slots: Vec<Option<&'s mut B::Buffer<f32>>> =
                    grads.iter_mut().map(Some).collect();
                for i in BACKWARD_ORDER {
                    if let Some(g) = slots[i].take() {
                        dev.fill(g, 0.0)?;
                        ready(i, g);
                    }
                }
            }
            return Ok(None);
        }
        let Replica {
            dev,
            params,
            half,
            grads,
            acts,
            ..
        } = self;
        let a = shaped(dev, acts, n)?;
        let [_, b1, _, b2, _, b3, _, b4] = &params[..] else {
            unreachable!("eight tensors")
        };
        let compute = compute_weights::<B, T>(params, half);
        let [w1, _, w2, _, w3, _, w4, _] = compute[..] else {
            unreachable!("eight tensors")
        };

        // Forward (conv1's ReLU output kept only where its backward does not recompute it).
        let (c1, p1) = (conv1(n), pool1(n));
        match &mut a.c1 {
            Some((y, _)) => {
                dev.conv2d_relu_avg_pool_forward(&c1, &p1, &a.x, w1, Some(b1), y, &mut a.p1)?
            }
            None => {
                dev.conv2d_relu_avg_pool_forward_pooled(&c1, &p1, &a.x, w1, Some(b1), &mut a.p1)?
            }
        }
        dev.conv2d_relu_avg_pool_forward(
            &conv2(n),
            &pool2(n),
            &a.p1,
            w2,
            Some(b2),
            &mut a.c2,
            &mut a.p2,
        )?;
        let fc1 = LENET.fc1(n);
        dev.gemm(
            &fc1.forward(),
            &a.p2,
            w3,
            Some(b3),
            &mut a.h,
            Epilogue {
                relu: true,
                ..Epilogue::default()
            },
        )?;
        // fc2, the loss and the shard's statistics; with `grad`, fc2's gradients and the
        // gradient of h through fc1's ReLU (one launch on the kernel backends).
        let read_back = out.is_none();
        let (stats_out, accumulate) = match out {
            Some((out, accumulate)) => (out, accumulate),
            None => (&mut a.stats, false),
        };
        let [g_w1, g_b1, g_w2, g_b2, g_w3, g_b3, g_w4, g_b4] = &mut grads[..] else {
            unreachable!("eight tensors")
        };
        let head_grad = grad.map(|(grad_scale, at)| HeadGradient {
            grad_scale,
            at,
            d_logits: &mut a.d_logits,
            dw: &mut *g_w4,
            db: &mut *g_b4,
            dh: &mut a.d_h,
            dh_bias: &mut *g_b3,
        });
        dev.softmax_head(
            n,
            LENET.hidden,
            CLASSES,
            &a.h,
            w4,
            b4,
            &a.labels,
            &mut a.logits,
            &mut a.loss,
            stats_out,
            accumulate,
            head_grad,
        )?;
        if grad.is_none() {
            return Ok(if read_back {
                Some(dev.download(&a.stats)?)
            } else {
                None
            });
        }
        ready(weight(FC2), g_w4);
        ready(bias(FC2), g_b4);

        // Backward, from fc1 on.
        // fc1: dW = dhᵀ·p2, dp2 = dh·W (db = Σ dh came with dh).
        let dw = Epilogue::default();
        dev.gemm::<T, f32>(&fc1.weight_gradient(), &a.d_h, &a.p2, None, g_w3, dw)?;
        ready(weight(FC1), g_w3);
        ready(bias(FC1), g_b3); // written by the head, handed over in BACKWARD_ORDER
        dev.gemm(
            &fc1.input_gradient(),
            &a.d_h,
            w3,
            None,
            &mut a.d_p2,
            Epilogue::default(),
        )?;
        // pool2, conv2's ReLU, conv2.
        dev.conv2d_relu_avg_pool_backward(
            &conv2(n),
            &pool2(n),
            &a.p1,
            &a.c2,
            &a.d_p2,
            g_w2,
            g_b2,
            Some((w2, &mut a.d_p1)),
            &mut a.d_c2,
        )?;
        ready(weight(CONV2), g_w2);
        ready(bias(CONV2), g_b2);
        // pool1, conv1's ReLU, conv1 (no gradient for the images).
        let (x, d_p1) = (&a.x, &a.d_p1);
        match &mut a.c1 {
            Some((y, workspace)) => dev
                .conv2d_relu_avg_pool_backward(&c1, &p1, x, y, d_p1, g_w1, g_b1, None, workspace)?,
            None => dev.conv2d_relu_avg_pool_backward_recomputed(
                &c1,
                &p1,
                x,
                w1,
                Some(b1),
                d_p1,
                g_w1,
                g_b1,
            )?,
        }
        ready(weight(CONV1), g_w1);
        ready(bias(CONV1), g_b1);
        Ok(if read_back {
            Some(dev.download(&a.stats)?)
        } else {
            None
        })
    }

    /// Sets `found[0] = 1` if any gradient is inf or NaN (an overflow under the loss scale):
    /// one launch over every tensor.
    pub fn check_gradients(&mut self, found: &mut B::Buffer<i32>) -> Result<(), BackendError> {
        let grads: Vec<&B::Buffer<f32>> = self.grads.iter().collect();
        self.dev
            .grad_check_many(&grads, &mut self.check_table, found)
    }

    /// One fused SGD step on every tensor from [`Replica::grads`] (already reduced across
    /// devices; multiplied by `step.inv_scale` to undo the loss scale), in one launch;
    /// skipped entirely if `found` is set. With `at`, the learning rate and the unscaling
    /// factor are read from device memory instead (see [`Backend::sgd_step`]).
    pub fn update(
        &mut self,
        step: SgdStep,
        at: Option<&StepScalars<B>>,
        found: Option<&B::Buffer<i32>>,
    ) -> Result<(), BackendError> {
        let with_velocity = step.momentum != 0.0;
        // With 16-bit activations the fused kernel also writes the copy the next forward
        // reads.
        let mut copies = self.half.as_mut().map(|h| h.iter_mut());
        let tensors = self
            .params
            .iter_mut()
            .zip(&self.grads)
            .zip(&mut self.velocity)
            .map(|((w, grad), v)| SgdTensor {
                w,
                grad,
                velocity: with_velocity.then_some(v),
                w_copy: copies.as_mut().and_then(|c| c.next()),
            })
            .collect();
        self.dev
            .sgd_step_many(tensors, &mut self.update_table, step, at, found)
    }
}
