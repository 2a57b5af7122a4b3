//! `nanoddp info`: what this build and this machine can do.

use std::io::{self, Write};

use nanoddp::backend::{cuda, nvrtc, simt, BackendError};
use nanoddp::kernels::{fatbin, resources, shipped_ptx, MODULES, PREBUILT};
use nanoddp::system;

use super::CliError;

/// Writes the report. Fails only if `out` cannot be written; a machine with no CUDA at all
/// is a normal answer, not an error.
pub fn run(out: &mut impl Write) -> Result<(), CliError> {
    writeln!(out, "nanoddp {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(out)?;
    kernels(out)?;
    writeln!(out)?;
    gpus(out)?;
    writeln!(out)?;
    emulator(out)?;
    writeln!(out)?;
    cpu(out)?;
    Ok(())
}

fn kernels(out: &mut impl Write) -> io::Result<()> {
    let count: usize = MODULES.iter().map(|m| m.kernels.len()).sum();
    writeln!(
        out,
        "Kernels: {count} in {} files under kernels/",
        MODULES.len()
    )?;
    let archs: Vec<String> = shipped_ptx::ARCHS
        .iter()
        .map(|a| format!("compute_{a}"))
        .collect();
    let Some(pre) = PREBUILT else {
        writeln!(
            out,
            "  from the PTX shipped in kernels/ptx/ ({}), JIT-compiled by the driver on first \
             use;\n  the build found no nvcc. Set NVCC or CUDA_HOME and rebuild for SASS and \
             ptxas's resource report.",
            archs.join(", ")
        )?;
        return Ok(());
    };
    writeln!(
        out,
        "  prebuilt by nvcc {}: SASS for {}, PTX for {} (JIT on other GPUs)",
        pre.nvcc_version,
        pre.sass_archs.join(", "),
        pre.ptx_archs.join(", ")
    )?;
    if !pre.stale_ptx.is_empty() {
        writeln!(
            out,
            "  kernels/ptx/ differs from what this nvcc emits ({}): tools/update-ptx",
            pre.stale_ptx.join(", ")
        )?;
    }
    for module in MODULES {
        let images = match module.fatbin.map(fatbin::images) {
            Some(Ok(images)) => images
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            Some(Err(e)) => format!("unreadable fatbin: {e}"),
            None => "no fatbin".to_string(),
        };
        writeln!(
            out,
            "  {}: {} kernels, {} B fatbin [{images}]",
            module.file,
            module.kernels.len(),
            module.fatbin.map_or(0, <[u8]>::len)
        )?;
    }
    let mut rows = match resources::all() {
        Ok(rows) => rows,
        Err(e) => return writeln!(out, "  the embedded ptxas report does not parse: {e}"),
    };
    rows.sort_by(|(ma, a), (mb, b)| (ma, &a.kernel, &a.arch).cmp(&(mb, &b.kernel, &b.arch)));
    writeln!(
        out,
        "  {:<12} {:<28} {:<6} {:>5} {:>9} {:>6} {:>12}",
        "module", "kernel", "arch", "regs", "smem B", "stack", "spill st/ld"
    )?;
    for (module, r) in &rows {
        writeln!(
            out,
            "  {:<12} {:<28} {:<6} {:>5} {:>9} {:>6} {:>12}{}",
            module,
            r.kernel,
            r.arch,
            r.registers,
            r.shared_bytes,
            r.stack_bytes,
            format!("{}/{}", r.spill_store_bytes, r.spill_load_bytes),
            if r.spills() { "  <- SPILLS" } else { "" }
        )?;
    }
    Ok(())
}

fn emulator(out: &mut impl Write) -> io::Result<()> {
    if !simt::EMULATOR_BUILT {
        return writeln!(
            out,
            "SIMT emulator and CUDA stand-in: absent; {}",
            BackendError::NoEmulator
        );
    }
    writeln!(
        out,
        "SIMT emulator: built in; runs the same kernels on the CPU ({} worker threads per launch),\n  \
         one fiber per CUDA thread, with barrier, warp-mask and out-of-bounds checks",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    )
}

fn gpus(out: &mut impl Write) -> io::Result<()> {
    write!(out, "CUDA: ")?;
    if !cuda::driver_present() && !simt::EMULATOR_BUILT {
        writeln!(
            out,
            "no CUDA driver found; GPU backends are unavailable, everything runs on the CPU"
        )?;
    } else if !cuda::driver_present() {
        writeln!(
            out,
            "no CUDA driver found (libcuda.so / libcuda.so.1 is not on the library path).\n  \
             GPU backends are unavailable; everything runs on the CPU. To run the CUDA backend \
             on the CPU stand-in for the driver instead:\n  LD_LIBRARY_PATH={} nanoddp ...",
            cuda::STANDIN_DIR
        )?;
    } else {
        match cuda::driver_version() {
            Ok((major, minor)) => writeln!(out, "driver supports CUDA {major}.{minor}")?,
            Err(e) => writeln!(out, "driver present but unusable: {e}")?,
        }
        // A driver that refuses to start (the stand-in over a setting of its environment)
        // or sees no GPU says so once, and runs nothing.
        match cuda::device_count() {
            Err(e) => writeln!(out, "  {e}")?,
            Ok(_) => {
                if let Some(executor) = cuda::standin_executor() {
                    writeln!(
                        out,
                        "  this driver is nanoddp's CPU stand-in (cuda-standin/): the GPUs below \
                         are emulated, kernels run under its {executor}, timings mean nothing"
                    )?;
                }
                match cuda::CudaDevice::all_infos() {
                    Ok(devices) => {
                        for d in devices {
                            writeln!(
                                out,
                                "  GPU {}: {} (sm_{}{}, {:.1} GiB)",
                                d.ordinal,
                                d.name,
                                d.compute_capability.0,
                                d.compute_capability.1,
                                d.total_memory as f64 / (1u64 << 30) as f64
                            )?;
                        }
                    }
                    Err(e) => writeln!(out, "  {e}")?,
                }
            }
        }
    }
    match nvrtc::version() {
        Some((major, minor)) => writeln!(
            out,
            "  NVRTC {major}.{minor} available for run-time compilation"
        )?,
        None => writeln!(
            out,
            "  NVRTC not found (needed only for your own kernels, or a driver that refuses the \
             shipped PTX)"
        )?,
    }
    Ok(())
}

fn cpu(out: &mut impl Write) -> io::Result<()> {
    let info = system::cpu_info();
    writeln!(
        out,
        "CPU: {} ({} threads available)",
        info.model.as_deref().unwrap_or("unknown model"),
        info.threads
    )?;
    let simd = if info.simd.is_empty() {
        "none detected".to_string()
    } else {
        info.simd.join(" ")
    };
    writeln!(out, "  SIMD: {simd}")?;
    use nanoddp::backend::cpu::isa::{self as cpu_isa, ISA_ENV};
    let allowed: Vec<&str> = cpu_isa::levels().iter().map(|(name, _)| *name).collect();
    // A refused setting is a line here, and the report goes on with what this CPU runs.
    let isa = match cpu_isa::requested() {
        Ok(isa) => isa,
        Err(why) => {
            writeln!(
                out,
                "  {ISA_ENV} is refused: {why}; other commands refuse to run until it is unset \
                 or one of those"
            )?;
            cpu_isa::cpu()
        }
    };
    writeln!(
        out,
        "  CPU backend computes with: the {} ({ISA_ENV} chooses: {} or native; this CPU \
         allows {})",
        isa.engine().name(),
        cpu_isa::LEVELS.join(", "),
        allowed.join(", ")
    )?;
    for (operation, runs) in isa.plan() {
        writeln!(out, "    {operation}: {runs}")?;
    }
    Ok(())
}
