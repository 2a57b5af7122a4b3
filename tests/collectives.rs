//! Collectives on every backend (cpu threads; the SIMT emulator running `collective.cu`; the
//! CUDA backend, on the CPU stand-in for the driver when there is no GPU): every algorithm, in and out of place, rank counts 1..8, counts 0, 1, 7,
//! a prime near 1e5 and 2^20 + 3. Exact inputs (small integers times powers of two: every
//! summation order is exact) are compared with 0 ulp of error; random inputs against a
//! float64 sum. Mismatched calls and dead ranks must end in errors on every surviving rank
//! within seconds.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use nanoddp::backend::cpu::{CpuBuffer, CpuDevice};
use nanoddp::backend::simt::SimtDevice;
use nanoddp::backend::{BackendError, DeviceScalar, Memory};
use nanoddp::comm::communicator::{communicator, CommConfig, CommError, Rank, ReduceOp};
use nanoddp::comm::rank_threads::on_each_rank;
use nanoddp::comm::schedule::Algorithm;
use nanoddp::comm::transport::{CommDevice, Reduction};

const ALGOS: [Option<Algorithm>; 5] = [
    Some(Algorithm::Ring),
    Some(Algorithm::Tree),
    Some(Algorithm::Direct),
    Some(Algorithm::OneShot),
    None,
];

/// Rank r's exact input: ((i mod 13) + 1) · 2^(r mod 5), like nccl-tests.
fn exact_input(rank: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((i % 13) + 1) as f32 * (1u32 << (rank % 5)) as f32)
        .collect()
}

/// Rank r's CPU device (they are all alike), as [`all_reduce_exact`] makes devices.
fn cpu_device(_rank: usize) -> CpuDevice {
    CpuDevice::new()
}

/// Time a loaded machine may add to a collective's timeout before a test calls the wait a
/// hang: the tests assert that failures end the call, not how fast the machine is.
const LOAD_SLACK_S: u64 = 60;

/// Asserts that what began at `start` ended within a timeout of `seconds` (plus
/// [`LOAD_SLACK_S`]): a failure must not hang.
fn finished_within(start: Instant, seconds: u64) {
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(seconds + LOAD_SLACK_S),
        "took {took:?}"
    );
}

/// Runs `f` on every rank's own thread and returns the results in rank order.
fn on_ranks<D, R, F>(ranks: Vec<Rank<D>>, f: F) -> Vec<R>
where
    D: CommDevice,
    R: Send,
    F: Fn(Rank<D>) -> R + Sync,
{
    on_each_rank(ranks, f).expect("no rank thread panics")
}

fn all_reduce_exact<D, T>(
    make: impl Fn(usize) -> D,
    n: usize,
    count: usize,
    algo: Option<Algorithm>,
    in_place: bool,
    op: ReduceOp,
) where
    D: CommDevice + Clone + 'static,
    T: nanoddp::backend::Precision,
{
    let devices: Vec<D> = (0..n).map(&make).collect();
    let ranks = communicator(devices, CommConfig::default()).unwrap();
    let outs = on_ranks(ranks, move |mut rank| {
        let dev = rank.device().clone();
        let input: Vec<T> = exact_input(rank.rank(), count)
            .into_iter()
            .map(T::from_f32)
            .collect();
        let mut buf = dev.upload(&input).unwrap();
        if in_place {
            rank.all_reduce(&mut buf, op, algo).unwrap();
            dev.download(&buf).unwrap()
        } else {
            let mut out = dev.upload(&vec![T::from_f32(f32::NAN); count]).unwrap();
            rank.all_reduce_into(&buf, &mut out, op, algo).unwrap();
            assert_eq!(
                dev.download(&buf)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_f32())
                    .collect::<Vec<_>>(),
                input.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                "out of place must not touch the input"
            );
            dev.download(&out).unwrap()
        }
    });
    let scale = if op == ReduceOp::Avg {
        1.0 / n as f64
    } else {
        1.0
    };
    let inputs: Vec<Vec<f32>> = (0..n).map(|p| exact_input(p, count)).collect();
    let want: Vec<f32> = (0..count)
        .map(|i| {
            T::from_f32((inputs.iter().map(|v| v[i] as f64).sum::<f64>() * scale) as f32).to_f32()
        })
        .collect();
    for (r, out) in outs.iter().enumerate() {
        assert_eq!(out.len(), count);
        if let Some(i) = (0..count).find(|&i| out[i].to_f32() != want[i]) {
            panic!("{algo:?} n={n} count={count} in_place={in_place} {op:?}: rank {r} element {i} is {} not {}", out[i].to_f32(), want[i]);
        }
    }
    // Bitwise identical on every rank.
    for out in &outs[1..] {
        assert!(out
            .iter()
            .zip(&outs[0])
            .all(|(a, b)| a.to_f32().to_bits() == b.to_f32().to_bits()));
    }
}

#[test]
fn cpu_all_reduce_is_exact_for_every_algorithm_size_and_rank_count() {
    for n in [1, 2, 3, 4, 5, 7, 8] {
        for count in [0, 1, 7, 100_003, (1 << 20) + 3] {
            for algo in ALGOS {
                for in_place in [true, false] {
                    if algo == Some(Algorithm::OneShot) && in_place && count > 1 << 20 {
                        continue; // over the scratch limit by design (tested below)
                    }
                    all_reduce_exact::<CpuDevice, f32>(
                        cpu_device,
                        n,
                        count,
                        algo,
                        in_place,
                        ReduceOp::Sum,
                    );
                }
            }
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn simt_all_reduce_runs_the_collective_kernel_over_peer_memory() {
    for n in [1, 2, 3, 5] {
        for count in [0, 1, 7, 100_003] {
            for algo in ALGOS {
                all_reduce_exact::<SimtDevice, f32>(
                    SimtDevice::new,
                    n,
                    count,
                    algo,
                    count % 2 == 1,
                    ReduceOp::Sum,
                );
            }
        }
    }
    all_reduce_exact::<SimtDevice, f32>(
        SimtDevice::new,
        8,
        (1 << 20) + 3,
        Some(Algorithm::Direct),
        true,
        ReduceOp::Sum,
    );
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn cuda_all_reduce_over_peer_memory_for_every_algorithm_and_rank_count() {
    // On GPUs when there are enough, else on the CPU stand-in for the driver, whose lazy
    // streams, per-GPU address ranges and peer-access checks make a missing synchronization
    // or a missing grant fail here rather than on the first multi-GPU machine.
    for n in 1..=common::cuda_gpus().min(8) {
        for count in [0, 1, 7, 100_003] {
            for algo in ALGOS {
                for in_place in [true, false] {
                    all_reduce_exact::<nanoddp::backend::cuda::CudaDevice, f32>(
                        common::cuda_device,
                        n,
                        count,
                        algo,
                        in_place,
                        ReduceOp::Sum,
                    );
                }
            }
        }
    }
    all_reduce_exact::<nanoddp::backend::cuda::CudaDevice, f16>(
        common::cuda_device,
        common::cuda_gpus().min(3),
        1001,
        Some(Algorithm::Ring),
        false,
        ReduceOp::Avg,
    );
    all_reduce_exact::<nanoddp::backend::cuda::CudaDevice, bf16>(
        common::cuda_device,
        common::cuda_gpus().min(3),
        1001,
        Some(Algorithm::Tree),
        true,
        ReduceOp::Sum,
    );
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn averages_and_half_precision() {
    for algo in ALGOS {
        all_reduce_exact::<CpuDevice, f32>(cpu_device, 4, 1001, algo, true, ReduceOp::Avg);
        all_reduce_exact::<CpuDevice, f16>(cpu_device, 3, 1001, algo, false, ReduceOp::Sum);
        all_reduce_exact::<SimtDevice, f16>(SimtDevice::new, 3, 1001, algo, true, ReduceOp::Sum);
        // Three ranks' sums stay within bf16's 8 significant bits: exact at every hop.
        all_reduce_exact::<CpuDevice, bf16>(cpu_device, 3, 1001, algo, false, ReduceOp::Sum);
        all_reduce_exact::<SimtDevice, bf16>(SimtDevice::new, 3, 1001, algo, true, ReduceOp::Avg);
    }
}

#[test]
fn random_inputs_match_a_float64_sum() {
    for algo in ALGOS {
        let n = 6;
        let count = 50_000;
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|r| {
                let mut g = common::rng(r as u64);
                common::random(&mut g, count)
            })
            .collect();
        let ranks = communicator(vec![CpuDevice::new(); n], CommConfig::default()).unwrap();
        let inputs2 = inputs.clone();
        let outs = on_ranks(ranks, move |mut rank| {
            let dev = *rank.device();
            let mut buf = dev.upload(&inputs2[rank.rank()]).unwrap();
            rank.all_reduce(&mut buf, ReduceOp::Sum, algo).unwrap();
            dev.download(&buf).unwrap()
        });
        for i in 0..count {
            let want: f64 = inputs.iter().map(|v| v[i] as f64).sum();
            let mag: f64 = inputs.iter().map(|v| (v[i] as f64).abs()).sum();
            assert!(
                (outs[0][i] as f64 - want).abs() <= 1e-6 * mag + 1e-7,
                "{algo:?} element {i}"
            );
            assert!(
                outs.iter().all(|o| o[i].to_bits() == outs[0][i].to_bits()),
                "{algo:?}: ranks differ at {i}"
            );
        }
    }
}

#[test]
fn reduce_scatter_all_gather_broadcast_barrier() {
    for n in [1, 2, 3, 5, 8] {
        let count = 37;
        let ranks = communicator(vec![CpuDevice::new(); n], CommConfig::default()).unwrap();
        on_ranks(ranks, move |mut rank| {
            let dev = *rank.device();
            let me = rank.rank();
            let src: Vec<f32> = (0..n * count).map(|i| (i + me) as f32).collect();
            let d_src = dev.upload(&src).unwrap();
            let mut out = dev.alloc_zeros::<f32>(count).unwrap();
            rank.reduce_scatter(&d_src, &mut out, ReduceOp::Sum)
                .unwrap();
            let got = dev.download(&out).unwrap();
            for (j, v) in got.iter().enumerate() {
                let want: usize = (0..n).map(|p| me * count + j + p).sum();
                assert_eq!(*v, want as f32);
            }
            let mine = dev.upload(&vec![me as f32; count]).unwrap();
            let mut all = dev.alloc_zeros::<f32>(n * count).unwrap();
            rank.all_gather(&mine, &mut all).unwrap();
            let all = dev.download(&all).unwrap();
            assert!(all
                .iter()
                .enumerate()
                .all(|(i, v)| *v == (i / count) as f32));
            let mut b = dev.upload(&vec![me as f32 * 10.0; count]).unwrap();
            rank.broadcast(&mut b, n - 1).unwrap();
            assert_eq!(
                dev.download(&b).unwrap(),
                vec![(n - 1) as f32 * 10.0; count]
            );
            rank.barrier().unwrap();
        });
    }
}

#[test]
fn many_collectives_in_a_row_stay_consistent() {
    // Flags only grow: a thousand back-to-back collectives with alternating algorithms,
    // 8 ranks on this machine's 2 cores.
    let ranks = communicator(vec![CpuDevice::new(); 8], CommConfig::default()).unwrap();
    on_ranks(ranks, |mut rank| {
        let dev = *rank.device();
        let mut buf = dev.upload(&[1.0f32; 3]).unwrap();
        for i in 0..1000 {
            dev.write(&[1.0f32; 3], &mut buf).unwrap();
            rank.all_reduce(&mut buf, ReduceOp::Sum, Some(Algorithm::ALL[i % 4]))
                .unwrap();
            assert_eq!(dev.download(&buf).unwrap(), vec![8.0; 3], "iteration {i}");
        }
    });
}

fn quick(timeout_s: u64) -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(timeout_s),
        ..CommConfig::default()
    }
}

#[test]
fn mismatched_calls_fail_on_every_rank() {
    let start = Instant::now();
    let ranks = communicator(vec![CpuDevice::new(); 4], quick(5)).unwrap();
    let results = on_ranks(ranks, |mut rank| {
        let dev = *rank.device();
        let count = if rank.rank() == 2 { 11 } else { 10 }; // rank 2 disagrees on the size
        let mut buf = dev.upload(&vec![1.0f32; count]).unwrap();
        let first = rank.all_reduce(&mut buf, ReduceOp::Sum, Some(Algorithm::Ring));
        let after = rank.barrier(); // refused: the communicator is aborted
        (first, after)
    });
    for (r, (first, after)) in results.iter().enumerate() {
        let e = first.as_ref().expect_err("mismatch must fail");
        assert!(
            matches!(e, CommError::Mismatch { .. } | CommError::Aborted { .. }),
            "rank {r}: {e}"
        );
        assert!(
            e.to_string().contains("11") || e.to_string().contains("aborted"),
            "rank {r}: {e}"
        );
        assert!(
            matches!(after, Err(CommError::Aborted { .. })),
            "rank {r}: further use must be refused"
        );
    }
    finished_within(start, 5);
}

/// `n` CPU ranks (timeout `timeout_s`) sum `len` ones, except rank `absent`, which does
/// `instead` and never calls: every other rank must fail within the timeout, with an error
/// that `blames_absent` accepts or one saying that the communicator was aborted. `instead`
/// is given a wait that returns once every other rank has returned.
fn others_fail_without(
    n: usize,
    timeout_s: u64,
    absent: usize,
    len: usize,
    instead: impl Fn(Rank<CpuDevice>, &dyn Fn()) + Sync,
    blames_absent: impl Fn(&CommError) -> bool,
) {
    let start = Instant::now();
    let returned = AtomicUsize::new(0);
    let others_returned = || {
        while returned.load(Ordering::SeqCst) < n - 1 {
            assert!(
                start.elapsed() < Duration::from_secs(timeout_s + LOAD_SLACK_S),
                "the other ranks never returned"
            );
            thread::sleep(Duration::from_millis(1));
        }
    };
    let ranks = communicator(vec![CpuDevice::new(); n], quick(timeout_s)).unwrap();
    let results = on_ranks(ranks, |mut rank| {
        if rank.rank() == absent {
            instead(rank, &others_returned);
            return None;
        }
        let dev = *rank.device();
        let mut buf = dev.upload(&vec![1.0f32; len]).unwrap();
        let result = rank.all_reduce(&mut buf, ReduceOp::Sum, None);
        returned.fetch_add(1, Ordering::SeqCst);
        Some(result)
    });
    for (r, res) in results.iter().enumerate().filter(|(r, _)| *r != absent) {
        let e = res.as_ref().expect("ran").as_ref().expect_err("must fail");
        assert!(
            blames_absent(e) || matches!(e, CommError::Aborted { .. }),
            "rank {r}: {e}"
        );
    }
    finished_within(start, timeout_s);
}

#[test]
fn a_rank_that_dies_fails_the_others_within_the_timeout() {
    // Rank 3 dies without ever calling; the others see it gone (not a timeout: the test's
    // timeout is far longer than any wait for a dead peer's departure).
    others_fail_without(
        5,
        30,
        3,
        100,
        |rank, _| drop(rank),
        |e| matches!(e, CommError::PeerGone { peer: 3, .. }),
    );
}

#[test]
fn a_rank_that_stalls_times_out_everyone() {
    // Rank 0 never shows up: it holds its rank, without calling, until the others returned.
    let stall = |_rank: Rank<CpuDevice>, others_returned: &dyn Fn()| others_returned();
    others_fail_without(3, 1, 0, 10, stall, |e| {
        matches!(e, CommError::Timeout { peer: 0, .. })
    });
}

/// A CPU device whose transport panics at its `fail_at`-th step: a rank dying mid-collective.
#[derive(Clone)]
struct Dying {
    cpu: CpuDevice,
    fail_at: Option<usize>,
    steps: std::sync::Arc<AtomicUsize>,
}

impl Memory for Dying {
    type Buffer<T: DeviceScalar> = CpuBuffer<T>;
    nanoddp::no_marks!();
    fn alloc_zeros<T: DeviceScalar>(&self, len: usize) -> Result<CpuBuffer<T>, BackendError> {
        self.cpu.alloc_zeros(len)
    }
    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<CpuBuffer<T>, BackendError> {
        self.cpu.upload(host)
    }
    fn copy_in<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut CpuBuffer<T>,
    ) -> Result<(), BackendError> {
        self.cpu.copy_in(host, buf)
    }
    fn download<T: DeviceScalar>(&self, buf: &CpuBuffer<T>) -> Result<Vec<T>, BackendError> {
        self.cpu.download(buf)
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

impl CommDevice for Dying {
    type State = ();
    fn comm_state(&self, _: &[Dying]) -> Result<(), BackendError> {
        Ok(())
    }
    unsafe fn reduce(&self, s: &mut (), r: Reduction<'_>) -> Result<(), BackendError> {
        if Some(self.steps.fetch_add(1, Ordering::SeqCst)) == self.fail_at {
            panic!("simulated device failure");
        }
        // SAFETY: forwarded.
        unsafe { self.cpu.reduce(s, r) }
    }
}

#[test]
fn a_rank_that_panics_mid_collective_aborts_the_others() {
    let start = Instant::now();
    let devices: Vec<Dying> = (0..4)
        .map(|r| Dying {
            cpu: CpuDevice::new(),
            fail_at: (r == 1).then_some(3),
            steps: Default::default(),
        })
        .collect();
    let ranks = communicator(devices, quick(5)).unwrap();
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|mut rank| {
            thread::spawn(move || {
                let dev = rank.device().clone();
                let mut buf = dev.upload(&[1.0f32; 4096]).unwrap();
                rank.all_reduce(&mut buf, ReduceOp::Sum, Some(Algorithm::Ring))
                    .map(|_| ())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
    assert!(results[1].is_err(), "rank 1 panicked");
    for (r, res) in results.iter().enumerate().filter(|(r, _)| *r != 1) {
        let e = res
            .as_ref()
            .expect("no panic")
            .as_ref()
            .expect_err("must fail");
        assert!(
            matches!(e, CommError::Aborted { .. } | CommError::PeerGone { .. }),
            "rank {r}: {e}"
        );
    }
    finished_within(start, 5);
}

#[test]
fn oneshot_in_place_refuses_buffers_over_its_scratch_limit() {
    let config = CommConfig {
        oneshot_max_bytes: 1024,
        ..CommConfig::default()
    };
    let ranks = communicator(vec![CpuDevice::new(); 2], config).unwrap();
    let results = on_ranks(ranks, |mut rank| {
        let dev = *rank.device();
        let mut buf = dev.upload(&[1.0f32; 1000]).unwrap();
        rank.all_reduce(&mut buf, ReduceOp::Sum, Some(Algorithm::OneShot))
    });
    for r in results {
        assert!(matches!(r, Err(CommError::Invalid { .. })), "{r:?}");
    }
}
