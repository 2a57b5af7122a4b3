//! [`BackendImpl`] for every kernel [`KernelDevice`] (CUDA and the SIMT emulator): choose the
//! launch shape, launch the kernel from `kernels/*.cu`. The fused operations are the
//! trait's defaults, built from these launches.
//!
//! Every `unsafe` launch below is sound for the same reason: its arguments are
//! [`Checked`], so the shape is valid and every buffer's length is the one it implies, and
//! the kernel's index ranges are exactly that shape.

use super::{KernelArg, KernelDevice, LaunchConfig, SCRATCH_COUNTERS, SCRATCH_FLOATS};
use crate::backend::backend_impl::{
    conv_relu_then_pool, forward_into_temporary, head_unfused, recompute_then_backward,
    unpool_then_backward, OpResult,
};
use crate::backend::op::{
    Add, AvgPoolBackward, AvgPoolForward, AvgPoolReluBackward, Axpy, BeginStep, Cast, Checked,
    Conv2dBackwardBias, Conv2dBackwardFilter, Conv2dBackwardInput, Conv2dForward,
    Conv2dReluAvgPoolBackward, Conv2dReluAvgPoolBackwardRecomputed, Conv2dReluAvgPoolForward,
    Conv2dReluAvgPoolForwardPooled, ConvOperands, Fill, GatherAndBegin, GatherBatch, Gemm,
    GradCheck, GradCheckMany, MaxPoolBackward, MaxPoolForward, ReluBackward, Scale, Sgd, SgdMany,
    ShardStats, SoftmaxCrossEntropy, SoftmaxHead, StepBegin, StepEnd,
};
use crate::backend::{
    gemm_kernels, BackendImpl, Conv2dShape, DeviceBuffer, DeviceScalar, Memory, Pool2dShape,
    Precision, PrecisionOp,
};
use crate::kernels::{elementwise as ew, optim as optim_kernels, step, KernelSignature, Scalar};

fn i32_arg(v: usize) -> KernelArg {
    // Shapes are validated to fit i32 before any launch.
    KernelArg::I32(v as i32)
}

fn blocks(n: usize, per_block: usize) -> u32 {
    n.div_ceil(per_block).max(1) as u32
}

fn gemm_args<D: KernelDevice, A: DeviceScalar, C: DeviceScalar>(
    op: Gemm<'_, D, A, C>,
) -> Vec<KernelArg> {
    let (shape, epilogue) = (op.shape, op.epilogue);
    let (lda, ldb, ldc) = shape.leading_dims();
    vec![
        KernelArg::buffer(op.a),
        KernelArg::buffer(op.b),
        KernelArg::buffer_mut(op.c),
        KernelArg::optional(op.bias),
        i32_arg(shape.m),
        i32_arg(shape.n),
        i32_arg(shape.k),
        i32_arg(lda),
        i32_arg(ldb),
        i32_arg(ldc),
        KernelArg::I32(shape.trans_a.into()),
        KernelArg::I32(shape.trans_b.into()),
        KernelArg::F32(epilogue.alpha),
        KernelArg::F32(epilogue.beta),
        KernelArg::I32(epilogue.relu.into()),
    ]
}

/// The convolution kernels' shape arguments: batch, C, H, W, O, KH, KW, stride, pad, P, Q.
fn conv_dims(s: &Conv2dShape) -> [KernelArg; 11] {
    [
        i32_arg(s.batch),
        i32_arg(s.in_c),
        i32_arg(s.in_h),
        i32_arg(s.in_w),
        i32_arg(s.out_c),
        i32_arg(s.k_h),
        i32_arg(s.k_w),
        i32_arg(s.stride),
        i32_arg(s.pad),
        i32_arg(s.out_h()),
        i32_arg(s.out_w()),
    ]
}

/// Whether `kernels/conv.cu` fuses `pool` after a convolution: a 2x2 average pool with
/// stride 2 (LeNet's both), whose windows its forward epilogue and its gradients' loads know.
fn fuses_pool(pool: &Pool2dShape) -> bool {
    pool.k_h == 2 && pool.k_w == 2 && pool.stride == 2
}

/// The rows and columns of `s`'s output plane a pass computes over, from the top left: the
/// plane, or with a fused pool (`pooled`) the pixels its windows cover (all but the last row
/// and column of an odd plane: the output gradient through the pool is zero past them).
fn output_region(s: &Conv2dShape, pooled: bool) -> (usize, usize) {
    match pooled {
        true => (s.out_h() / 2 * 2, s.out_w() / 2 * 2),
        false => (s.out_h(), s.out_w()),
    }
}

/// Where `kernels/conv_direct.cu`'s filter gradient finds the ReLU's output: the forward's
/// `y`, or the forward's filter and bias to recompute it from.
enum ReluOutput<'a, D: Memory, T: DeviceScalar> {
    Kept(&'a D::Buffer<T>),
    Recomputed(&'a D::Buffer<T>, Option<&'a D::Buffer<f32>>),
}

/// Launches `kernels/conv.cu`'s forward: `y` and, with `pooled`, its 2x2 average pool (the
/// columns in pooled order, four per window: `y` only at the windows' pixels).
fn launch_conv_forward<D: KernelDevice, T: Precision>(
    device: &D,
    s: &Conv2dShape,
    (x, w, bias): ConvOperands<'_, D, T>,
    y: &mut D::Buffer<T>,
    pooled: Option<&mut D::Buffer<T>>,
    relu: bool,
) -> OpResult {
    let (kernel, tile) = if s.out_c > 32 {
        (PrecisionOp::Conv2dForward64x64, TILE_64X64)
    } else {
        (PrecisionOp::Conv2dForward32x128, TILE_32X128)
    };
    let (rows, cols) = output_region(s, pooled.is_some());
    let columns = rows * cols;
    let mut args = vec![
        KernelArg::buffer(x),
        KernelArg::buffer(w),
        KernelArg::optional(bias),
        KernelArg::buffer_mut(y),
        KernelArg::optional_mut(pooled),
    ];
    args.extend(conv_dims(s));
    args.push(KernelArg::I32(relu.into()));
    let cfg = tile.launch(s.batch * columns, s.out_c, 1);
    // SAFETY: the arguments were checked as the operation's (module docs); `pooled` has the
    // size of a 2x2, stride-2 pool of `y`.
    unsafe { device.launch(kernel.kernel(T::DTYPE), cfg, &args) }
}

/// Rows of `conv2d_backward_input_planes`' tile (`Tile128x64` in `kernels/conv.cu`): the
/// filter taps (c, i, j) of its channel group.
const PLANES_ROWS: usize = 128;

/// Dynamic shared memory `conv2d_backward_input_planes` takes at most for its products: with
/// its 13 KiB of staging, under the 48 KiB every GPU grants without opting in.
const PLANES_SHARED_BYTES: usize = 32 << 10;

/// Launches `kernels/conv.cu`'s input gradient: an image's planes a block
/// (`conv2d_backward_input_planes`) where a channel's taps fit its tile and their products
/// over `region` (the output pixels where `dy` may be nonzero, from the top left) its shared
/// memory, else the implicit GEMM.
fn launch_conv_backward_input<D: KernelDevice, T: Precision>(
    device: &D,
    s: &Conv2dShape,
    dy: &D::Buffer<T>,
    w: &D::Buffer<T>,
    dx: &mut D::Buffer<T>,
    region: (usize, usize),
) -> OpResult {
    let window = s.k_h * s.k_w;
    let pixels = region.0 * region.1;
    let group = (PLANES_ROWS / window)
        .min(PLANES_SHARED_BYTES / (4 * window * pixels.max(1)))
        .min(s.in_c);
    if group > 0 {
        let mut args = vec![
            KernelArg::buffer(dy),
            KernelArg::buffer(w),
            KernelArg::buffer_mut(dx),
        ];
        args.extend(conv_dims(s).into_iter().skip(1));
        args.extend([i32_arg(region.0), i32_arg(region.1), i32_arg(group)]);
        let cfg = LaunchConfig {
            grid: (blocks(s.in_c, group), s.batch as u32, 1),
            block: (256, 1, 1),
            shared_bytes: (4 * group * window * pixels) as u32,
        };
        let kernel = PrecisionOp::Conv2dBackwardInputPlanes.kernel(T::DTYPE);
        // SAFETY: the arguments were checked as the operation's (module docs); the region
        // lies in the output plane and the shared memory holds the group's products over it.
        return unsafe { device.launch(kernel, cfg, &args) };
    }
    let (kernel, tile) = if s.in_c > 32 {
        (PrecisionOp::Conv2dBackwardInput64x64, TILE_64X64)
    } else {
        (PrecisionOp::Conv2dBackwardInput32x128, TILE_32X128)
    };
    let mut args = vec![
        KernelArg::buffer(dy),
        KernelArg::buffer(w),
        KernelArg::buffer_mut(dx),
    ];
    args.extend(conv_dims(s));
    let cfg = tile.launch(s.batch * s.in_h * s.in_w, s.in_c, 1);
    // SAFETY: the arguments were checked as the operation's (module docs).
    unsafe { device.launch(kernel.kernel(T::DTYPE), cfg, &args) }
}

/// The output gradient a filter-gradient launch reads.
enum FilterDy<'a, D: Memory, T: Precision> {
    /// The convolution's own.
    Tensor(&'a D::Buffer<T>),
    /// The gradient at a 2x2, stride-2 average pool of the ReLU output `y`; with `out`, the
    /// kernel also writes the convolution's output gradient it computes there, at the pool
    /// windows' pixels (the rest of `out` is left as it was).
    Pooled {
        d_pooled: &'a D::Buffer<T>,
        y: &'a D::Buffer<T>,
        out: Option<&'a mut D::Buffer<T>>,
    },
}

/// Launches `kernels/conv.cu`'s filter gradient (and bias gradient with `db`): the batch
/// split into [`filter_splits`] slices whose partial sums the scratch area holds.
fn launch_conv_backward_filter<D: KernelDevice, T: Precision>(
    device: &D,
    s: &Conv2dShape,
    x: &D::Buffer<T>,
    dy: FilterDy<'_, D, T>,
    dw: &mut D::Buffer<f32>,
    db: Option<&mut D::Buffer<f32>>,
) -> OpResult {
    let depth = s.in_c * s.k_h * s.k_w;
    let (kernel, tile) = if s.out_c <= 32 && depth <= 16 {
        (PrecisionOp::Conv2dBackwardFilter32x16, TILE_32X16)
    } else {
        (PrecisionOp::Conv2dBackwardFilter64x64, TILE_64X64)
    };
    let (dy, y, out) = match dy {
        FilterDy::Tensor(dy) => (dy, None, None),
        FilterDy::Pooled { d_pooled, y, out } => (d_pooled, Some(y), out),
    };
    // The pixels of a plane the reduction runs over: with a pool, its windows'.
    let (rows, cols) = output_region(s, y.is_some());
    let region = rows * cols;
    let splits = filter_splits(s, tile, region);
    let mut args = vec![
        KernelArg::buffer(x),
        KernelArg::buffer(dy),
        KernelArg::optional(y),
        KernelArg::optional_mut(out),
        KernelArg::buffer_mut(dw),
        KernelArg::optional_mut(db),
    ];
    args.extend(device.scratch()?);
    args.extend(conv_dims(s));
    args.push(i32_arg(splits));
    let cfg = tile.launch(depth, s.out_c, splits);
    // SAFETY: the arguments were checked as the operation's (module docs): with `y`, `dy`
    // has the size of a 2x2, stride-2 pool of it and `out` (the op's workspace) its size;
    // the scratch area holds `splits` partial gradients (filter_splits) and a counter per
    // tile.
    unsafe { device.launch(kernel.kernel(T::DTYPE), cfg, &args) }
}

/// Output channels a warp of `kernels/conv_direct.cu` takes (`DIRECT_CHANNELS`).
const DIRECT_CHANNELS: usize = 4;

/// The blocks of `kernels/conv_direct.cu`'s kernels for `s`: a warp per [`DIRECT_CHANNELS`]
/// output channels, up to 8 warps a block, `depth` blocks along x (an image or a slice of
/// images each), the shared memory `shared` floats.
fn direct_launch(s: &Conv2dShape, depth: usize, shared: usize) -> LaunchConfig {
    let groups = s.out_c.div_ceil(DIRECT_CHANNELS);
    let warps = groups.min(8);
    LaunchConfig {
        grid: (depth as u32, groups.div_ceil(warps) as u32, 1),
        block: (32 * warps as u32, 1, 1),
        shared_bytes: (shared * 4) as u32,
    }
}

/// Floats a staged row of `s`'s image takes in `kernels/conv_direct.cu` (`direct_pitch`:
/// the padded width rounded up to even).
fn direct_pitch(s: &Conv2dShape) -> usize {
    (s.in_w + 2 * s.pad).next_multiple_of(2)
}

/// Floats of shared memory `kernels/conv_direct.cu` stages an image of `s` in (with a zero
/// border of the padding).
fn direct_image_floats(s: &Conv2dShape) -> usize {
    (s.in_h + 2 * s.pad) * direct_pitch(s)
}

/// Whether `kernels/conv_direct.cu` runs `s` with its fused 2x2 pool: one input channel, a
/// 3x3 filter at stride 1 (LeNet's conv1; `DIRECT_K`), and an image that fits the 48 KiB of
/// shared memory every GPU grants without opting in (with 1 KiB for static shared memory).
fn direct_fits(s: &Conv2dShape) -> bool {
    (s.in_c, s.k_h, s.k_w, s.stride) == (1, 3, 3, 1)
        && direct_image_floats(s) * 4 + 1024 <= 48 << 10
}

/// Launches `kernels/conv_direct.cu`'s forward: `y` at the pool windows' pixels where given,
/// and `pooled`.
fn launch_direct_forward<D: KernelDevice, T: Precision>(
    device: &D,
    s: &Conv2dShape,
    (x, w, bias): ConvOperands<'_, D, T>,
    y: Option<&mut D::Buffer<T>>,
    pooled: &mut D::Buffer<T>,
) -> OpResult {
    let mut args = vec![
        KernelArg::buffer(x),
        KernelArg::buffer(w),
        KernelArg::optional(bias),
        KernelArg::optional_mut(y),
        KernelArg::buffer_mut(pooled),
    ];
    args.extend(conv_dims(s));
    let cfg = direct_launch(s, s.batch, direct_image_floats(s));
    let kernel = PrecisionOp::ConvDirectReluPoolForward.kernel(T::DTYPE);
    // SAFETY: the arguments were checked as the operation's (module docs): `pooled` has the
    // size of a 2x2, stride-2 pool of `y`; the shared memory is what the kernel stages
    // (direct_fits).
    unsafe { device.launch(kernel, cfg, &args) }
}

/// Pieces (bands of an image's pooled rows) the direct filter gradient aims to cut a batch
/// into: about four blocks an H100 SM (more, smaller pieces measured slower: each piece
/// stages its rows and reduces its lanes once). A constant, so the split, and every bit of
/// the result, is the same on every GPU.
const DIRECT_PIECES: usize = 512;

/// Launches `kernels/conv_direct.cu`'s filter and bias gradients through the pool and ReLU:
/// the batch's images cut into bands of pooled rows for about [`DIRECT_PIECES`] pieces, a
/// piece a block where the scratch area holds that many partial sums ([`split_fits`]).
fn launch_direct_filter<D: KernelDevice, T: Precision>(
    device: &D,
    s: &Conv2dShape,
    x: &D::Buffer<T>,
    relu: ReluOutput<'_, D, T>,
    d_pooled: &D::Buffer<T>,
    dw: &mut D::Buffer<f32>,
    db: &mut D::Buffer<f32>,
) -> OpResult {
    let pooled_rows = (s.out_h() / 2).max(1);
    let bands = DIRECT_PIECES.div_ceil(s.batch.max(1)).min(pooled_rows);
    let band_rows = pooled_rows.div_ceil(bands);
    let pieces = s.batch.max(1) * pooled_rows.div_ceil(band_rows);
    let partial = s.out_c * (s.k_h * s.k_w + 1);
    let tiles = direct_launch(s, 1, 0).grid.1 as usize;
    let slices = fitting_splits(pieces, tiles, partial);
    // No empty slice: the kernel gives each ⌈pieces / slices⌉ pieces.
    let slices = pieces.div_ceil(pieces.div_ceil(slices));
    let (y, w, bias) = match relu {
        ReluOutput::Kept(y) => (Some(y), None, None),
        ReluOutput::Recomputed(w, bias) => (None, Some(w), bias),
    };
    let mut args = vec![
        KernelArg::buffer(x),
        KernelArg::optional(y),
        KernelArg::optional(w),
        KernelArg::optional(bias),
        KernelArg::buffer(d_pooled),
        KernelArg::buffer_mut(dw),
        KernelArg::buffer_mut(db),
    ];
    args.extend(device.scratch()?);
    args.extend(conv_dims(s));
    args.push(i32_arg(band_rows));
    // The input rows a band's pixels read (stride 1), staged.
    let rows = 2 * band_rows + s.k_h - 1;
    let cfg = direct_launch(s, slices, rows * direct_pitch(s));
    let kernel = PrecisionOp::ConvDirectReluPoolFilter.kernel(T::DTYPE);
    // SAFETY: the arguments were checked as the operation's (module docs): `d_pooled` has the
    // size of a 2x2, stride-2 pool of `y`; the scratch area holds `slices` partial gradients
    // and the counters of `tiles` tiles (split_fits).
    unsafe { device.launch(kernel, cfg, &args) }
}

/// A block tile of `kernels/conv.cu`'s implicit GEMMs: `rows` x `cols` outputs of the
/// product, `threads` per block, `resident` blocks an H100 SM holds at once (its registers
/// and threads: the kernel's `__launch_bounds__` minimum).
#[derive(Clone, Copy)]
struct ConvTile {
    rows: usize,
    cols: usize,
    threads: u32,
    resident: usize,
}

const TILE_64X64: ConvTile = ConvTile {
    rows: 64,
    cols: 64,
    threads: 256,
    resident: 2,
};
const TILE_32X128: ConvTile = ConvTile {
    rows: 32,
    cols: 128,
    threads: 256,
    resident: 3,
};
const TILE_32X16: ConvTile = ConvTile {
    rows: 32,
    cols: 16,
    threads: 128,
    resident: 8,
};

impl ConvTile {
    /// The grid over a product of `rows` x `cols` outputs, `depth` blocks deep.
    fn launch(self, cols: usize, rows: usize, depth: usize) -> LaunchConfig {
        LaunchConfig {
            grid: (
                blocks(cols, self.cols),
                blocks(rows, self.rows),
                depth as u32,
            ),
            block: (self.threads, 1, 1),
            shared_bytes: 0,
        }
    }

    fn count(self, cols: usize, rows: usize) -> usize {
        cols.div_ceil(self.cols) * rows.div_ceil(self.rows)
    }
}

/// Blocks a GEMM aims for (`kernels/gemm.cu`): a product with fewer 64x64 tiles of C takes
/// the sliced kernels' 16x16 tiles. A constant, so the kernel, and with it every bit of the
/// result, is the same on every GPU.
const GEMM_BLOCKS: usize = 128;

/// 64x64 tiles of an M x N product.
fn gemm_tiles(m: usize, n: usize) -> usize {
    m.div_ceil(64) * n.div_ceil(64)
}

/// Slots per group of a split reduction's first level: all of them up to 16, else
/// ⌈√splits⌉ (`kernels/split_sum.cuh`, `split_group`).
fn split_group(splits: usize) -> usize {
    if splits <= 16 {
        return splits;
    }
    let mut g = 1;
    while g * g < splits {
        g += 1;
    }
    g
}

/// Whether a split reduction of `splits` partials of `partial` floats over `tiles` tiles fits
/// the scratch area: `splits` level-1 and ⌈splits / group⌉ level-2 partials, and that many
/// counters plus one per tile (`kernels/split_sum.cuh`).
fn split_fits(splits: usize, tiles: usize, partial: usize) -> bool {
    split_fits_with(splits, tiles, partial, SCRATCH_FLOATS)
}

/// The most splits, at most `wanted` and at least 1, whose partials of `partial` floats over
/// `tiles` tiles the scratch area holds ([`split_fits`]; 1 needs no partials).
fn fitting_splits(wanted: usize, tiles: usize, partial: usize) -> usize {
    let mut splits = wanted.max(1);
    while splits > 1 && !split_fits(splits, tiles, partial) {
        splits -= 1;
    }
    splits
}

/// [`split_fits`] in `floats` of the scratch area.
fn split_fits_with(splits: usize, tiles: usize, partial: usize, floats: usize) -> bool {
    let groups = splits.div_ceil(split_group(splits));
    (splits + groups) * partial <= floats && tiles * (groups + 1) <= SCRATCH_COUNTERS
}

/// Launches `kernels/step.cu`'s gather, and with `begin` the step's scalars from its first
/// thread (the kernel's step_begin arguments are null without).
fn launch_gather<D: KernelDevice, T: Precision>(
    device: &D,
    op: GatherBatch<'_, D, T>,
    begin: Option<BeginStep<'_, D>>,
) -> OpResult {
    let (image, n) = (op.image(), op.y.len());
    let mut args = vec![
        KernelArg::buffer(op.pixels),
        KernelArg::buffer(op.labels),
        KernelArg::U64(op.labels.len() as u64),
        KernelArg::buffer(op.order),
        KernelArg::U64(op.order.len() as u64),
        KernelArg::buffer(op.batch),
        i32_arg(op.shard),
        i32_arg(image),
        i32_arg(n),
        KernelArg::buffer_mut(op.x),
        KernelArg::buffer_mut(op.y),
    ];
    match begin {
        Some(b) => args.extend([
            KernelArg::buffer(b.lr_table),
            KernelArg::U64(b.lr_table.len() as u64),
            KernelArg::buffer(b.loss_scale),
            KernelArg::F32(b.global as f32),
            KernelArg::buffer_mut(&mut b.out.lr),
            KernelArg::buffer_mut(&mut b.out.grad_scale),
            KernelArg::buffer_mut(&mut b.out.inv_scale),
        ]),
        None => args.extend([
            KernelArg::optional::<f32, D::Buffer<f32>>(None),
            KernelArg::U64(0),
            KernelArg::optional::<f32, D::Buffer<f32>>(None),
            KernelArg::F32(1.0),
            KernelArg::optional_mut::<f32, D::Buffer<f32>>(None),
            KernelArg::optional_mut::<f32, D::Buffer<f32>>(None),
            KernelArg::optional_mut::<f32, D::Buffer<f32>>(None),
        ]),
    }
    // SAFETY: see the module docs; every index the kernel reads is checked against the
    // lengths it is given, and the step's scalars hold one element each (checked).
    unsafe {
        device.launch(
            PrecisionOp::GatherBatch.kernel(T::DTYPE),
            LaunchConfig::flat(n * image),
            &args,
        )
    }
}

/// Rows of the batch per block of `softmax_head` (`HEAD_ROWS` in `kernels/loss.cu`).
const HEAD_ROWS: usize = 8;
/// Threads per block of `softmax_head` (`HEAD_THREADS`).
const HEAD_THREADS: usize = 512;
/// A `softmax_head` block's staged rows' floats at most (`HEAD_MAX_PITCH`).
const HEAD_MAX_PITCH: usize = 160;

/// A staged row's floats in `softmax_head`: `hidden` rounded up to a multiple of 16, plus
/// four (`head_pitch` in `kernels/loss.cu`).
fn head_pitch(hidden: usize) -> usize {
    hidden.next_multiple_of(16) + 4
}

/// Floats of dynamic shared memory a `softmax_head` block uses: its rows of h and of dh and
/// all of w ([`head_pitch`] floats a row), and its rows' logits (`head_shared_floats` in
/// `kernels/loss.cu`).
fn head_shared_floats(hidden: usize, classes: usize) -> usize {
    (2 * HEAD_ROWS + classes) * head_pitch(hidden) + HEAD_ROWS * classes
}

/// Whether `softmax_head` runs a head of these sizes: a warp per row holds the classes (at
/// most 32), a block's shared memory (with 1 KiB for its few hundred static bytes) fits the
/// 48 KiB every GPU grants without opting in, its rows fit [`HEAD_MAX_PITCH`], and the
/// scratch area holds the blocks' shares of the gradients and statistics (3 floats a block)
/// in a split reduction ([`split_fits`]).
fn head_fits(rows: usize, hidden: usize, classes: usize, grad: bool) -> bool {
    let splits = rows.div_ceil(HEAD_ROWS);
    let share = if grad {
        classes * hidden + classes + hidden
    } else {
        0
    };
    let stats = 3 * splits;
    classes <= 32
        && head_pitch(hidden) <= HEAD_MAX_PITCH
        && head_shared_floats(hidden, classes) * 4 + 1024 <= 48 << 10
        && stats < SCRATCH_FLOATS
        && split_fits_with(splits, 1, share, SCRATCH_FLOATS - stats)
}

/// Filter-gradient blocks a launch aims for per block of a tile's shape an SM holds at once
/// ([`ConvTile::resident`]): 128, about an H100's 132 SMs, a constant (not the GPU's own
/// count) so the split, and with it every bit of the result, is the same on every GPU.
const FILTER_BLOCKS_PER_RESIDENT: usize = 128;

/// Pixels (reduction steps) a filter-gradient block takes at least: four of the kernel's
/// 16-step slices, so that a block's fixed costs (its partial tile, the split sum) stay
/// small beside its products.
const FILTER_MIN_PIXELS: usize = 64;

/// Slices of the batch's pixels (`region` of each plane) the filter gradient is split into:
/// enough blocks to fill every SM ([`FILTER_BLOCKS_PER_RESIDENT`]), each at least
/// [`FILTER_MIN_PIXELS`], as many as the scratch area holds ([`split_fits`]; 1, no partials,
/// when none does).
fn filter_splits(s: &Conv2dShape, tile: ConvTile, region: usize) -> usize {
    let depth = s.in_c * s.k_h * s.k_w;
    let tiles = tile.count(depth, s.out_c);
    let partial = s.out_c * depth + s.out_c;
    let pixels = s.batch * region;
    let wanted =
        (FILTER_BLOCKS_PER_RESIDENT * tile.resident / tiles).min(pixels / FILTER_MIN_PIXELS);
    fitting_splits(wanted, tiles, partial)
}

/// Launches pooling `op` on `T` storage: `buffers`, then the shape's dimensions, one thread
/// per element of the output (forward) or of the input gradient (backward, which writes
/// each input element once).
///
/// # Safety
/// `buffers` are the kernel's buffer parameters, of the lengths `shape` implies.
unsafe fn launch_pool<D: KernelDevice, T: Precision>(
    device: &D,
    op: PrecisionOp,
    shape: &Pool2dShape,
    buffers: &[KernelArg],
) -> OpResult {
    let (xs, ys) = shape.sizes();
    let threads = match op {
        PrecisionOp::MaxPoolForward | PrecisionOp::AvgPoolForward => ys,
        _ => xs,
    };
    let mut args = buffers.to_vec();
    args.extend(pool_dims(shape));
    // SAFETY: forwarded from the caller; the dimensions are the shape's own.
    unsafe { device.launch(op.kernel(T::DTYPE), LaunchConfig::flat(threads), &args) }
}

/// Launches an element-wise conversion `kernel` from `x` to `out` (equal lengths).
/// The SGD kernels' trailing arguments, alike for one tensor and for a table of them: the
/// step's host values, then where the device holds the rate and unscaling (`at`, or null),
/// and the overflow flag (`found`, or null).
fn sgd_scalars<D: KernelDevice>(
    step: crate::backend::SgdStep,
    at: Option<&crate::backend::StepScalars<D>>,
    found: Option<&D::Buffer<i32>>,
) -> [KernelArg; 7] {
    [
        KernelArg::F32(step.lr),
        KernelArg::F32(step.inv_scale),
        KernelArg::F32(step.momentum),
        KernelArg::F32(step.weight_decay),
        KernelArg::optional(at.map(|at| &at.lr)),
        KernelArg::optional(at.map(|at| &at.inv_scale)),
        KernelArg::optional(found),
    ]
}

fn launch_cast<D: KernelDevice, S: DeviceScalar, T: DeviceScalar>(
    device: &D,
    kernel: &'static KernelSignature,
    x: &D::Buffer<S>,
    out: &mut D::Buffer<T>,
) -> OpResult {
    let n = x.len();
    let args = [
        KernelArg::buffer(x),
        KernelArg::buffer_mut(out),
        KernelArg::U64(n as u64),
    ];
    // SAFETY: the lengths were checked equal; the kernel touches [0, n) of each.
    unsafe { device.launch(kernel, LaunchConfig::flat(n), &args) }
}

fn pool_dims(s: &Pool2dShape) -> [KernelArg; 8] {
    [
        i32_arg(s.planes),
        i32_arg(s.in_h),
        i32_arg(s.in_w),
        i32_arg(s.k_h),
        i32_arg(s.k_w),
        i32_arg(s.stride),
        i32_arg(s.out_h()),
        i32_arg(s.out_w()),
    ]
}

impl<D: KernelDevice> BackendImpl for D {
    fn fill(&self, op: Checked<Fill<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let n = op.out.len();
        // SAFETY: see the module docs.
        unsafe { ew::fill_f32(self, LaunchConfig::flat(n), op.out, op.value, n as u64) }
    }

    fn scale(&self, op: Checked<Scale<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let n = op.x.len();
        // SAFETY: see the module docs.
        unsafe { ew::scale_f32(self, LaunchConfig::flat(n), op.x, op.alpha, n as u64) }
    }

    fn axpy(&self, op: Checked<Axpy<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let n = op.y.len();
        // SAFETY: see the module docs.
        unsafe { ew::axpy_f32(self, LaunchConfig::flat(n), op.x, op.y, op.alpha, n as u64) }
    }

    fn add(&self, op: Checked<Add<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let n = op.out.len();
        // SAFETY: see the module docs.
        unsafe { ew::add_f32(self, LaunchConfig::flat(n), op.a, op.b, op.out, n as u64) }
    }

    fn cast_from_f32<T: Precision>(&self, op: Checked<Cast<'_, D, f32, T>>) -> OpResult {
        let op = op.into_inner();
        launch_cast(
            self,
            PrecisionOp::CastFromF32.kernel(T::DTYPE),
            op.x,
            op.out,
        )
    }

    fn cast_to_f32<T: Precision>(&self, op: Checked<Cast<'_, D, T, f32>>) -> OpResult {
        let op = op.into_inner();
        launch_cast(self, PrecisionOp::CastToF32.kernel(T::DTYPE), op.x, op.out)
    }

    fn relu_backward<T: Precision>(&self, op: Checked<ReluBackward<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        let n = op.y.len();
        let args = [
            KernelArg::buffer(op.y),
            KernelArg::buffer(op.dy),
            KernelArg::buffer_mut(op.dx),
            KernelArg::U64(n as u64),
        ];
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::ReluBackward.kernel(T::DTYPE),
                LaunchConfig::flat(n),
                &args,
            )
        }
    }

    fn gemm<A: Precision, O: Precision>(&self, op: Checked<Gemm<'_, D, A, O>>) -> OpResult {
        let kernels = gemm_kernels(A::DTYPE, O::DTYPE)?;
        let (m, n) = (op.shape.m, op.shape.n);
        // 64x64 tiles where there are enough of them (256 threads on CUDA cores, 4 warps of
        // wmma fragments for half), else 16x16 tiles with K cut among each block's 8 warps.
        let (kernel, tile, threads) = if gemm_tiles(m, n) >= GEMM_BLOCKS {
            let threads = if A::DTYPE.is_half() { 128 } else { 256 };
            (kernels.tiled, 64, threads)
        } else {
            (kernels.sliced, 16, 256)
        };
        let cfg = LaunchConfig {
            grid: (blocks(n, tile), blocks(m, tile), 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        };
        let args = gemm_args(op.into_inner());
        // SAFETY: see the module docs.
        unsafe { self.launch(kernel, cfg, &args) }
    }

    fn conv2d_forward<T: Precision>(&self, op: Checked<Conv2dForward<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        launch_conv_forward(self, op.shape, (op.x, op.w, op.bias), op.y, None, op.relu)
    }

    /// One launch where the pool is LeNet's kind (2x2, stride 2: the convolution's epilogue
    /// pools; `kernels/conv_direct.cu` for a one-channel 3x3 filter at stride 1), else the
    /// convolution, then the pool.
    fn conv2d_relu_avg_pool_forward<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolForward<'_, D, T>>,
    ) -> OpResult {
        if !fuses_pool(op.pool) {
            return conv_relu_then_pool(self, op);
        }
        let op = op.into_inner();
        let inputs = (op.x, op.w, op.bias);
        if direct_fits(op.conv) {
            return launch_direct_forward(self, op.conv, inputs, Some(op.y), op.pooled);
        }
        launch_conv_forward(self, op.conv, inputs, op.y, Some(op.pooled), true)
    }

    fn conv2d_backward_input<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardInput<'_, D, T>>,
    ) -> OpResult {
        let op = op.into_inner();
        let plane = output_region(op.shape, false);
        launch_conv_backward_input(self, op.shape, op.dy, op.w, op.dx, plane)
    }

    /// One launch for the filter gradient and, when asked, the bias gradient.
    fn conv2d_backward_filter<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardFilter<'_, D, T>>,
    ) -> OpResult {
        let op = op.into_inner();
        let dy = FilterDy::Tensor(op.dy);
        launch_conv_backward_filter(self, op.shape, op.x, dy, op.dw, op.db)
    }

    /// Where the pool is 2x2 with stride 2, the filter gradient's kernel reads the pool's
    /// output gradient and the ReLU's output itself, and, when the input gradient is wanted,
    /// writes the convolution's output gradient it computed at the pool windows' pixels into
    /// `workspace` for the input gradient's kernel to read there: one launch, or two. A first
    /// layer (no input gradient) of one channel and a 3x3 filter at stride 1 takes
    /// `kernels/conv_direct.cu`'s filter gradient. Other pools: the trait's default.
    fn conv2d_relu_avg_pool_backward<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolBackward<'_, D, T>>,
    ) -> OpResult {
        if !fuses_pool(op.pool) {
            return unpool_then_backward(self, op);
        }
        let op = op.into_inner();
        if op.input.is_none() && direct_fits(op.conv) {
            let (x, y, d_pooled) = (op.x, ReluOutput::Kept(op.y), op.d_pooled);
            return launch_direct_filter(self, op.conv, x, y, d_pooled, op.dw, op.db);
        }
        let dy = FilterDy::Pooled {
            d_pooled: op.d_pooled,
            y: op.y,
            out: op.input.is_some().then_some(&mut *op.workspace),
        };
        launch_conv_backward_filter(self, op.conv, op.x, dy, op.dw, Some(op.db))?;
        // The filter gradient's kernel wrote the output gradient at the windows' pixels (it is
        // zero past them): the input gradient reads those.
        let windows = output_region(op.conv, true);
        match op.input {
            Some((w, dx)) => {
                launch_conv_backward_input(self, op.conv, op.workspace, w, dx, windows)
            }
            None => Ok(()),
        }
    }

    /// Where `kernels/conv_direct.cu` takes the layer under LeNet's pool: its filter gradient
    /// recomputes the ReLU's output from the staged images.
    fn recomputes_relu(&self, conv: &Conv2dShape, pool: &Pool2dShape) -> bool {
        fuses_pool(pool) && direct_fits(conv)
    }

    /// One launch of `kernels/conv_direct.cu`'s forward writing no `y`, where it recomputes
    /// ([`BackendImpl::recomputes_relu`]); else the trait's default.
    fn conv2d_relu_avg_pool_forward_pooled<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolForwardPooled<'_, D, T>>,
    ) -> OpResult {
        if !BackendImpl::recomputes_relu(self, op.conv, op.pool) {
            return forward_into_temporary(self, op);
        }
        let op = op.into_inner();
        launch_direct_forward(self, op.conv, (op.x, op.w, op.bias), None, op.pooled)
    }

    /// One launch of `kernels/conv_direct.cu`'s filter gradient recomputing the ReLU's
    /// output, where it recomputes ([`BackendImpl::recomputes_relu`]); else the trait's
    /// default.
    fn conv2d_relu_avg_pool_backward_recomputed<T: Precision>(
        &self,
        op: Checked<Conv2dReluAvgPoolBackwardRecomputed<'_, D, T>>,
    ) -> OpResult {
        if !BackendImpl::recomputes_relu(self, op.conv, op.pool) {
            return recompute_then_backward(self, op);
        }
        let op = op.into_inner();
        let relu = ReluOutput::Recomputed(op.w, op.bias);
        launch_direct_filter(self, op.conv, op.x, relu, op.d_pooled, op.dw, op.db)
    }

    fn conv2d_backward_bias<T: Precision>(
        &self,
        op: Checked<Conv2dBackwardBias<'_, D, T>>,
    ) -> OpResult {
        let op = op.into_inner();
        let args = [
            KernelArg::buffer(op.dy),
            KernelArg::buffer_mut(op.db),
            i32_arg(op.shape.batch),
            i32_arg(op.shape.out_c),
            i32_arg(op.shape.out_h() * op.shape.out_w()),
        ];
        let cfg = LaunchConfig {
            grid: (op.shape.out_c as u32, 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe { self.launch(PrecisionOp::Conv2dBackwardBias.kernel(T::DTYPE), cfg, &args) }
    }

    fn max_pool_forward<T: Precision>(&self, op: Checked<MaxPoolForward<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        let buffers = [
            KernelArg::buffer(op.x),
            KernelArg::buffer_mut(op.y),
            KernelArg::buffer_mut(op.argmax),
        ];
        // SAFETY: see the module docs.
        unsafe { launch_pool::<D, T>(self, PrecisionOp::MaxPoolForward, op.shape, &buffers) }
    }

    fn max_pool_backward<T: Precision>(&self, op: Checked<MaxPoolBackward<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        let buffers = [
            KernelArg::buffer(op.dy),
            KernelArg::buffer(op.argmax),
            KernelArg::buffer_mut(op.dx),
        ];
        // SAFETY: see the module docs (argmax holds max_pool_forward's in-plane indices).
        unsafe { launch_pool::<D, T>(self, PrecisionOp::MaxPoolBackward, op.shape, &buffers) }
    }

    fn avg_pool_forward<T: Precision>(&self, op: Checked<AvgPoolForward<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        let buffers = [KernelArg::buffer(op.x), KernelArg::buffer_mut(op.y)];
        // SAFETY: see the module docs.
        unsafe { launch_pool::<D, T>(self, PrecisionOp::AvgPoolForward, op.shape, &buffers) }
    }

    fn avg_pool_backward<T: Precision>(&self, op: Checked<AvgPoolBackward<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        let buffers = [KernelArg::buffer(op.dy), KernelArg::buffer_mut(op.dx)];
        // SAFETY: see the module docs.
        unsafe { launch_pool::<D, T>(self, PrecisionOp::AvgPoolBackward, op.shape, &buffers) }
    }

    fn avg_pool_relu_backward<T: Precision>(
        &self,
        op: Checked<AvgPoolReluBackward<'_, D, T>>,
    ) -> OpResult {
        let op = op.into_inner();
        let buffers = [
            KernelArg::buffer(op.d_pooled),
            KernelArg::buffer(op.y),
            KernelArg::buffer_mut(op.dx),
        ];
        // SAFETY: see the module docs; `y` has the length of `dx` (checked).
        unsafe { launch_pool::<D, T>(self, PrecisionOp::AvgPoolReluBackward, op.pool, &buffers) }
    }

    fn softmax_cross_entropy<T: Precision>(
        &self,
        op: Checked<SoftmaxCrossEntropy<'_, D, T>>,
    ) -> OpResult {
        let op = op.into_inner();
        let args = [
            KernelArg::buffer(op.logits),
            KernelArg::buffer(op.labels),
            KernelArg::buffer_mut(op.loss),
            KernelArg::optional_mut(op.grad),
            KernelArg::buffer_mut(op.correct),
            i32_arg(op.rows),
            i32_arg(op.classes),
            KernelArg::F32(op.grad_scale),
            KernelArg::optional(op.at.map(|at| &at.grad_scale)),
        ];
        let cfg = LaunchConfig {
            grid: (blocks(op.rows, 8), 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::SoftmaxCrossEntropy.kernel(T::DTYPE),
                cfg,
                &args,
            )
        }
    }

    /// One launch of `kernels/loss.cu`'s `softmax_head` where the head fits it
    /// (`head_fits`), else the trait's default.
    fn softmax_head<T: Precision>(&self, op: Checked<SoftmaxHead<'_, D, T>>) -> OpResult {
        let (rows, hidden, classes) = (op.rows, op.hidden, op.classes);
        let grad = op.grad.is_some();
        if !head_fits(rows, hidden, classes, grad) {
            return head_unfused(self, op);
        }
        let op = op.into_inner();
        let grad_scale = op.grad.as_ref().map_or(0.0, |g| g.grad_scale);
        let at = op.grad.as_ref().and_then(|g| g.at).map(|at| &at.grad_scale);
        let (d_logits, dw, db, dh, dh_bias) = match op.grad {
            Some(g) => (
                Some(g.d_logits),
                Some(g.dw),
                Some(g.db),
                Some(g.dh),
                Some(g.dh_bias),
            ),
            None => (None, None, None, None, None),
        };
        let mut args = vec![
            KernelArg::buffer(op.h),
            KernelArg::buffer(op.w),
            KernelArg::buffer(op.b),
            KernelArg::buffer(op.labels),
            KernelArg::buffer_mut(op.logits),
            KernelArg::buffer_mut(op.loss),
            KernelArg::buffer_mut(op.stats),
            KernelArg::I32(op.accumulate.into()),
            KernelArg::optional_mut(d_logits),
            KernelArg::optional_mut(dw),
            KernelArg::optional_mut(db),
            KernelArg::optional_mut(dh),
            KernelArg::optional_mut(dh_bias),
            i32_arg(rows),
            i32_arg(hidden),
            i32_arg(classes),
            KernelArg::F32(grad_scale),
            KernelArg::optional(at),
        ];
        args.extend(self.scratch()?);
        let cfg = LaunchConfig {
            grid: (blocks(rows, HEAD_ROWS), 1, 1),
            block: (HEAD_THREADS as u32, 1, 1),
            shared_bytes: (head_shared_floats(hidden, classes) * 4) as u32,
        };
        // SAFETY: see the module docs; head_fits checked the shared memory and the scratch
        // area the kernel uses.
        unsafe { self.launch(PrecisionOp::SoftmaxHead.kernel(T::DTYPE), cfg, &args) }
    }

    fn grad_check<G: Precision>(&self, op: Checked<GradCheck<'_, D, G>>) -> OpResult {
        let op = op.into_inner();
        let n = op.grad.len();
        let args = [
            KernelArg::buffer(op.grad),
            KernelArg::U64(n as u64),
            KernelArg::buffer_mut(op.found),
        ];
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::GradCheck.kernel(G::DTYPE),
                LaunchConfig::flat(n),
                &args,
            )
        }
    }

    fn sgd_step<T: Precision>(&self, op: Checked<Sgd<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        let n = op.w.len();
        let args = [
            KernelArg::buffer_mut(op.w),
            KernelArg::buffer(op.grad),
            KernelArg::optional_mut(op.velocity),
            KernelArg::optional_mut(op.w_copy),
            KernelArg::U64(n as u64),
        ]
        .into_iter()
        .chain(sgd_scalars(op.step, op.at, op.found))
        .collect::<Vec<_>>();
        // SAFETY: see the module docs.
        unsafe {
            self.launch(
                PrecisionOp::SgdStep.kernel(T::DTYPE),
                LaunchConfig::flat(n),
                &args,
            )
        }
    }

    fn sgd_step_many<T: Precision>(&self, op: Checked<SgdMany<'_, D, T>>) -> OpResult {
        let op = op.into_inner();
        let words: Vec<u64> = op.tensors.iter().flat_map(|t| t.words()).collect();
        op.table.point(self, &words)?;
        let longest = op.tensors.iter().map(|t| t.w.len()).max().unwrap_or(0);
        let mut cfg = LaunchConfig::flat(longest);
        cfg.grid.1 = op.tensors.len() as u32;
        let args = [KernelArg::buffer(&op.table.table)]
            .into_iter()
            .chain(sgd_scalars(op.step, op.at, op.found))
            .collect::<Vec<_>>();
        // SAFETY: see the module docs; the table holds each checked tensor's live addresses
        // and length (just pointed), and the grid's y covers exactly those tensors.
        unsafe { self.launch(PrecisionOp::SgdStepTensors.kernel(T::DTYPE), cfg, &args) }
    }

    fn grad_check_many(&self, op: Checked<GradCheckMany<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let words: Vec<u64> = op
            .grads
            .iter()
            .flat_map(|g| [0, g.device_addr(), 0, 0, g.len() as u64])
            .collect();
        op.table.point(self, &words)?;
        let longest = op.grads.iter().map(|g| g.len()).max().unwrap_or(0);
        let mut cfg = LaunchConfig::flat(longest);
        cfg.grid.1 = op.grads.len() as u32;
        // SAFETY: as sgd_step_many.
        unsafe { optim_kernels::grad_check_tensors(self, cfg, &op.table.table, op.found) }
    }

    fn gather_batch<T: Precision>(&self, op: Checked<GatherBatch<'_, D, T>>) -> OpResult {
        launch_gather(self, op.into_inner(), None)
    }

    /// One launch: the gather's first thread computes the step's scalars.
    fn gather_batch_and_begin<T: Precision>(
        &self,
        op: Checked<GatherAndBegin<'_, D, T>>,
    ) -> OpResult {
        let GatherAndBegin { gather, begin } = op.into_inner();
        launch_gather(self, gather, Some(begin))
    }

    fn step_begin(&self, op: Checked<StepBegin<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let out = op.out;
        // SAFETY: see the module docs (one thread; every buffer holds one element, the
        // table's length is passed).
        unsafe {
            step::step_begin(
                self,
                LaunchConfig::single(),
                op.lr_table,
                op.lr_table.len() as u64,
                op.batch,
                op.loss_scale,
                op.global as f32,
                &mut out.lr,
                &mut out.grad_scale,
                &mut out.inv_scale,
            )
        }
    }

    fn shard_stats(&self, op: Checked<ShardStats<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let cfg = LaunchConfig {
            grid: (1, 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
        };
        // SAFETY: see the module docs (one block of the 256 threads the kernel sums with).
        unsafe {
            step::shard_stats(
                self,
                cfg,
                op.loss,
                op.loss.len() as i32,
                op.correct,
                op.out,
                op.accumulate.into(),
            )
        }
    }

    fn step_end(&self, op: Checked<StepEnd<'_, D>>) -> OpResult {
        let op = op.into_inner();
        let slots = (op.ring.len() / crate::backend::step::RECORD) as i32;
        let args = [
            KernelArg::buffer_mut(op.loss_scale),
            KernelArg::optional_mut(op.clean),
            KernelArg::optional_mut(op.found),
            KernelArg::I32(op.growth_interval.min(i32::MAX as usize) as i32),
            KernelArg::buffer_mut(op.batch),
            KernelArg::buffer(op.current),
            KernelArg::Ptr {
                addr: op.ring.device_addr(),
                elem: Scalar::F32,
                mutable: true,
            },
            KernelArg::I32(slots),
        ];
        // SAFETY: see the module docs (one thread; the ring's slots are passed; the ring is
        // host memory mapped for the device, alive while `op` borrows it).
        unsafe { self.launch(&step::STEP_END, LaunchConfig::single(), &args) }
    }
}
