//! The native CPU backend: the same operations as the kernels, in Rust, on host memory.
//!
//! It is the production path on machines without a GPU, so it is built for speed, and every
//! reduction has a fixed order that does not depend on the number of threads, so results
//! are bitwise reproducible on a machine. Arithmetic is f32 with f16 or bf16 storage for
//! mixed precision, as on the GPU. `docs/cpu-backend.md` walks through it. The files, by
//! role:
//!
//! - this file: [`CpuDevice`], its buffers, and each operation (`BackendImpl`);
//! - drivers (loops, groups of images, threads, the summation order): `conv` (the
//!   convolutions, fused with ReLU, pooling and the bias gradient where the trainer asks),
//!   `gemm` (the linear layers, through `matrixmultiply`), `pool`, `loss`, `optim`, `step`
//!   (the training step's small operations), `summation` (the fixed trees);
//! - `lanes`: the convolution products with a group of images in a vector's lanes, written
//!   once over the engine trait, and their layouts (storage on cache lines, the
//!   transposition in and out);
//! - `engine`: the engines, one file each: the f32 vector engines (AVX-512, AVX2+FMA,
//!   portable) behind one trait, `multiversion!` for the plain loops, and the bf16 pair
//!   engines (`vdpbf16ps`: AVX512-BF16; `amx`: AMX tiles);
//! - `pairs`: the bf16 pair products' operands, packed, and their drivers;
//! - `microkernel`: the im2col GEMM tile (conv1's 9 taps) and its helpers;
//! - `half_convert`: f16 and bf16 to and from f32;
//! - [`isa`]: what the CPU has and which engine each operation uses (the plan, decided once
//!   per process; `NANODDP_CPU_ISA` forces a lower level);
//! - `product_check` (tests only): random operands and float64 checks for the tiles' tests.
//!
//! The float64 reference the integration tests compare against is separate
//! (`tests/common/reference.rs`).

mod conv;
mod engine;
mod gemm;
pub(crate) mod half_convert;
pub mod isa;
mod lanes;
mod loss;
mod microkernel;
mod optim;
// Off x86-64 the pair engines' calls are `unreachable!` (the plan never chooses them there).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused, clippy::all))]
mod pairs;
mod pool;
#[cfg(test)]
mod product_check;
mod step;
mod summation;

use rayon::prelude::*;

use super::backend_impl::{BackendImpl, OpResult};
use super::op::{
    Add, AvgPoolBackward, AvgPoolForward, AvgPoolReluBackward, Axpy, Cast, Checked, Conv2dBackward,
    Conv2dBackwardBias, Conv2dBackwardFilter, Conv2dBackwardInput, Conv2dForward,
    Conv2dReluAvgPoolBackward, Conv2dReluAvgPoolForward, Fill, GatherBatch, Gemm, GradCheck,
    GradCheckMany, MaxPoolBackward, MaxPoolForward, ReluBackward, Scale, Sgd, SgdMany, SgdTensor,
    ShardStats, SoftmaxCrossEntropy, StepBegin, StepEnd,
};
use super::precision::Precision;
use super::{BackendError, DeviceBuffer, DeviceScalar, Memory, SgdStep, StepScalars};
use crate::dtype::DType;

/// `step` with its learning rate and unscaling factor read from `at` when given (what the
/// kernels read from device memory).
fn with_device_scalars(mut step: SgdStep, at: Option<&StepScalars<CpuDevice>>) -> SgdStep {
    if let Some(at) = at {
        (step.lr, step.inv_scale) = (at.lr.0[0], at.inv_scale.0[0]);
    }
    step
}

/// T's values as bf16 bit patterns, when T is bf16 and this CPU takes the bf16 products
/// through AVX512-BF16 ([`isa::Isa::bf16_products`]): the linear layers' operands of
/// [`pairs::gemm_bf16`]. None sends bf16 through the f32 tiles (widened).
fn bf16_bits<T: Precision>(v: &[T]) -> Option<&[u16]> {
    (T::DTYPE == DType::BF16 && isa::isa().bf16_products).then(|| bytemuck::cast_slice(v))
}

/// T's values as bf16 bit patterns, when T is bf16 and this CPU multiplies the convolutions'
/// bf16 operands as they are, by pairs: on AMX tiles ([`isa::Isa::amx`]) or through
/// `vdpbf16ps` ([`isa::Isa::bf16_products`]). None sends bf16 through the f32 tiles.
fn pair_bits<T: Precision>(v: &[T]) -> Option<&[u16]> {
    let isa = isa::isa();
    (T::DTYPE == DType::BF16 && (isa.amx || isa.bf16_products)).then(|| bytemuck::cast_slice(v))
}

/// The first `len` elements of `v`, grown with zeros where it is shorter and never shrunk:
/// a buffer kept between calls of different sizes is not cleared again on each.
fn fitted<V: Clone + Default>(v: &mut Vec<V>, len: usize) -> &mut [V] {
    if v.len() < len {
        v.resize(len, V::default());
    }
    &mut v[..len]
}

/// `src` as f32: the slice itself when `T` is f32 (no copy), else widened into `scratch`
/// ([`fitted`]).
fn widened<'a, T: Precision>(src: &'a [T], scratch: &'a mut Vec<f32>) -> &'a [f32] {
    match T::as_f32(src) {
        Some(s) => s,
        None => {
            let wide = fitted(scratch, src.len());
            T::widen_slice(src, wide);
            wide
        }
    }
}

thread_local! {
    /// Each thread's kept worker buffers, one value per type (see [`with_kept`]).
    static KEPT: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> = Default::default();
}

/// Runs `f` with this thread's kept value of type `S`, as the last call on this thread left
/// it (a default one the first time, or where it is in use: an operation rayon started on
/// this thread while it waited inside another): worker buffers sized once per thread, not
/// allocated and cleared (a page fault per 4 KB) on every call.
pub(super) fn with_kept<S: Default + 'static, R>(f: impl FnOnce(&mut S) -> R) -> R {
    let kept = KEPT.with_borrow_mut(|k| Some(k.swap_remove(k.iter().position(|v| v.is::<S>())?)));
    let mut mine: Box<S> = kept.and_then(|v| v.downcast().ok()).unwrap_or_default();
    let result = f(&mut mine);
    KEPT.with_borrow_mut(|k| k.push(mine));
    result
}

/// Runs `f` on an f32 view of `dst`: `dst` itself when `T` is f32, else `scratch`
/// ([`fitted`]), rounded into `dst` afterwards. Returns the f32 values written.
fn write_f32<'a, T: Precision>(
    dst: &'a mut [T],
    scratch: &'a mut Vec<f32>,
    f: impl FnOnce(&mut [f32]),
) -> &'a [f32] {
    if T::as_f32(dst).is_some() {
        let d = T::as_f32_mut(dst).expect("T is f32");
        f(d);
        return d;
    }
    let wide = fitted(scratch, dst.len());
    f(wide);
    T::narrow_slice(wide, dst);
    wide
}

/// The host as a device.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuDevice {
    /// Its own level and threads, where it was given a level
    /// ([`CpuDevice::with_level`]); else the process's, on rayon's global pool.
    own: Option<&'static OwnLevel>,
}

/// A [`CpuDevice`]'s own level, and the threads that compute with it.
#[derive(Debug)]
struct OwnLevel {
    isa: isa::Isa,
    pool: rayon::ThreadPool,
}

impl CpuDevice {
    /// The CPU backend with the process's paths ([`isa::isa`]), on rayon's global thread
    /// pool.
    pub fn new() -> Self {
        CpuDevice { own: None }
    }

    /// The CPU backend computing with the level `name` (a value of `NANODDP_CPU_ISA`:
    /// `portable`, `avx2`, ...), whatever the process uses, on threads of its own (as many
    /// as rayon's global pool has): so one process can run every engine its CPU has (the
    /// tests do). Refused, as the variable would be, for a level this CPU lacks or a name
    /// it does not know. Each level's threads start on its first device and are kept for
    /// the process (a handful of levels at most), so devices stay `Copy`.
    pub fn with_level(name: &str) -> Result<Self, isa::IsaError> {
        static LEVELS: std::sync::Mutex<Vec<&'static OwnLevel>> = std::sync::Mutex::new(Vec::new());
        let isa = isa::level(name)?;
        let mut levels = LEVELS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(own) = levels.iter().find(|own| own.isa == isa) {
            return Ok(CpuDevice { own: Some(own) });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .thread_name(|i| format!("nanoddp-cpu-{i}"))
            .start_handler(move |_| isa::set_thread_isa(Some(isa)))
            .build()
            .map_err(|e| isa::IsaError::Threads {
                reason: e.to_string(),
            })?;
        let own: &'static OwnLevel = Box::leak(Box::new(OwnLevel { isa, pool }));
        levels.push(own);
        Ok(CpuDevice { own: Some(own) })
    }

    /// The instruction sets this device computes with.
    pub fn isa(&self) -> isa::Isa {
        self.own.as_ref().map_or_else(isa::isa, |own| own.isa)
    }

    /// Runs an operation inside a thread pool: this device's own where it has a level of its
    /// own (computing with that level), else rayon's global one. Either way the operation's
    /// parallel loops start on a worker, instead of each loop handing its work to the pool
    /// and waiting for it (a wake-up and a hand-back per loop, which mixed precision's
    /// conversions multiply).
    fn run<R: Send>(&self, op: impl FnOnce() -> R + Send) -> R {
        match &self.own {
            Some(own) => own.pool.install(op),
            None => rayon::scope(|_| op()),
        }
    }
}

/// A buffer in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuBuffer<T>(Vec<T>);

impl<T> CpuBuffer<T> {
    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        &self.0
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: DeviceScalar> DeviceBuffer<T> for CpuBuffer<T> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn device_addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

impl Memory for CpuDevice {
    type Buffer<T: DeviceScalar> = CpuBuffer<T>;
    // Every operation is done when it returns: nothing to order.
    crate::no_marks!();

    fn alloc_zeros<T: DeviceScalar>(&self, len: usize) -> Result<CpuBuffer<T>, BackendError> {
        Ok(CpuBuffer(vec![T::zeroed(); len]))
    }

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<CpuBuffer<T>, BackendError> {
        Ok(CpuBuffer(host.to_vec()))
    }

    fn copy_in<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        buf.0.copy_from_slice(host);
        Ok(())
    }

    fn download<T: DeviceScalar>(&self, buf: &CpuBuffer<T>) -> Result<Vec<T>, BackendError> {
        Ok(buf.0.clone())
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// Elements per rayon task for flat loops: big enough that scheduling is noise.
const FLAT_CHUNK: usize = 1 << 14;

/// `f(out chunk, x chunk)` over matching chunks of [`FLAT_CHUNK`] elements, on rayon's threads.
fn zip_chunks<O: Send, X: Sync>(out: &mut [O], x: &[X], f: impl Fn(&mut [O], &[X]) + Sync) {
    out.par_chunks_mut(FLAT_CHUNK)
        .zip(x.par_chunks(FLAT_CHUNK))
        .for_each(|(o, x)| f(o, x));
}

impl CpuDevice {
    /// Runs an operation's body on its checked arguments ([`CpuDevice::run`]'s threads).
    fn exec<A: Send>(&self, op: Checked<A>, body: impl FnOnce(A) + Send) -> OpResult {
        self.run(|| body(op.into_inner()));
        Ok(())
    }
}

/// One SGD step on the tensor `t`.
fn sgd_tensor<T: Precision>(t: SgdTensor<'_, CpuDevice, T>, step: SgdStep) {
    let (w, grad) = (&mut t.w.0, &t.grad.0);
    let velocity = t.velocity.map(|v| v.as_mut_slice());
    optim::sgd_step(w, grad, velocity, t.w_copy.map(|h| h.as_mut_slice()), step);
}

impl BackendImpl for CpuDevice {
    fn fill(&self, op: Checked<Fill<'_, CpuDevice>>) -> OpResult {
        self.exec(op, |Fill { out, value }| {
            out.0.par_chunks_mut(FLAT_CHUNK).for_each(|c| c.fill(value))
        })
    }

    fn scale(&self, op: Checked<Scale<'_, CpuDevice>>) -> OpResult {
        self.exec(op, |Scale { x, alpha }| {
            x.0.par_chunks_mut(FLAT_CHUNK)
                .for_each(|c| c.iter_mut().for_each(|v| *v *= alpha))
        })
    }

    fn axpy(&self, op: Checked<Axpy<'_, CpuDevice>>) -> OpResult {
        self.exec(op, |Axpy { alpha, x, y }| {
            zip_chunks(&mut y.0, &x.0, |y, x| {
                y.iter_mut()
                    .zip(x)
                    .for_each(|(y, x)| *y = alpha.mul_add(*x, *y))
            })
        })
    }

    fn add(&self, op: Checked<Add<'_, CpuDevice>>) -> OpResult {
        self.exec(op, |Add { a, b, out }| {
            out.0
                .par_chunks_mut(FLAT_CHUNK)
                .zip(a.0.par_chunks(FLAT_CHUNK).zip(b.0.par_chunks(FLAT_CHUNK)))
                .for_each(|(o, (a, b))| {
                    o.iter_mut()
                        .zip(a.iter().zip(b))
                        .for_each(|(o, (a, b))| *o = a + b)
                })
        })
    }

    fn cast_from_f32<T: Precision>(&self, op: Checked<Cast<'_, CpuDevice, f32, T>>) -> OpResult {
        self.exec(op, |Cast { x, out }| {
            zip_chunks(&mut out.0, &x.0, |o, x| T::narrow_slice(x, o))
        })
    }

    fn cast_to_f32<T: Precision>(&self, op: Checked<Cast<'_, CpuDevice, T, f32>>) -> OpResult {
        self.exec(op, |Cast { x, out }| {
            zip_chunks(&mut out.0, &x.0, |o, x| T::widen_slice(x, o))
        })
    }

    fn relu_backward<T: Precision>(&self, op: Checked<ReluBackward<'_, CpuDevice, T>>) -> OpResult {
        self.exec(op, |ReluBackward { y, dy, dx }| {
            let zero = T::from_f32(0.0);
            zip_chunks(&mut dx.0, &dy.0, |dx, dy| dx.copy_from_slice(dy));
            zip_chunks(&mut dx.0, &y.0, |dx, y| {
                for (dx, y) in dx.iter_mut().zip(y) {
                    *dx = if y.above_zero() { *dx } else { zero };
                }
            })
        })
    }

    fn gemm<A: Precision, O: Precision>(&self, op: Checked<Gemm<'_, CpuDevice, A, O>>) -> OpResult {
        self.exec(op, |op| {
            let bias = op.bias.map(|b| b.as_slice());
            let (shape, ep) = (op.shape, op.epilogue);
            let (a, b, c) = (&op.a.0, &op.b.0, &mut op.c.0);
            // bf16 on AVX512-BF16 multiplies the bf16 values themselves; other half operands
            // are widened for the f32 product.
            match bf16_bits(a).zip(bf16_bits(b)) {
                Some((a, b)) => gemm::gemm_bf16(shape, a, b, bias, c, ep),
                None => gemm::gemm_f32(shape, a, b, bias, c, ep),
            }
        })
    }

    fn conv2d_forward<T: Precision>(
        &self,
        op: Checked<Conv2dForward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            let bias = op.bias.map(|b| b.as_slice());
            conv::forward(op.shape, &op.x.0, &op.w.0, bias, &mut op.y.0, op.relu, None)
        })
    }

    fn conv2d_relu_avg_pool_forward<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolForward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            let (x, w, y) = (&op.x.0, &op.w.0, &mut op.y.0);
            let (bias, pool) = (
                op.bias.map(|b| b.as_slice()),
                (op.pool, &mut op.pooled.0[..]),
            );
            conv::forward(op.conv, x, w, bias, y, true, Some(pool))
        })
    }

    fn avg_pool_relu_backward<T: Precision>(
        &self,
        op: Checked<AvgPoolReluBackward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            pool::avg_relu_backward(op.pool, &op.d_pooled.0, &op.y.0, &mut op.dx.0)
        })
    }

    fn conv2d_backward<T: Precision>(
        &self,
        op: Checked<Conv2dBackward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            let dy = conv::OutputGrad::Tensor(&op.dy.0);
            let filter = Some((&op.x.0[..], &mut op.dw.0[..]));
            let input = Some((&op.w.0[..], &mut op.dx.0[..]));
            conv::backward(op.shape, dy, filter, Some(&mut op.db.0), input)
        })
    }

    fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolBackward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            let dy = conv::OutputGrad::Pooled {
                pool: op.pool,
                d_pooled: &op.d_pooled.0,
                y: &op.y.0,
            };
            let filter = Some((&op.x.0[..], &mut op.dw.0[..]));
            let input = op.input.map(|(w, dx)| (&w.0[..], &mut dx.0[..]));
            conv::backward(op.conv, dy, filter, Some(&mut op.db.0), input)
        })
    }

    fn conv2d_backward_input<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardInput<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            let (dy, input) = (&op.dy.0, Some((&op.w.0[..], &mut op.dx.0[..])));
            conv::backward(op.shape, conv::OutputGrad::Tensor(dy), None, None, input)
        })
    }

    fn conv2d_backward_filter<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardFilter<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            let (dy, filter) = (&op.dy.0, Some((&op.x.0[..], &mut op.dw.0[..])));
            let db = op.db.map(|db| &mut db.0[..]);
            conv::backward(op.shape, conv::OutputGrad::Tensor(dy), filter, db, None)
        })
    }

    fn conv2d_backward_bias<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardBias<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            conv::backward_bias(op.shape, &op.dy.0, &mut op.db.0)
        })
    }

    fn max_pool_forward<T: Precision>(
        &self,
        op: Checked<MaxPoolForward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            pool::max_forward(op.shape, &op.x.0, &mut op.y.0, &mut op.argmax.0)
        })
    }

    fn max_pool_backward<T: Precision>(
        &self,
        op: Checked<MaxPoolBackward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            pool::max_backward(op.shape, &op.dy.0, &op.argmax.0, &mut op.dx.0)
        })
    }

    fn avg_pool_forward<T: Precision>(
        &self,
        op: Checked<AvgPoolForward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| pool::avg_forward(op.shape, &op.x.0, &mut op.y.0))
    }

    fn avg_pool_backward<T: Precision>(
        &self,
        op: Checked<AvgPoolBackward<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            pool::avg_backward(op.shape, &op.dy.0, &mut op.dx.0)
        })
    }

    fn softmax_cross_entropy<T: Precision>(
        &self,
        op: Checked<SoftmaxCrossEntropy<'_, CpuDevice, T>>,
    ) -> OpResult {
        self.exec(op, |op| {
            op.correct.0[0] += loss::softmax_cross_entropy(
                op.classes,
                &op.logits.0,
                &op.labels.0,
                &mut op.loss.0,
                op.grad.map(|g| g.as_mut_slice()),
                op.at.map_or(op.grad_scale, |at| at.grad_scale.0[0]),
            )
        })
    }

    fn grad_check<G: Precision>(&self, op: Checked<GradCheck<'_, CpuDevice, G>>) -> OpResult {
        self.exec(op, |op| {
            if optim::any_nonfinite(&op.grad.0) {
                op.found.0[0] = 1;
            }
        })
    }

    fn sgd_step<T: Precision>(&self, op: Checked<Sgd<'_, CpuDevice, T>>) -> OpResult {
        self.exec(op, |op| {
            if op.found.is_none_or(|f| f.0[0] == 0) {
                let (w, grad, velocity, w_copy) = (op.w, op.grad, op.velocity, op.w_copy);
                let tensor = SgdTensor {
                    w,
                    grad,
                    velocity,
                    w_copy,
                };
                sgd_tensor(tensor, with_device_scalars(op.step, op.at));
            }
        })
    }

    fn sgd_step_many<T: Precision>(&self, op: Checked<SgdMany<'_, CpuDevice, T>>) -> OpResult {
        self.exec(op, |op| {
            if op.found.is_none_or(|f| f.0[0] == 0) {
                let step = with_device_scalars(op.step, op.at);
                op.tensors.into_iter().for_each(|t| sgd_tensor(t, step));
            }
        })
    }

    fn grad_check_many(&self, op: Checked<GradCheckMany<'_, CpuDevice>>) -> OpResult {
        self.exec(op, |op| {
            if op.grads.iter().any(|g| optim::any_nonfinite(&g.0)) {
                op.found.0[0] = 1;
            }
        })
    }

    fn gather_batch<T: Precision>(&self, op: Checked<GatherBatch<'_, CpuDevice, T>>) -> OpResult {
        self.run(|| step::gather_batch(op))
    }

    fn step_begin(&self, op: Checked<StepBegin<'_, CpuDevice>>) -> OpResult {
        self.run(|| step::step_begin(op))
    }

    fn shard_stats(&self, op: Checked<ShardStats<'_, CpuDevice>>) -> OpResult {
        self.run(|| step::shard_stats(op))
    }

    fn step_end(&self, op: Checked<StepEnd<'_, CpuDevice>>) -> OpResult {
        self.run(|| step::step_end(op))
    }
}
