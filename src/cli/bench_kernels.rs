//! `nanoddp bench kernels`: time the operations LeNet trains with, at its shapes, and 1024³
//! GEMM, and set the GFLOP/s against this machine's measured peak.

use std::io::Write;
use std::time::Instant;

use half::{bf16, f16};
use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::cuda::CudaDevice;
use nanoddp::backend::simt::SimtDevice;
use nanoddp::backend::{Backend, BackendError, Conv2dShape, Epilogue, GemmShape, Precision};
use nanoddp::dtype::DType;
use nanoddp::model::LENET;
use nanoddp::system;

use super::args::BackendArg;
use super::CliError;

/// The largest `--batch`: LeNet's activations take about 60 KB per image and operation set,
/// so this stays under a gigabyte.
const MAX_BATCH: usize = 16384;

/// One timed operation.
struct Row {
    name: String,
    flops: f64,
    median_s: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `op` once to warm up, then `repeats` times, synchronizing after each.
fn time<B: Backend>(
    dev: &B,
    repeats: usize,
    mut op: impl FnMut() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    op()?;
    dev.synchronize()?;
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        op()?;
        dev.synchronize()?;
        samples.push(start.elapsed().as_secs_f64());
    }
    Ok(median(samples))
}

fn filled<B: Backend, T: Precision>(dev: &B, n: usize) -> Result<B::Buffer<T>, BackendError> {
    // Deterministic, non-trivial values (not zeros: some CPUs shortcut them).
    let host: Vec<T> = (0..n)
        .map(|i| T::from_f32(((i * 7919) % 1000) as f32 / 1000.0 - 0.5))
        .collect();
    dev.upload(&host)
}

/// A product of `A`-typed operands into a `C`-typed result.
fn gemm_row<B: Backend, A: Precision, C: Precision>(
    dev: &B,
    name: &str,
    s: GemmShape,
    repeats: usize,
) -> Result<Row, BackendError> {
    let a = filled::<B, A>(dev, s.m * s.k)?;
    let b = filled::<B, A>(dev, s.k * s.n)?;
    let mut c = dev.alloc_zeros::<C>(s.m * s.n)?;
    let t = time(dev, repeats, || {
        dev.gemm(&s, &a, &b, None, &mut c, Epilogue::default())
    })?;
    Ok(Row {
        name: format!("{name} {}x{}x{}", s.m, s.n, s.k),
        flops: s.flops(),
        median_s: t,
    })
}

fn conv_rows<B: Backend, T: Precision>(
    dev: &B,
    name: &str,
    s: Conv2dShape,
    repeats: usize,
) -> Result<Vec<Row>, BackendError> {
    let (xs, ws, ys) = s.sizes();
    let x = filled::<B, T>(dev, xs)?;
    let w = filled::<B, T>(dev, ws)?;
    let dy = filled::<B, T>(dev, ys)?;
    let bias = filled::<B, f32>(dev, s.out_c)?;
    let mut y = dev.alloc_zeros::<T>(ys)?;
    let mut dx = dev.alloc_zeros::<T>(xs)?;
    let mut dw = dev.alloc_zeros::<f32>(ws)?;
    let label = format!("{} {}x{}x{} k{}", s.batch, s.in_c, s.in_h, s.in_w, s.k_h);
    let fwd = time(dev, repeats, || {
        dev.conv2d_forward(&s, &x, &w, Some(&bias), &mut y, true)
    })?;
    let bwd_in = time(dev, repeats, || {
        dev.conv2d_backward_input(&s, &dy, &w, &mut dx)
    })?;
    let bwd_w = time(dev, repeats, || {
        dev.conv2d_backward_filter(&s, &x, &dy, &mut dw)
    })?;
    Ok(vec![
        Row {
            name: format!("{name} forward {label}"),
            flops: s.flops(),
            median_s: fwd,
        },
        Row {
            name: format!("{name} backward input"),
            flops: s.flops(),
            median_s: bwd_in,
        },
        Row {
            name: format!("{name} backward filter"),
            flops: s.flops(),
            median_s: bwd_w,
        },
    ])
}

/// The model's operations at storage type `T` (and the 1024³ f32 GEMM when `big_gemm`).
fn lenet_rows<B: Backend, T: Precision>(
    dev: &B,
    batch: usize,
    repeats: usize,
    big_gemm: bool,
) -> Result<Vec<Row>, BackendError> {
    let mut rows = Vec::new();
    if big_gemm {
        rows.push(gemm_row::<B, f32, f32>(
            dev,
            "gemm",
            GemmShape::new(1024, 1024, 1024),
            repeats.min(10),
        )?);
    }
    // The shapes of the model `nanoddp train` trains.
    let (conv1, conv2) = (LENET.conv1(batch), LENET.conv2(batch));
    rows.extend(conv_rows::<B, T>(dev, "conv1", conv1, repeats)?);
    rows.extend(conv_rows::<B, T>(dev, "conv2", conv2, repeats)?);
    for (name, layer) in [("fc1", LENET.fc1(batch)), ("fc2", LENET.fc2(batch))] {
        let fwd = layer.forward();
        let forward = format!("{name} forward");
        rows.push(gemm_row::<B, T, T>(dev, &forward, fwd, repeats)?);
        let dw = layer.weight_gradient();
        let weight_grad = format!("{name} weight grad");
        rows.push(gemm_row::<B, T, f32>(dev, &weight_grad, dw, repeats)?);
    }
    Ok(rows)
}

/// [`lenet_rows`] at the storage type `precision` names.
fn lenet_rows_at<B: Backend>(
    precision: DType,
    dev: &B,
    batch: usize,
    repeats: usize,
    big_gemm: bool,
) -> Result<Vec<Row>, BackendError> {
    match precision {
        DType::F32 => lenet_rows::<B, f32>(dev, batch, repeats, big_gemm),
        DType::F16 => lenet_rows::<B, f16>(dev, batch, repeats, big_gemm),
        DType::BF16 => lenet_rows::<B, bf16>(dev, batch, repeats, big_gemm),
    }
}

/// Prints the table for `target`.
pub fn run(
    out: &mut impl Write,
    target: BackendArg,
    batch: usize,
    repeats: usize,
    precision: DType,
) -> Result<(), CliError> {
    if batch == 0 || batch > MAX_BATCH {
        return Err(CliError::Input(format!(
            "--batch {batch} is out of range: it must be 1 to {MAX_BATCH}"
        )));
    }
    if repeats == 0 || repeats > 10_000 {
        return Err(CliError::Input(format!(
            "--repeats {repeats} is out of range: it must be 1 to 10000"
        )));
    }
    // A missing GPU is the command line's problem, found before anything is measured.
    let cuda = match target {
        BackendArg::Cuda => Some(CudaDevice::new(0).map_err(CliError::Device)?),
        _ => None,
    };
    // On the stand-in, the launch profile (the PTX executor's counts) is what there is to
    // report; its GPU must choose that executor before it loads a module (modules load at
    // a kernel's first launch, not with the device).
    let profiled = cuda.is_some() && nanoddp::backend::cuda::is_standin();
    if profiled {
        super::bench_profile::begin()?;
    }
    writeln!(
        out,
        "operands: {precision} (accumulation and weight gradients f32)"
    )?;
    let peak = system::measure_peak_flops();
    let cpu = system::cpu_info();
    writeln!(
        out,
        "CPU: {} ({} threads); measured peak f32 ({}, FMA on registers): {:.1} GFLOP/s per thread, {:.1} GFLOP/s on {} threads",
        cpu.model.as_deref().unwrap_or("unknown model"),
        cpu.threads,
        peak.isa,
        peak.single_thread,
        peak.all_threads,
        peak.threads
    )?;
    let isa = nanoddp::backend::cpu::isa::isa();
    if precision == DType::BF16 && target == BackendArg::Cpu && isa.bf16_products {
        // vdpbf16ps: two products per f32 lane and instruction.
        writeln!(out, "(bf16 on AVX512-BF16: \"of peak\" is against the f32 FMA peak, which vdpbf16ps can double)")?;
    }
    if precision == DType::BF16 && target == BackendArg::Cpu && isa.amx {
        // tdpbf16ps: 16 x 16 x 32 products per instruction.
        writeln!(out, "(bf16 convolutions on AMX tiles: \"of peak\" is against the f32 FMA peak, which AMX's exceeds many times)")?;
    }
    let rows = match (&cuda, target) {
        (Some(dev), _) => {
            writeln!(
                out,
                "GPU: {} (sm_{}{})",
                dev.info().name,
                dev.info().compute_capability.0,
                dev.info().compute_capability.1
            )?;
            if profiled {
                // No GPU: what the stand-in can say is what each launch does, not its time.
                writeln!(out, "(CPU stand-in for the CUDA driver: its times would mean nothing; in their place, each launch's work counted)")?;
                return super::bench_profile::print(out, batch, precision);
            } else {
                lenet_rows_at(precision, dev, batch, repeats, true)?
            }
        }
        (None, BackendArg::Simt) => {
            writeln!(out, "(SIMT emulator: CPU time of running the CUDA kernels, not GPU speed; no 1024³ GEMM)")?;
            lenet_rows_at(precision, &SimtDevice::new(0), batch, repeats.min(3), false)?
        }
        (None, _) => lenet_rows_at(precision, &CpuDevice::new(), batch, repeats, true)?,
    };
    writeln!(
        out,
        "{:<36} {:>12} {:>10} {:>8}",
        "operation (batch, C x H x W, k)", "median", "GFLOP/s", "of peak"
    )?;
    for row in rows {
        let gflops = row.flops / row.median_s / 1e9;
        let of_peak = if target == BackendArg::Cuda {
            "-".to_string()
        } else {
            format!("{:.0}%", 100.0 * gflops / peak.all_threads)
        };
        writeln!(
            out,
            "{:<36} {:>9.3} ms {:>10.2} {:>8}",
            row.name,
            row.median_s * 1e3,
            gflops,
            of_peak
        )?;
    }
    Ok(())
}
