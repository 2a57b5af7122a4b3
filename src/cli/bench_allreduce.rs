//! `nanoddp bench allreduce`: the nccl-tests table for our allreduce, on N ranks of one
//! backend, out of place and in place, with the fraction of the memory-traffic bound.

use std::io::Write;
use std::time::Instant;

use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::cuda::{self, CudaDevice};
use nanoddp::backend::simt::SimtDevice;
use nanoddp::comm::communicator::{communicator, CommConfig, Rank, ReduceOp};
use nanoddp::comm::rank_threads::on_each_rank;
use nanoddp::comm::schedule::Algorithm;
use nanoddp::comm::transport::CommDevice;
use nanoddp::system;

use super::args::{backend_values, check_ranks, parse_size, AlgoArg, BackendArg, CommArg};
use super::nccl_table::{expected, group, header, input, median, row};
use super::CliError;

/// Host memory one rank holds at a message of `bytes`: its input and expected result on the
/// host, the result it downloads to check; on the CPU and the emulator also its device
/// buffers (input, out-of-place output, in-place buffer) and the communicator's scratch,
/// which live in host memory too.
fn host_bytes_per_rank(backend: BackendArg, bytes: usize) -> u64 {
    let copies = match backend {
        BackendArg::Cpu | BackendArg::Simt => 7,
        BackendArg::Cuda => 3,
    };
    copies * bytes as u64
}

/// The sweep (`bench allreduce`'s options).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Sweep {
    /// Ranks (one thread, or emulated device, each).
    #[arg(short = 'n', long = "ranks", default_value_t = 4)]
    pub ranks: usize,
    /// Smallest message (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "4K", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest message.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Size multiplier between rows.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub factor: usize,
    /// Algorithm.
    #[arg(long, value_enum, default_value_t = AlgoArg::Auto)]
    pub algo: AlgoArg,
    /// Where the ranks run.
    #[arg(long, default_value = "cpu", value_parser = backend_values([
        "Threads on the CPU, one per rank",
        "Emulated devices running `collective.cu` (slow; for studying the kernel path)",
        "GPUs through the CUDA driver (or its CPU stand-in, where timings mean nothing)",
    ]))]
    pub backend: BackendArg,
    /// local: -n threads of this process; mpi: one rank per process started by mpirun
    /// (-n is mpirun's then; needs a build with --features mpi).
    #[arg(long, value_enum, default_value_t = CommArg::Local)]
    pub comm: CommArg,
}

/// Threads that copy at once for the bound: one per rank, at most one per core (the ranks'
/// threads share the cores beyond that).
fn copy_threads(ranks: usize) -> usize {
    ranks.min(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn iterations(bytes: usize, ranks: usize) -> usize {
    ((256usize << 20) / (bytes.max(1) * ranks)).clamp(10, 500)
}

/// One rank's measurements at one size.
struct Measured {
    /// Seconds per out-of-place iteration.
    out_of_place: Vec<f64>,
    /// Seconds per in-place iteration.
    in_place: Vec<f64>,
    /// Wrong elements after the last out-of-place iteration.
    wrong_out: usize,
    /// Wrong elements after the last in-place iteration.
    wrong_in: usize,
}

/// One rank's measurements, per size.
type RankResult = Vec<Measured>;

fn run_rank<D: CommDevice + Clone>(
    mut rank: Rank<D>,
    sizes: &[usize],
    algo: Option<Algorithm>,
) -> Result<RankResult, CliError> {
    let n = rank.size();
    let me = rank.rank();
    let mut out = Vec::new();
    for &bytes in sizes {
        let count = bytes / 4;
        let host = input(me, count);
        let expected = expected(n, count);
        let dev = rank.device().clone();
        let src = dev.upload(&host)?;
        let mut dst = dev.alloc_zeros::<f32>(count)?;
        let mut buf = dev.upload(&host)?;
        let iters = iterations(bytes, n);
        // Warm up long enough for threads, caches and clocks to settle (a fifth of the run).
        let warmup = (iters / 5).max(5);
        let (mut t_out, mut t_in) = (Vec::new(), Vec::new());
        for i in 0..iters + warmup {
            rank.barrier()?;
            let t0 = Instant::now();
            rank.all_reduce_into(&src, &mut dst, ReduceOp::Sum, algo)?;
            let t = t0.elapsed().as_secs_f64();
            if i >= warmup {
                t_out.push(t);
            }
        }
        for i in 0..iters + warmup {
            dev.write(&host, &mut buf)?; // re-fill, untimed
            rank.barrier()?;
            let t0 = Instant::now();
            rank.all_reduce(&mut buf, ReduceOp::Sum, algo)?;
            let t = t0.elapsed().as_secs_f64();
            if i >= warmup {
                t_in.push(t);
            }
        }
        let wrong = |v: Vec<f32>| v.iter().zip(&expected).filter(|(a, b)| a != b).count();
        let wrong_out = wrong(dev.download(&dst)?);
        let wrong_in = wrong(dev.download(&buf)?);
        out.push(Measured {
            out_of_place: t_out,
            in_place: t_in,
            wrong_out,
            wrong_in,
        });
    }
    Ok(out)
}

fn sweep_on<D: CommDevice + Clone + 'static>(
    devices: Vec<D>,
    sizes: Vec<usize>,
    algo: Option<Algorithm>,
) -> Result<Vec<RankResult>, CliError> {
    let ranks = communicator(devices, CommConfig::default())?;
    on_each_rank(ranks, |rank| run_rank(rank, &sizes, algo))
        .map_err(|e| CliError::Running(e.to_string()))?
        .into_iter()
        .collect()
}

/// Prints the table.
pub fn run(out: &mut impl Write, sweep: Sweep) -> Result<(), CliError> {
    let Sweep {
        ranks,
        min_bytes,
        max_bytes,
        factor,
        algo,
        backend,
        comm,
    } = sweep;
    check_ranks("-n/--ranks", ranks).map_err(CliError::Input)?;
    let refused = |why: String| Err(CliError::Input(why));
    if min_bytes < 4 {
        return refused(format!(
            "-b/--minbytes {min_bytes} is below one f32: give at least 4 bytes"
        ));
    }
    // Messages are whole f32s: a size between two is refused, naming both.
    for (flag, bytes) in [("-b/--minbytes", min_bytes), ("-e/--maxbytes", max_bytes)] {
        if !bytes.is_multiple_of(4) {
            return refused(format!(
                "{flag} {bytes} is not a whole number of f32 elements (4 bytes each): give {} or {}",
                bytes / 4 * 4,
                bytes / 4 * 4 + 4
            ));
        }
    }
    if max_bytes < min_bytes {
        return refused(format!(
            "-e/--maxbytes {max_bytes} is below -b/--minbytes {min_bytes}"
        ));
    }
    if factor < 2 {
        return refused(format!(
            "-f/--stepfactor {factor} never grows the message: give at least 2"
        ));
    }
    let mut sizes = Vec::new();
    let mut s = min_bytes;
    while s <= max_bytes {
        sizes.push(s);
        s = match s.checked_mul(factor) {
            Some(next) => next,
            None => break,
        };
    }
    if comm == CommArg::Mpi {
        #[cfg(feature = "mpi")]
        return super::mpi::bench(out, &sizes, algo);
        #[cfg(not(feature = "mpi"))]
        return Err(CliError::Input(super::args::NO_MPI.into()));
    }
    algo.check_local().map_err(CliError::Input)?;
    // The largest message decides the peak: every rank holds its buffers at once.
    let largest = sizes.last().copied().unwrap_or(0);
    let need = ranks as u64 * host_bytes_per_rank(backend, largest);
    // The least of free memory, the address-space limit (`ulimit -v`) and the cgroup's: an
    // allocation past any of them aborts the process (or wakes the OOM killer) mid-sweep.
    if let Some(bound) = system::memory_bound() {
        if need > bound.bytes / 10 * 9 {
            let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
            return Err(CliError::Input(format!(
                "this sweep needs about {:.1} GiB of memory at -e {largest} ({ranks} ranks x {} \
                 copies of the message), but {bound}: lower -e or -n",
                gib(need),
                host_bytes_per_rank(backend, 1),
            )));
        }
    }
    // The GPUs, opened before any work or output, placed as `train` places its ranks (shared
    // round-robin where there are fewer GPUs than ranks). A GPU that is not there, or a
    // setting the CPU stand-in refuses, is bad input (exit code 2), as bench kernels and
    // train refuse it.
    let gpus = match backend {
        BackendArg::Cuda => {
            let visible = cuda::device_count().map_err(CliError::Device)?;
            let ordinals =
                super::train::mpi_gpu_ordinals(0, 1, ranks, visible).map_err(CliError::Input)?;
            Some(
                ordinals
                    .into_iter()
                    .map(CudaDevice::new)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(CliError::Device)?,
            )
        }
        _ => None,
    };
    writeln!(out, "# nanoddp bench allreduce: {ranks} ranks ({backend:?} backend), algorithm {algo:?}, sum, float32")?;
    writeln!(
        out,
        "# bound: the memory-traffic bound's share of the time, the bound being 2·n·S bytes (every \
         input read, every output written) at the bandwidth of {} thread(s) copying across as \
         many bytes as the collective spans (2·n·S out of place, n·S in place), measured beside \
         each row (- where nothing moves: in place at one rank; >=100%: at the bound, within \
         the two measurements' noise)",
        copy_threads(ranks)
    )?;
    let results = match backend {
        BackendArg::Cpu => sweep_on(
            vec![CpuDevice::new(); ranks],
            sizes.clone(),
            algo.algorithm(),
        )?,
        BackendArg::Simt => sweep_on(
            (0..ranks).map(SimtDevice::new).collect(),
            sizes.clone(),
            algo.algorithm(),
        )?,
        BackendArg::Cuda => {
            let devices = gpus.unwrap_or_default();
            // Named once the driver has started: the executor is the one it accepted.
            if let Some(executor) = cuda::standin_executor() {
                writeln!(out, "# CPU stand-in for the CUDA driver: the CUDA path runs (peer access, streams, collective.cu under its {executor}); timings mean nothing")?;
            }
            sweep_on(devices, sizes.clone(), algo.algorithm())?
        }
    };
    header(out, &["out-of-place", "in-place"], &[("bound", "")])?;
    for (i, &bytes) in sizes.iter().enumerate() {
        // Each iteration's time is the slowest rank's; report the median iteration.
        let per_iter = |pick: fn(&Measured) -> &Vec<f64>| {
            let iters = pick(&results[0][i]).len();
            median(
                (0..iters)
                    .map(|k| results.iter().map(|r| pick(&r[i])[k]).fold(0.0, f64::max))
                    .collect(),
            )
        };
        let t_out = per_iter(|m| &m.out_of_place);
        let t_in = per_iter(|m| &m.in_place);
        let wrong_out = results.iter().map(|r| r[i].wrong_out as u64).sum();
        let wrong_in = results.iter().map(|r| r[i].wrong_in as u64).sum();
        // The copy spans the bytes the collective spans, so that both meet the same cache
        // or DRAM: inputs and outputs out of place (2·n·S), the n buffers in place (n·S). In
        // place at one rank the result is the input: no traffic, no bound.
        let bound = |in_place: bool| {
            let spanned = if in_place { 1 } else { 2 } * ranks * bytes;
            (!in_place || ranks > 1).then(|| {
                let copy_bw = system::parallel_copy_bandwidth(spanned / 2, copy_threads(ranks));
                2.0 * ranks as f64 * bytes as f64 / copy_bw
            })
        };
        let cols = |t: f64, wrong: u64, bound: Option<f64>| {
            // The bound and the time are both measured: a row that reaches the bound reads
            // >=100%, never a share past it.
            let share = match bound.map(|b| 100.0 * b / t) {
                None => "-".to_string(),
                Some(p) if p >= 99.5 => ">=100%".to_string(),
                Some(p) => format!("{p:.0}%"),
            };
            format!("{} {share:>6}", group(bytes, t, ranks, wrong))
        };
        row(
            out,
            bytes,
            &[
                cols(t_out, wrong_out, bound(false)),
                cols(t_in, wrong_in, bound(true)),
            ],
        )?;
    }
    Ok(())
}
