//! `nanoddp bench kernels --backend cuda` on the CPU stand-in: one training step's launches,
//! counted by the PTX executor (`nanoddp::backend::profile`), in two tables people who read
//! Nsight Compute know: the work (launch shape, occupancy, waves, FLOPs, instructions) and the
//! memory (requests, sectors, shared-memory wavefronts, bank conflicts), each launch beside
//! its roofline and the H100 model's estimate.

use std::io::Write;

use half::{bf16, f16};
use nanoddp::backend::cuda::{self, CudaDevice};
use nanoddp::backend::profile::{self, LaunchProfile, H100};
use nanoddp::backend::{BackendError, Memory, Precision, SgdStep};
use nanoddp::dtype::DType;
use nanoddp::kernels::resources::{self, KernelResources};
use nanoddp::model::Replica;
use nanoddp::train::{initial_weights, Recipe};

use super::CliError;

/// The GPU the profile runs on: GPU 0, whose modules then load under the PTX executor.
const GPU: usize = 0;

/// Chooses the PTX executor for the stand-in's GPU 0 and turns its profile on. Call before
/// anything loads a module on it.
pub fn begin() -> Result<(), CliError> {
    cuda::standin_profile(GPU, true).map_err(CliError::Device)
}

/// One training step of `batch` images: the model's forward and backward passes and the SGD
/// update, as `nanoddp train` queues them, on images the host copies in (`train` gathers:
/// two small launches more, the gather with the step's scalars and the step's end).
fn step_launches(batch: usize, precision: DType) -> Result<Vec<LaunchProfile>, BackendError> {
    fn run<T: Precision>(batch: usize) -> Result<Vec<LaunchProfile>, BackendError> {
        let dev = CudaDevice::new(GPU)?;
        let queue = dev.clone();
        let mut replica = Replica::<CudaDevice, T>::new(dev, &initial_weights(Recipe::Default, 0))?;
        let images: Vec<u8> = (0..batch * 784).map(|i| (i * 7919 % 251) as u8).collect();
        let labels: Vec<u8> = (0..batch).map(|i| (i % 10) as u8).collect();
        // A first step loads the modules and makes the scratch area; the second is the one
        // every later step repeats.
        let step = SgdStep {
            lr: 0.05,
            inv_scale: 1.0,
            momentum: 0.9,
            weight_decay: 5e-4,
        };
        replica.step(&images, &labels, Some(1.0 / batch as f32))?;
        replica.update(step, None, None)?;
        queue.synchronize()?;
        cuda::standin_profile_take()?;
        replica.step(&images, &labels, Some(1.0 / batch as f32))?;
        replica.update(step, None, None)?;
        queue.synchronize()?;
        cuda::standin_profile_take()
    }
    match precision {
        DType::F32 => run::<f32>(batch),
        DType::F16 => run::<f16>(batch),
        DType::BF16 => run::<bf16>(batch),
    }
}

/// Prints the profile of one training step at `batch` and `precision`.
pub fn print(out: &mut impl Write, batch: usize, precision: DType) -> Result<(), CliError> {
    let launches = step_launches(batch, precision).map_err(CliError::Device)?;
    let report = resources::all().map_err(|e| CliError::Input(e.to_string()))?;
    let resources_of = |kernel: &str| -> Option<&KernelResources> {
        report
            .iter()
            .map(|(_, r)| r)
            .find(|r| r.kernel == kernel && r.arch == "sm_90")
    };
    writeln!(
        out,
        "\nlaunch profile: one training step's passes and update (batch {batch}, {precision}, {} launches; train adds the gather and the step's end), counted by the stand-in's PTX executor;\n\
         occupancy, waves, roofline and estimate are for an {} (a model: docs/kernel-profile.md)",
        launches.len(),
        H100.name
    )?;
    if report.is_empty() {
        writeln!(
            out,
            "(this build has no ptxas report (built without nvcc): no registers, so no occupancy, waves or estimate: `?`)"
        )?;
    }
    writeln!(
        out,
        "{:>2} {:<34} {:>13} {:>4} {:>6} {:>5} {:>6} {:>8} {:>9} {:>9} {:>5} {:>7}",
        "#",
        "kernel",
        "grid x block",
        "regs",
        "blk/SM",
        "occ",
        "waves",
        "MFLOP",
        "inst (K)",
        "inst/FFMA",
        "lanes",
        "bar (K)"
    )?;
    let mut rows = Vec::new();
    for (i, p) in launches.iter().enumerate() {
        let c = &p.counts;
        let r = resources_of(&p.kernel);
        let est = r.map(|r| profile::estimate(p, r, &H100));
        writeln!(
            out,
            "{:>2} {:<34} {:>13} {:>4} {:>6} {:>5} {:>6} {:>8.1} {:>9.1} {:>9} {:>5.1} {:>7.1}",
            i + 1,
            p.kernel,
            format!("{}x{}", p.blocks(), p.threads_per_block()),
            r.map_or("?".into(), |r| r.registers.to_string()),
            est.map_or("?".into(), |e| e.resident_blocks.to_string()),
            est.map_or("?".into(), |e| format!("{:.0}%", 100.0 * e.occupancy)),
            est.map_or("?".into(), |e| format!("{:.2}", e.waves)),
            c.flops() as f64 / 1e6,
            c.warp_instructions as f64 / 1e3,
            p.instructions_per_ffma()
                .map_or("-".into(), |x| format!("{x:.2}")),
            p.lanes_per_instruction(),
            c.barriers as f64 / 1e3,
        )?;
        rows.push(est);
    }
    writeln!(
        out,
        "\n{:>2} {:<34} {:>8} {:>7} {:>8} {:>7} {:>8} {:>9} {:>8} {:>6} {:>6} {:>9} {:>9} {:>6}",
        "#",
        "kernel",
        "ld (K)",
        "sec/ld",
        "st (K)",
        "sec/st",
        "comp MB",
        "req/comp",
        "shm (K)",
        "wf/req",
        "confl",
        "roof µs",
        "est. µs",
        "bound"
    )?;
    let (mut roof, mut est_total) = (0.0, 0.0);
    for (i, (p, est)) in launches.iter().zip(&rows).enumerate() {
        let c = &p.counts;
        let per = |a: u64, b: u64| {
            if b == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", a as f64 / b as f64)
            }
        };
        let shared_requests = c.shared_load_requests + c.shared_store_requests;
        if let Some(e) = est {
            roof += e.roofline_s;
            est_total += e.estimate_s;
        }
        writeln!(
            out,
            "{:>2} {:<34} {:>8.1} {:>7} {:>8.1} {:>7} {:>8.2} {:>9.2} {:>8.1} {:>6} {:>6} {:>9} {:>9} {:>6}",
            i + 1,
            p.kernel,
            (c.global_load_requests + c.global_atomic_requests) as f64 / 1e3,
            per(
                c.global_load_sectors + c.global_atomic_sectors,
                c.global_load_requests + c.global_atomic_requests
            ),
            c.global_store_requests as f64 / 1e3,
            per(c.global_store_sectors, c.global_store_requests),
            c.compulsory_bytes() as f64 / 1e6,
            p.sectors_per_compulsory(),
            shared_requests as f64 / 1e3,
            per(c.shared_wavefronts(), shared_requests),
            if c.shared_wavefronts() == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:.0}%",
                    100.0 * c.bank_conflicts() as f64 / c.shared_wavefronts() as f64
                )
            },
            est.map_or("?".into(), |e| format!("{:.1}", e.roofline_s * 1e6)),
            est.map_or("?".into(), |e| format!("{:.1}", e.estimate_s * 1e6)),
            est.map_or("?", |e| e.bound),
        )?;
    }
    writeln!(
        out,
        "step: {} launches; roofline {:.1} µs, estimate {:.1} µs (kernels end to end, no launch gaps)",
        launches.len(),
        roof * 1e6,
        est_total * 1e6
    )?;
    Ok(())
}
