//! What each kernel launch does, counted by the CUDA stand-in's PTX executor while it runs
//! the launch warp by warp ([`cuda::standin_profile`](super::cuda::standin_profile)), and what
//! those counts mean on an H100: occupancy, waves, the roofline and an estimated time.
//!
//! The counts are exact for the PTX (not the SASS ptxas makes of it); how each is counted is
//! `docs/kernel-profile.md`'s. The estimate is a model, labelled as one wherever it is shown:
//! the busiest SM's issue slots (fewer when too few warps are resident to cover latency),
//! shared-memory wavefronts and L1 sectors, the chip's L2 and DRAM bandwidth, whichever is
//! longest; no launch gaps, no tails of serial work. The measured times
//! `docs/kernel-profile.md` lists beside it are its check.

use crate::kernels::resources::KernelResources;

/// The counters of one launch (`cuda-standin/executor.h`'s `LaunchProfile`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Warp instructions issued (a predicated-off lane still takes its warp's slot).
    pub warp_instructions: u64,
    /// Lane instructions that executed (predicate on).
    pub thread_instructions: u64,
    /// Warp instructions that are f32 `fma` / `mad`.
    pub ffma_warp: u64,
    /// f32 floating-point operations (an FMA is 2).
    pub flops_f32: u64,
    /// f16 and bf16 operations outside tensor cores.
    pub flops_f16: u64,
    /// f64 operations.
    pub flops_f64: u64,
    /// Tensor-core operations (`wmma.mma`, 2·16·16·16 each).
    pub flops_tensor: u64,
    /// Warp-level global loads.
    pub global_load_requests: u64,
    /// Distinct 32-byte sectors each global load touched, summed.
    pub global_load_sectors: u64,
    /// Warp-level global stores.
    pub global_store_requests: u64,
    /// Their sectors.
    pub global_store_sectors: u64,
    /// Warp-level global atomics and reductions.
    pub global_atomic_requests: u64,
    /// Their sectors.
    pub global_atomic_sectors: u64,
    /// Warp-level shared-memory loads (atomics included).
    pub shared_load_requests: u64,
    /// Their wavefronts (bank passes).
    pub shared_load_wavefronts: u64,
    /// The wavefronts they would take without bank conflicts.
    pub shared_load_ideal: u64,
    /// Warp-level shared-memory stores.
    pub shared_store_requests: u64,
    /// Their wavefronts.
    pub shared_store_wavefronts: u64,
    /// Without bank conflicts.
    pub shared_store_ideal: u64,
    /// Warp-level local-memory accesses (spills, stack frames).
    pub local_requests: u64,
    /// `bar.sync` per warp.
    pub barriers: u64,
    /// `shfl` per warp.
    pub shuffles: u64,
    /// Branches issued.
    pub branches: u64,
    /// Branches whose lanes went both ways.
    pub divergent_branches: u64,
    /// Distinct 32-byte sectors of global memory the launch read.
    pub read_footprint_sectors: u64,
    /// Distinct sectors it wrote.
    pub write_footprint_sectors: u64,
}

impl Counts {
    /// Sets the counter `key` (the stand-in's spelling); false for a key it does not know.
    fn set(&mut self, key: &str, v: u64) -> bool {
        let slot = match key {
            "warp_instructions" => &mut self.warp_instructions,
            "thread_instructions" => &mut self.thread_instructions,
            "ffma_warp" => &mut self.ffma_warp,
            "flops_f32" => &mut self.flops_f32,
            "flops_f16" => &mut self.flops_f16,
            "flops_f64" => &mut self.flops_f64,
            "flops_tensor" => &mut self.flops_tensor,
            "global_load_requests" => &mut self.global_load_requests,
            "global_load_sectors" => &mut self.global_load_sectors,
            "global_store_requests" => &mut self.global_store_requests,
            "global_store_sectors" => &mut self.global_store_sectors,
            "global_atomic_requests" => &mut self.global_atomic_requests,
            "global_atomic_sectors" => &mut self.global_atomic_sectors,
            "shared_load_requests" => &mut self.shared_load_requests,
            "shared_load_wavefronts" => &mut self.shared_load_wavefronts,
            "shared_load_ideal" => &mut self.shared_load_ideal,
            "shared_store_requests" => &mut self.shared_store_requests,
            "shared_store_wavefronts" => &mut self.shared_store_wavefronts,
            "shared_store_ideal" => &mut self.shared_store_ideal,
            "local_requests" => &mut self.local_requests,
            "barriers" => &mut self.barriers,
            "shuffles" => &mut self.shuffles,
            "branches" => &mut self.branches,
            "divergent_branches" => &mut self.divergent_branches,
            "read_footprint_sectors" => &mut self.read_footprint_sectors,
            "write_footprint_sectors" => &mut self.write_footprint_sectors,
            _ => return false,
        };
        *slot = v;
        true
    }

    /// Every floating-point operation, of any type.
    pub fn flops(&self) -> u64 {
        self.flops_f32 + self.flops_f16 + self.flops_f64 + self.flops_tensor
    }

    /// Sectors the launch asked the memory system for (loads, stores, atomics).
    pub fn sectors_requested(&self) -> u64 {
        self.global_load_sectors + self.global_store_sectors + self.global_atomic_sectors
    }

    /// The compulsory traffic: every distinct sector read once and every distinct sector
    /// written once, in bytes.
    pub fn compulsory_bytes(&self) -> u64 {
        32 * (self.read_footprint_sectors + self.write_footprint_sectors)
    }

    /// Shared-memory wavefronts, loads and stores.
    pub fn shared_wavefronts(&self) -> u64 {
        self.shared_load_wavefronts + self.shared_store_wavefronts
    }

    /// Wavefronts beyond the conflict-free ideal (ncu's "bank conflicts").
    pub fn bank_conflicts(&self) -> u64 {
        self.shared_wavefronts()
            .saturating_sub(self.shared_load_ideal + self.shared_store_ideal)
    }
}

/// One launch as the stand-in profiled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchProfile {
    /// The GPU it ran on.
    pub gpu: usize,
    /// The kernel's name.
    pub kernel: String,
    /// Grid, in blocks.
    pub grid: [u32; 3],
    /// Block, in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub dynamic_shared: u32,
    /// What it did.
    pub counts: Counts,
}

impl LaunchProfile {
    /// Reads one line of the stand-in's profile:
    /// `<gpu> <kernel> <grid x y z> <block x y z> <dynamic shared> <key>=<count> ...`.
    pub fn parse(line: &str) -> Result<Self, String> {
        let bad = || format!("the stand-in's profile line {line:?} does not read");
        let mut words = line.split_whitespace();
        let number = |words: &mut std::str::SplitWhitespace| -> Result<u32, String> {
            words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)
        };
        let gpu = number(&mut words)? as usize;
        let kernel = words.next().ok_or_else(bad)?.to_string();
        let mut shape = [0u32; 7];
        for v in &mut shape {
            *v = number(&mut words)?;
        }
        let mut counts = Counts::default();
        for word in words {
            let (key, value) = word.split_once('=').ok_or_else(bad)?;
            let value = value.parse().map_err(|_| bad())?;
            if !counts.set(key, value) {
                return Err(format!(
                    "the stand-in's profile names a counter this build does not know: {key}"
                ));
            }
        }
        Ok(LaunchProfile {
            gpu,
            kernel,
            grid: [shape[0], shape[1], shape[2]],
            block: [shape[3], shape[4], shape[5]],
            dynamic_shared: shape[6],
            counts,
        })
    }

    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u32 {
        self.block.iter().product()
    }

    /// Instructions per f32 FMA instruction (warp level), or `None` without FMAs.
    pub fn instructions_per_ffma(&self) -> Option<f64> {
        let c = &self.counts;
        (c.ffma_warp > 0).then(|| c.warp_instructions as f64 / c.ffma_warp as f64)
    }

    /// Average lanes executing each warp instruction (of 32).
    pub fn lanes_per_instruction(&self) -> f64 {
        let c = &self.counts;
        c.thread_instructions as f64 / c.warp_instructions.max(1) as f64
    }

    /// Sectors requested per compulsory sector (1 is every byte fetched once).
    pub fn sectors_per_compulsory(&self) -> f64 {
        let c = &self.counts;
        c.sectors_requested() as f64
            / (c.read_footprint_sectors + c.write_footprint_sectors).max(1) as f64
    }
}

/// The limits and rates of one GPU model that occupancy and the estimate use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuModel {
    /// Its name, for tables.
    pub name: &'static str,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Threads resident per SM.
    pub threads_per_sm: u32,
    /// Blocks resident per SM.
    pub blocks_per_sm: u32,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    /// Shared memory per SM for blocks, bytes.
    pub shared_per_sm: u32,
    /// Shared memory the driver reserves per block, bytes.
    pub shared_reserved_per_block: u32,
    /// Clock, GHz (the boost clock ncu `--clock-control none` sees).
    pub clock_ghz: f64,
    /// Warp instructions issued per SM per clock (one per scheduler).
    pub issue_per_clock: f64,
    /// Warps a scheduler needs to issue every clock: on average a warp's next instruction
    /// waits this many clocks for the one before (shared loads, FMA chains, barriers).
    /// Fitted to the H100's measured convolution kernels (docs/kernel-profile.md).
    pub latency_warps: f64,
    /// f32 lanes per SM (an FMA is 2 FLOPs per lane per clock).
    pub f32_lanes_per_sm: f64,
    /// Shared-memory wavefronts per SM per clock.
    pub wavefronts_per_clock: f64,
    /// L1 sectors per SM per clock.
    pub l1_sectors_per_clock: f64,
    /// L2 bandwidth, bytes/s.
    pub l2_bytes_per_s: f64,
    /// DRAM bandwidth, bytes/s.
    pub dram_bytes_per_s: f64,
}

/// An H100 SXM5 (80 GB HBM3), the GPU the project's measurements were taken on.
pub const H100: GpuModel = GpuModel {
    name: "H100 SXM",
    sms: 132,
    threads_per_sm: 2048,
    blocks_per_sm: 32,
    registers_per_sm: 65536,
    shared_per_sm: 228 * 1024,
    shared_reserved_per_block: 1024,
    clock_ghz: 1.98,
    issue_per_clock: 4.0,
    latency_warps: 10.0,
    f32_lanes_per_sm: 128.0,
    wavefronts_per_clock: 1.0,
    l1_sectors_per_clock: 4.0,
    l2_bytes_per_s: 5.5e12,
    dram_bytes_per_s: 3.35e12,
};

impl GpuModel {
    /// f32 FLOP/s with every lane doing an FMA every clock.
    pub fn peak_f32(&self) -> f64 {
        2.0 * self.f32_lanes_per_sm * f64::from(self.sms) * self.clock_ghz * 1e9
    }

    /// Blocks of a launch that fit on one SM at once: the least of the thread, block,
    /// register and shared-memory limits. Registers are allocated per warp in units of 256.
    pub fn resident_blocks(&self, threads: u32, registers: u32, shared: u64) -> u32 {
        let warps = threads.div_ceil(32).max(1);
        let by_threads = self.threads_per_sm / (warps * 32);
        let per_warp = (registers.max(1) * 32).next_multiple_of(256);
        let by_registers = self.registers_per_sm / (per_warp * warps);
        let per_block = shared + u64::from(self.shared_reserved_per_block);
        let by_shared = (u64::from(self.shared_per_sm) / per_block) as u32;
        by_threads
            .min(self.blocks_per_sm)
            .min(by_registers)
            .min(by_shared)
    }
}

/// A launch's occupancy and estimated time on a [`GpuModel`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Blocks resident per SM.
    pub resident_blocks: u32,
    /// Resident warps over the SM's maximum.
    pub occupancy: f64,
    /// Blocks over (resident blocks × SMs).
    pub waves: f64,
    /// The roofline: FLOPs at the f32 rate (tensor work excluded) or the compulsory bytes at
    /// DRAM bandwidth, whichever is longer, seconds.
    pub roofline_s: f64,
    /// The model's time, seconds (an estimate: see the module doc).
    pub estimate_s: f64,
    /// What bounds the estimate: "issue", "shared", "L1", "L2" or "DRAM".
    pub bound: &'static str,
}

/// [`Estimate`] of `p` on `gpu`, with ptxas's `resources` for its kernel.
pub fn estimate(p: &LaunchProfile, resources: &KernelResources, gpu: &GpuModel) -> Estimate {
    let c = &p.counts;
    let threads = p.threads_per_block();
    let shared = resources.shared_bytes + u64::from(p.dynamic_shared);
    let resident = gpu
        .resident_blocks(threads, resources.registers, shared)
        .max(1);
    let warps = threads.div_ceil(32);
    let blocks = p.blocks().max(1) as f64;
    let sms = f64::from(gpu.sms);
    // The busiest SM runs ⌈blocks / SMs⌉ blocks; per block, the launch's averages.
    let busiest = (blocks / sms).ceil();
    let per_sm = busiest / blocks;
    let clock = gpu.clock_ghz * 1e9;
    // Fewer warps than a scheduler needs to cover latency issue that much less often.
    let warps_per_scheduler =
        busiest.min(f64::from(resident)) * f64::from(warps) / gpu.issue_per_clock;
    let latency = (gpu.latency_warps / warps_per_scheduler).max(1.0);
    let issue = c.warp_instructions as f64 * per_sm / gpu.issue_per_clock / clock * latency;
    let shared_s = c.shared_wavefronts() as f64 * per_sm / gpu.wavefronts_per_clock / clock;
    let l1 = c.sectors_requested() as f64 * per_sm / gpu.l1_sectors_per_clock / clock;
    let l2 = c.sectors_requested() as f64 * 32.0 / gpu.l2_bytes_per_s;
    let dram = c.compulsory_bytes() as f64 / gpu.dram_bytes_per_s;
    let (bound, estimate_s) = [
        ("issue", issue),
        ("shared", shared_s),
        ("L1", l1),
        ("L2", l2),
        ("DRAM", dram),
    ]
    .into_iter()
    .fold(
        ("issue", 0.0),
        |best, x| if x.1 > best.1 { x } else { best },
    );
    let f32_work = (c.flops_f32 + c.flops_f16 + c.flops_f64) as f64;
    Estimate {
        resident_blocks: resident,
        occupancy: f64::from(resident * warps * 32) / f64::from(gpu.threads_per_sm),
        waves: blocks / (f64::from(resident) * sms),
        roofline_s: (f32_work / gpu.peak_f32()).max(dram),
        estimate_s,
        bound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_line_reads_and_an_unknown_counter_is_refused() {
        let p = LaunchProfile::parse(
            "0 conv2d_forward_64x64_f32 12 4 1 256 1 1 0 warp_instructions=100 ffma_warp=25 read_footprint_sectors=3",
        )
        .expect("reads");
        assert_eq!(p.kernel, "conv2d_forward_64x64_f32");
        assert_eq!((p.blocks(), p.threads_per_block()), (48, 256));
        assert_eq!(p.instructions_per_ffma(), Some(4.0));
        assert_eq!(p.counts.compulsory_bytes(), 96);
        let err = LaunchProfile::parse("0 k 1 1 1 32 1 1 0 surprise=1").unwrap_err();
        assert!(err.contains("surprise"), "{err}");
        assert!(LaunchProfile::parse("0 k 1 1").is_err());
    }

    #[test]
    fn occupancy_follows_the_tightest_h100_limit() {
        // 256 threads at 80 registers: 20,480 registers a block, three fit in 65,536.
        assert_eq!(H100.resident_blocks(256, 80, 8896), 3);
        // 119 registers round to 3,840 a warp: two blocks of 8 warps.
        assert_eq!(H100.resident_blocks(256, 119, 8900), 2);
        // Shared memory: 100 KiB + 1 KiB reserved a block, two fit in 228 KiB.
        assert_eq!(H100.resident_blocks(128, 32, 100 * 1024), 2);
        // Small blocks: the 32-block limit.
        assert_eq!(H100.resident_blocks(32, 16, 0), 32);
    }
}
