//! The MPI side of the command line (feature `mpi`): `check-mpi`, `bench allreduce --comm
//! mpi`. Every process runs the same code; rank 0 prints.

use std::io::Write;
use std::time::Instant;

use mpi::collective::SystemOperation;
use mpi::traits::CommunicatorCollectives;
use nanoddp::comm::communicator::{CommConfig, CommError, ReduceOp};
use nanoddp::comm::mpi::{Mpi, MpiAlgorithm};
use nanoddp::comm::schedule::Algorithm;

use super::args::AlgoArg;
use super::nccl_table::{expected, group, header, input, median, row};
use super::CliError;

fn fnv(bits: impl Iterator<Item = u32>) -> u64 {
    bits.fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The algorithms `--algo` names across processes.
fn algorithms(algo: AlgoArg) -> Vec<MpiAlgorithm> {
    match algo {
        AlgoArg::Auto => vec![
            MpiAlgorithm::Schedule(Algorithm::Ring),
            MpiAlgorithm::Schedule(Algorithm::Tree),
            MpiAlgorithm::Schedule(Algorithm::Direct),
            MpiAlgorithm::Schedule(Algorithm::OneShot),
            MpiAlgorithm::Native,
        ],
        AlgoArg::Mpi => vec![MpiAlgorithm::Native],
        other => other
            .algorithm()
            .map(MpiAlgorithm::Schedule)
            .into_iter()
            .collect(),
    }
}

/// `nanoddp check-mpi`: every algorithm, exact on every rank for counts 0, 1, 7, 99,991 and
/// 2^20 + 3, bitwise identical across ranks; then a deliberate disagreement (rank 0 asks for
/// one element more) must fail on every rank with an error naming the rank that differs.
pub fn check(out: &mut impl Write) -> Result<(), CliError> {
    let mpi = Mpi::init().map_err(CliError::Running)?;
    let (me, n) = (mpi.rank(), mpi.size());
    let world = mpi::topology::SimpleCommunicator::world();
    let mut comm = mpi.world(CommConfig::default());
    let say = |out: &mut dyn Write, s: String| -> std::io::Result<()> {
        if me == 0 {
            writeln!(out, "{s}")?;
        }
        Ok(())
    };
    say(out, format!("check-mpi: {n} processes"))?;
    for algo in algorithms(AlgoArg::Auto) {
        for count in [0usize, 1, 7, 99_991, (1 << 20) + 3] {
            // Out of place: the input must come back untouched and the output exact.
            let src = input(me, count);
            let mut dst = vec![f32::NAN; count];
            comm.all_reduce_into(&src, &mut dst, ReduceOp::Sum, Some(algo))?;
            if src != input(me, count) || dst != expected(n, count) {
                return Err(CliError::Running(format!(
                    "{} out of place, {count} elements: wrong",
                    algo.name()
                )));
            }
            let mut buf = input(me, count);
            comm.all_reduce(&mut buf, ReduceOp::Sum, Some(algo))?;
            let wrong = buf
                .iter()
                .zip(expected(n, count))
                .filter(|(a, b)| **a != *b)
                .count();
            let mut wrong_all = 0u64;
            world.all_reduce_into(&(wrong as u64), &mut wrong_all, SystemOperation::sum());
            let hash = fnv(buf.iter().map(|v| v.to_bits()));
            let mut hashes = vec![0u64; n];
            world.all_gather_into(&hash, &mut hashes[..]);
            let identical = hashes.iter().all(|h| *h == hashes[0]);
            say(
                out,
                format!(
                    "{:<7} count {:>9}: out of place exact; in place {} wrong elements over all ranks, results {} across ranks",
                    algo.name(),
                    count,
                    wrong_all,
                    if identical {
                        "bitwise identical"
                    } else {
                        "DIFFERENT"
                    }
                ),
            )?;
            if wrong_all != 0 || !identical {
                return Err(CliError::Running(format!(
                    "{} with {count} elements is wrong",
                    algo.name()
                )));
            }
        }
    }
    // A disagreement: rank 0 calls with 8 elements, the others with 7.
    let mut buf = input(me, if me == 0 { 8 } else { 7 });
    match comm.all_reduce(
        &mut buf,
        ReduceOp::Sum,
        Some(MpiAlgorithm::Schedule(Algorithm::Ring)),
    ) {
        Err(CommError::Mismatch { rank, .. }) => {
            let blamed = if me == 0 { 1 } else { 0 };
            if rank != blamed {
                return Err(CliError::Running(format!(
                    "rank {me} blamed rank {rank}, expected {blamed}"
                )));
            }
        }
        other => {
            return Err(CliError::Running(format!(
                "rank {me}: a count mismatch gave {other:?}"
            )))
        }
    }
    let mut ok = 0u64;
    world.all_reduce_into(&1u64, &mut ok, SystemOperation::sum());
    say(
        out,
        format!("mismatch (rank 0: 8 elements, others: 7): an error on all {ok} ranks, naming the rank that differs"),
    )?;
    Ok(())
}

/// `nanoddp bench allreduce --comm mpi`: the nccl-tests table, one process per rank, out of
/// place and in place; each iteration's time is the slowest rank's, the median is shown.
pub fn bench(out: &mut impl Write, sizes: &[usize], algo: AlgoArg) -> Result<(), CliError> {
    let mpi = Mpi::init().map_err(CliError::Running)?;
    let (me, n) = (mpi.rank(), mpi.size());
    let world = mpi::topology::SimpleCommunicator::world();
    let mut comm = mpi.world(CommConfig::default());
    for algorithm in algorithms(algo) {
        if me == 0 {
            writeln!(
                out,
                "# nanoddp bench allreduce --comm mpi: {n} processes, {}, sum, float32",
                if algorithm == MpiAlgorithm::Native {
                    "MPI_Iallreduce (the MPI library's own)".to_string()
                } else {
                    format!("nanoddp {} over MPI point-to-point", algorithm.name())
                }
            )?;
            header(out, &["out-of-place", "in-place"], &[])?;
        }
        for &bytes in sizes {
            let count = bytes / 4;
            let host = input(me, count);
            let want = expected(n, count);
            let iters = ((256usize << 20) / (bytes.max(1) * n)).clamp(10, 200);
            let warmup = (iters / 5).max(3);
            let mut columns = Vec::new();
            for in_place in [false, true] {
                let mut times = Vec::new();
                let mut buf = host.clone();
                let mut dst = vec![f32::NAN; count];
                for i in 0..iters + warmup {
                    buf.copy_from_slice(&host); // re-fill, untimed
                    world.barrier();
                    let t0 = Instant::now();
                    if in_place {
                        comm.all_reduce(&mut buf, ReduceOp::Sum, Some(algorithm))?;
                    } else {
                        comm.all_reduce_into(&host, &mut dst, ReduceOp::Sum, Some(algorithm))?;
                    }
                    let t = t0.elapsed().as_secs_f64();
                    let mut slowest = 0.0f64;
                    world.all_reduce_into(&t, &mut slowest, SystemOperation::max());
                    if i >= warmup {
                        times.push(slowest);
                    }
                }
                let result = if in_place { &buf } else { &dst };
                let wrong = result.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
                let mut wrong_all = 0u64;
                world.all_reduce_into(&wrong, &mut wrong_all, SystemOperation::sum());
                columns.push(group(bytes, median(times), n, wrong_all));
            }
            if me == 0 {
                row(out, bytes, &columns)?;
            }
        }
    }
    Ok(())
}

/// `check-mpi --late-rank`: the last rank arrives 10 s late; with a 1 s timeout the others
/// must return an error instead of waiting. 10 s, not 2: the others leave `MPI_Init` with it
/// and start their wait within 9 s however loaded the machine (mpirun still waits for the late
/// rank to end, so each second of lateness is a second of the test).
pub fn check_late_rank() -> Result<(), CliError> {
    let mpi = Mpi::init().map_err(CliError::Running)?;
    let (me, n) = (mpi.rank(), mpi.size());
    let mut comm = mpi.world(CommConfig {
        timeout: std::time::Duration::from_secs(1),
        ..CommConfig::default()
    });
    if me == n - 1 {
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
    let mut buf = input(me, 1000);
    comm.all_reduce(
        &mut buf,
        ReduceOp::Sum,
        Some(MpiAlgorithm::Schedule(Algorithm::Ring)),
    )?;
    Err(CliError::Running(format!(
        "rank {me}: the collective completed although rank {} was late",
        n - 1
    )))
}
