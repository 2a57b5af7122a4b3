//! The schedules lowered to message programs (for ranks that share no memory, as MPI
//! processes) compute bit for bit what the in-process transport computes from the same
//! schedule, for every algorithm, rank count, odd sizes, pipelined slices, in and out of place.

use std::time::Duration;

use nanoddp::backend::{cpu::CpuDevice, Memory};
use nanoddp::comm::communicator::{communicator, CommConfig, ReduceOp};
use nanoddp::comm::messages::{execute, lower, threads::wires};
use nanoddp::comm::rank_threads::on_each_rank;
use nanoddp::comm::schedule::{all_reduce, Algorithm};

/// Fresh random inputs: rank r, element i (not integers, so the order of additions shows).
fn inputs(n: usize, count: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            (0..count)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 40) as f32 / (1u64 << 20) as f32 - 8.0
                })
                .collect()
        })
        .collect()
}

/// One all-reduce to run both ways: each rank's input, the algorithm, the slice in
/// elements, in place or not.
struct Case<'a> {
    algorithm: Algorithm,
    data: &'a [Vec<f32>],
    slice: usize,
    in_place: bool,
}

/// The in-process communicator's results (CPU devices, one thread per rank).
fn in_process(case: &Case<'_>) -> Vec<Vec<f32>> {
    let cfg = CommConfig {
        slice_bytes: case.slice * 4,
        ..CommConfig::default()
    };
    let ranks = communicator(vec![CpuDevice::new(); case.data.len()], cfg).unwrap();
    let ranks: Vec<_> = ranks.into_iter().zip(case.data).collect();
    on_each_rank(ranks, |(mut rank, x)| {
        let dev = *rank.device();
        let src = dev.upload(x).unwrap();
        let mut dst = dev.upload(&vec![f32::NAN; x.len()]).unwrap();
        if case.in_place {
            let mut buf = src;
            rank.all_reduce(&mut buf, ReduceOp::Sum, Some(case.algorithm))
                .unwrap();
            dev.download(&buf).unwrap()
        } else {
            rank.all_reduce_into(&src, &mut dst, ReduceOp::Sum, Some(case.algorithm))
                .unwrap();
            dev.download(&dst).unwrap()
        }
    })
    .expect("no rank panics")
}

/// The message programs' results, ranks as threads exchanging messages.
fn by_messages(case: &Case<'_>) -> Vec<Vec<f32>> {
    let Case {
        algorithm,
        data,
        slice,
        in_place,
    } = *case;
    let n = data.len();
    let count = data[0].len();
    let program = lower(&all_reduce(algorithm, n, count, slice, in_place), in_place)
        .unwrap_or_else(|e| panic!("{algorithm:?} n={n} count={count}: {e}"));
    let program = &program;
    let ranks: Vec<_> = wires(n, Duration::from_secs(20))
        .into_iter()
        .zip(data)
        .enumerate()
        .collect();
    on_each_rank(ranks, |(me, (mut wire, x))| {
        let mut out = if in_place {
            x.clone()
        } else {
            vec![f32::NAN; count]
        };
        let input = (!in_place).then_some(&x[..]);
        execute(program, me, input, &mut out, 1.0, &mut wire)
            .unwrap_or_else(|e| panic!("rank {me}: {e}"));
        out
    })
    .expect("no rank panics")
}

#[test]
fn message_programs_equal_the_in_process_transport_bit_for_bit() {
    for algorithm in Algorithm::ALL {
        for n in 1..=6 {
            for (count, slice) in [(0, 1), (1, 1), (7, 7), (1000, 64), (4099, 1000)] {
                for in_place in [true, false] {
                    let data = inputs(n, count, (n * 7919 + count) as u64);
                    let case = Case {
                        algorithm,
                        data: &data,
                        slice,
                        in_place,
                    };
                    let (want, got) = (in_process(&case), by_messages(&case));
                    for r in 0..n {
                        let same = want[r]
                            .iter()
                            .zip(&got[r])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same && want[r].len() == got[r].len(),
                            "{algorithm:?} n={n} count={count} slice={slice} in_place={in_place} rank {r}"
                        );
                        // Every rank holds the same bits, and they are the sum (to rounding).
                        assert_eq!(
                            got[r].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            got[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                        );
                    }
                    for i in 0..count {
                        let exact: f64 = data.iter().map(|x| x[i] as f64).sum();
                        assert!(
                            (got[0][i] as f64 - exact).abs()
                                <= 1e-5 * (1.0 + exact.abs()) * n as f64
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_missing_peer_is_a_timeout_naming_it() {
    let program = lower(&all_reduce(Algorithm::Ring, 3, 30, 30, true), true).unwrap();
    let mut ws = wires(3, Duration::from_millis(200));
    // Rank 2 never runs: rank 0 must give up with an error that names a peer.
    let mut w0 = ws.remove(0);
    let mut x = vec![1.0f32; 30];
    let e = execute(&program, 0, None, &mut x, 1.0, &mut w0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 0") && e.contains("timed out"), "{e}");
}
