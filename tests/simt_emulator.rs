//! The SIMT emulator against CUDA's execution model, through the self-test kernels in
//! `kernels/selftest.cu`. Correct kernels must give exact (or float64-bounded) results under
//! several lane orders; each deliberately broken kernel must be reported, never hang.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use half::f16;
use nanoddp::backend::simt::{
    launch_timeout_from_env_value, same_under_lane_orders, EmulatorError, EmulatorFault, LaneOrder,
    OrderDependence, SimtConfig, SimtDevice, DEFAULT_LAUNCH_TIMEOUT, LAUNCH_TIMEOUT_ENV,
};
use nanoddp::backend::{BackendError, LaunchConfig, Memory};
use nanoddp::kernels::selftest as k;
use rand::{Rng, SeedableRng};

const TWO_ORDERS: [LaneOrder; 2] = [LaneOrder::Forward, LaneOrder::Reverse];
const THREE_ORDERS: [LaneOrder; 3] = [
    LaneOrder::Forward,
    LaneOrder::Reverse,
    LaneOrder::Random(0xC0FFEE),
];

fn cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        shared_bytes: 0,
    }
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// How long a misuse may take to be reported before the test calls it a hang: far more than
/// any report takes, even on a machine loaded by other work.
const HANG: Duration = Duration::from_secs(120);

/// Runs `f` on another thread and fails the test if it has not returned by `deadline`:
/// the emulator must turn every misuse into an error, never a hang.
fn finishes_within<T: Send + 'static>(
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let start = Instant::now();
        let out = f();
        let _ = tx.send((out, start.elapsed()));
    });
    rx.recv_timeout(deadline)
        .unwrap_or_else(|_| panic!("did not finish within {deadline:?}: a hang"))
}

fn emulator_error(result: Result<(), BackendError>) -> EmulatorError {
    match result {
        Err(BackendError::Emulator(e)) => *e,
        other => panic!("expected the emulator to report an error, got {other:?}"),
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn vector_add_with_grid_stride_loops_over_many_sizes() {
    let mut sizes: Vec<usize> = vec![
        1, 2, 3, 31, 32, 33, 255, 256, 257, 1000, 4097, 65_535, 65_536, 65_537, 69_999, 70_000,
    ];
    let mut r = rng(1);
    sizes.extend((0..8).map(|_| r.gen_range(1..70_000)));
    for n in sizes {
        let a: Vec<f32> = (0..n).map(|_| r.gen_range(-1e3f32..1e3)).collect();
        let b: Vec<f32> = (0..n).map(|_| r.gen_range(-1e3f32..1e3)).collect();
        // A small grid on purpose: most threads handle several elements.
        let shape = cfg(3, 64);
        let got = same_under_lane_orders(&TWO_ORDERS, |dev| {
            let (da, db) = (dev.upload(&a)?, dev.upload(&b)?);
            let mut dc = dev.upload(&vec![f32::NAN; n])?;
            // SAFETY: all three buffers hold n elements and the kernel touches [0, n).
            unsafe { k::vector_add(dev, shape, &da, &db, &mut dc, n as u64)? };
            dev.download(&dc)
        })
        .unwrap();
        // f32 addition is correctly rounded, so the float64 sum rounded once is exact.
        for i in 0..n {
            assert_eq!(got[i], (a[i] as f64 + b[i] as f64) as f32, "n={n} i={i}");
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn block_reduction_through_shared_memory_for_awkward_block_sizes() {
    for threads in [1u32, 31, 32, 33, 255, 256, 1024] {
        let blocks = 5u32;
        let n = (blocks * threads).saturating_sub(3).max(1) as usize; // a partial last block
        let mut r = rng(u64::from(threads));
        let input: Vec<f32> = (0..n).map(|_| r.gen_range(-50i32..50) as f32).collect();
        let got = same_under_lane_orders(&THREE_ORDERS, |dev| {
            let din = dev.upload(&input)?;
            let mut dout = dev.upload(&vec![f32::NAN; blocks as usize])?;
            // SAFETY: the kernel reads in[0, n) and writes out[0, blocks).
            unsafe { k::block_sum(dev, cfg(blocks, threads), &din, &mut dout, n as u32)? };
            dev.download(&dout)
        })
        .unwrap();
        for (b, sum) in got.iter().enumerate() {
            let lo = b * threads as usize;
            let want: f64 = input
                .iter()
                .skip(lo)
                .take(threads as usize)
                .map(|&v| v as f64)
                .sum();
            assert_eq!(*sum as f64, want, "block size {threads}, block {b}"); // small integers: exact
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn warp_reductions_with_shfl_down_and_shfl_xor() {
    let (blocks, threads) = (3u32, 128u32);
    let n = (blocks * threads) as usize;
    let mut r = rng(2);
    let input: Vec<f32> = (0..n).map(|_| r.gen_range(-100i32..100) as f32).collect();
    let got = same_under_lane_orders(&THREE_ORDERS, |dev| {
        let din = dev.upload(&input)?;
        let mut down = dev.upload(&vec![f32::NAN; n / 32])?;
        let mut xor = dev.upload(&vec![f32::NAN; n])?;
        // SAFETY: one thread per input; down has one slot per warp, xor one per thread.
        unsafe { k::warp_sums(dev, cfg(blocks, threads), &din, &mut down, &mut xor)? };
        let mut out = dev.download(&down)?;
        out.extend(dev.download(&xor)?);
        Ok(out)
    })
    .unwrap();
    for w in 0..n / 32 {
        let want: f64 = input[w * 32..(w + 1) * 32].iter().map(|&v| v as f64).sum();
        assert_eq!(got[w] as f64, want, "shfl_down sum of warp {w}");
        for lane in 0..32 {
            assert_eq!(
                got[n / 32 + w * 32 + lane] as f64,
                want,
                "shfl_xor sum, warp {w} lane {lane}"
            );
        }
    }
}

/// CUDA's shuffle rules, written from the CUDA C++ Programming Guide's text (not from the
/// emulator): sub-warps of `width` lanes act as separate warps.
fn cuda_shuffle(
    values: &[i32],
    lane: usize,
    kind: usize,
    src: i32,
    delta: i32,
    width: usize,
) -> i32 {
    let base = lane / width * width;
    let pos = (lane - base) as i32;
    let w = width as i32;
    let from = match kind {
        0 => base as i32 + src.rem_euclid(w), // srcLane modulo width, within the sub-warp
        1 => {
            if pos - delta < 0 {
                lane as i32
            } else {
                lane as i32 - delta
            }
        } // lower delta lanes unchanged
        2 => {
            if pos + delta >= w {
                lane as i32
            } else {
                lane as i32 + delta
            }
        } // upper delta lanes unchanged
        _ => {
            let x = lane as i32 ^ delta;
            if x >= base as i32 + w {
                lane as i32
            } else {
                x
            } // later groups: own value
        }
    };
    values[from as usize]
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn shuffles_follow_cudas_rules_for_every_width() {
    let threads = 64u32;
    let input: Vec<i32> = (0..threads as i32).map(|i| 1000 + i * 7).collect();
    for width in [1usize, 2, 4, 8, 16, 32] {
        for (src, delta) in [(0, 1), (3, 2), (-1, 3), (37, 5), (5, 16), (31, 31), (2, 0)] {
            let got = same_under_lane_orders(&TWO_ORDERS, |dev| {
                let din = dev.upload(&input)?;
                let mut out = dev.upload(&vec![-1i32; 4 * threads as usize])?;
                // SAFETY: one input and four outputs per thread.
                unsafe {
                    k::shuffle_rules(
                        dev,
                        cfg(1, threads),
                        &din,
                        &mut out,
                        src,
                        delta,
                        width as i32,
                    )?
                };
                dev.download(&out)
            })
            .unwrap();
            for t in 0..threads as usize {
                let warp = &input[t / 32 * 32..t / 32 * 32 + 32];
                for kind in 0..4 {
                    let want = cuda_shuffle(warp, t % 32, kind, src, delta, width);
                    assert_eq!(
                        got[4 * t + kind],
                        want,
                        "width {width} src {src} delta {delta} thread {t} kind {kind}"
                    );
                }
            }
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn ballot_any_and_all() {
    let threads = 32 * 6;
    let mut r = rng(3);
    let mut pred: Vec<i32> = (0..threads)
        .map(|_| {
            if r.gen_bool(0.4) {
                r.gen_range(1..9)
            } else {
                0
            }
        })
        .collect();
    pred[..32].fill(0); // a warp with no votes
    pred[32..64].fill(-3); // a warp where every lane votes (any non-zero value counts)
    let got = same_under_lane_orders(&THREE_ORDERS, |dev| {
        let dp = dev.upload(&pred)?;
        let mut ballot = dev.upload(&vec![0xdeadu32; threads / 32])?;
        let mut count = dev.upload(&vec![0xdeadu32; threads / 32])?;
        let mut any = dev.upload(&vec![-1i32; threads])?;
        let mut all = dev.upload(&vec![-1i32; threads])?;
        // SAFETY: one predicate per thread; per-warp and per-thread outputs sized to match.
        unsafe {
            k::votes(
                dev,
                cfg(2, threads as u32 / 2),
                &dp,
                &mut ballot,
                &mut count,
                &mut any,
                &mut all,
            )?
        };
        let mut out: Vec<u32> = dev.download(&ballot)?;
        out.extend(dev.download(&count)?);
        out.extend(dev.download(&any)?.iter().map(|&v| v as u32));
        out.extend(dev.download(&all)?.iter().map(|&v| v as u32));
        Ok(out)
    })
    .unwrap();
    let warps = threads / 32;
    for w in 0..warps {
        let lanes = &pred[w * 32..(w + 1) * 32];
        let bits = lanes
            .iter()
            .enumerate()
            .filter(|(_, &p)| p != 0)
            .fold(0u32, |b, (l, _)| b | 1 << l);
        assert_eq!(got[w], bits, "ballot of warp {w}");
        assert_eq!(got[warps + w], bits.count_ones(), "count of warp {w}");
        for l in 0..32 {
            let t = w * 32 + l;
            assert_eq!(got[2 * warps + t], u32::from(bits != 0), "any, thread {t}");
            assert_eq!(
                got[2 * warps + threads + t],
                u32::from(bits == u32::MAX),
                "all, thread {t}"
            );
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn atomic_add_from_many_blocks_is_exact() {
    let n = 100_003usize;
    let mut r = rng(4);
    let input: Vec<i32> = (0..n).map(|_| r.gen_range(-1000..1000)).collect();
    let want: i64 = input.iter().map(|&v| i64::from(v)).sum();
    for workers in [1u32, 2, 4] {
        let dev = SimtDevice::with_config(
            0,
            SimtConfig {
                lane_order: LaneOrder::Random(9),
                workers,
                ..Default::default()
            },
        );
        let din = dev.upload(&input).unwrap();
        let mut total = dev.upload(&[0i32]).unwrap();
        // SAFETY: reads in[0, n), adds into total[0].
        unsafe { k::atomic_sum(&dev, cfg(97, 128), &din, &mut total, n as u64).unwrap() };
        assert_eq!(
            i64::from(dev.download(&total).unwrap()[0]),
            want,
            "{workers} workers"
        );
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_other_atomics_are_atomic() {
    let (blocks, threads) = (7u32, 96u32);
    let n = (blocks * threads) as usize;
    let mut r = rng(11);
    let ival: Vec<i32> = (0..n).map(|_| r.gen()).collect();
    let uval: Vec<u32> = (0..n).map(|_| r.gen()).collect();
    let fval: Vec<f32> = (0..n).map(|_| r.gen_range(-64i32..64) as f32).collect();
    for workers in [1u32, 2, 3] {
        let dev = SimtDevice::with_config(
            0,
            SimtConfig {
                lane_order: LaneOrder::Random(u64::from(workers)),
                workers,
                ..Default::default()
            },
        );
        let (di, du, df) = (
            dev.upload(&ival).unwrap(),
            dev.upload(&uval).unwrap(),
            dev.upload(&fval).unwrap(),
        );
        let mut counters = dev
            .upload(
                &[i32::MIN, 0, 0]
                    .iter()
                    .copied()
                    .chain([0; 64])
                    .collect::<Vec<i32>>(),
            )
            .unwrap();
        let mut floats = dev.upload(&[0.0f32, -1.0]).unwrap();
        let mut winners = dev.upload(&vec![-1i32; n]).unwrap();
        // SAFETY: one input and one winner slot per thread; 67 counters and 2 floats.
        unsafe {
            k::atomic_mix(
                &dev,
                cfg(blocks, threads),
                &di,
                &du,
                &df,
                &mut counters,
                &mut floats,
                &mut winners,
            )
            .unwrap()
        };
        let c = dev.download(&counters).unwrap();
        let f = dev.download(&floats).unwrap();
        let w = dev.download(&winners).unwrap();
        assert_eq!(c[0], *ival.iter().max().unwrap(), "atomicMax(int)");
        assert_eq!(
            c[1] as u32,
            *uval.iter().max().unwrap(),
            "atomicMax(unsigned)"
        );
        assert_eq!(c[2] as usize, n, "atomicAdd(unsigned)");
        assert_eq!(
            f[0] as f64,
            fval.iter().map(|&v| v as f64).sum::<f64>(),
            "atomicAdd(float)"
        );
        assert!(
            f[1] >= 0.0 && (f[1] as usize) < n && f[1].fract() == 0.0,
            "atomicExch(float) kept a thread id"
        );
        for slot in 0..64 {
            let contenders: Vec<usize> = (slot..n).step_by(64).collect();
            let won: Vec<usize> = contenders.iter().copied().filter(|&t| w[t] == 1).collect();
            assert_eq!(won.len(), 1, "atomicCAS: slot {slot} has winners {won:?}");
            assert_eq!(
                c[3 + slot] as usize,
                won[0] + 1,
                "the winner's value stays in slot {slot}"
            );
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn half_arithmetic_rounds_once_to_nearest_even() {
    let n = 50_000usize;
    let mut r = rng(12);
    // Magnitudes up to 8: every a*b+c below is exact in float64, so one rounding of the
    // float64 value is the correctly rounded half result.
    let mut draw =
        || f16::from_f32(r.gen_range(-8.0f32..8.0) * if r.gen_bool(0.1) { 1e-3 } else { 1.0 });
    let a: Vec<f16> = (0..n).map(|_| draw()).collect();
    let b: Vec<f16> = (0..n).map(|_| draw()).collect();
    let c: Vec<f16> = (0..n).map(|_| draw()).collect();
    let got = same_under_lane_orders(&TWO_ORDERS, |dev| {
        let (da, db, dc) = (dev.upload(&a)?, dev.upload(&b)?, dev.upload(&c)?);
        let mut out = dev.upload(&vec![f16::NAN; 4 * n])?;
        // SAFETY: three inputs of n, four outputs per input.
        unsafe { k::half_arith(dev, cfg(40, 128), &da, &db, &dc, &mut out, n as u32)? };
        dev.download(&out)
    })
    .unwrap();
    for i in 0..n {
        let (x, y, z) = (a[i].to_f64(), b[i].to_f64(), c[i].to_f64());
        let want = [x + y, x - y, x * y, x * y + z].map(f16::from_f64);
        for (k, w) in want.iter().enumerate() {
            assert_eq!(
                got[4 * i + k].to_bits(),
                w.to_bits(),
                "op {k} on ({x}, {y}, {z})"
            );
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn syncwarp_orders_a_warp_exchange_through_shared_memory() {
    let (blocks, threads) = (2u32, 96u32);
    let n = (blocks * threads) as usize;
    let input: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let got = same_under_lane_orders(&THREE_ORDERS, |dev| {
        let din = dev.upload(&input)?;
        let mut out = dev.upload(&vec![f32::NAN; n])?;
        // SAFETY: one element per thread.
        unsafe { k::warp_mirror(dev, cfg(blocks, threads), &din, &mut out)? };
        dev.download(&out)
    })
    .unwrap();
    for (t, v) in got.iter().enumerate() {
        assert_eq!(*v, input[(t & !31) + 31 - (t & 31)], "thread {t}");
    }
}

fn random_halves(r: &mut impl Rng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(r.gen_range(-1.0f32..1.0)))
        .collect()
}

/// |got - want| <= 1e-3 relative to the dot product's own scale, sum |a·b| + |c|.
fn assert_gemm_16(
    got: &[f32],
    a: impl Fn(usize, usize) -> f64,
    b: impl Fn(usize, usize) -> f64,
    c: impl Fn(usize, usize) -> f64,
    d_at: impl Fn(usize, usize) -> usize,
) {
    for m in 0..16 {
        for n in 0..16 {
            let want: f64 = (0..16).map(|k| a(m, k) * b(k, n)).sum::<f64>() + c(m, n);
            let scale: f64 =
                (0..16).map(|k| (a(m, k) * b(k, n)).abs()).sum::<f64>() + c(m, n).abs();
            let err = (got[d_at(m, n)] as f64 - want).abs();
            assert!(
                err <= 1e-3 * scale,
                "D[{m}][{n}] = {} but float64 says {want} (error {err:e}, scale {scale})",
                got[d_at(m, n)]
            );
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn wmma_16x16x16_matches_float64() {
    let mut r = rng(5);
    let a = random_halves(&mut r, 256);
    let b = random_halves(&mut r, 256);
    let c: Vec<f32> = (0..256).map(|_| r.gen_range(-1.0f32..1.0)).collect();
    let got = same_under_lane_orders(&THREE_ORDERS, |dev| {
        let (da, db, dc) = (dev.upload(&a)?, dev.upload(&b)?, dev.upload(&c)?);
        let mut dd = dev.upload(&vec![f32::NAN; 256])?;
        // SAFETY: 16x16 matrices with leading dimension 16.
        unsafe { k::wmma_row_major(dev, cfg(1, 32), &da, &db, &dc, &mut dd)? };
        dev.download(&dd)
    })
    .unwrap();
    let h = |v: &[f16], i: usize| v[i].to_f64();
    assert_gemm_16(
        &got,
        |m, k| h(&a, m * 16 + k),
        |k, n| h(&b, k * 16 + n),
        |m, n| c[m * 16 + n] as f64,
        |m, n| m * 16 + n,
    );

    // Column-major operands in padded storage (leading dimension 24), column-major result.
    let a = random_halves(&mut r, 24 * 16);
    let b = random_halves(&mut r, 24 * 16);
    let got = same_under_lane_orders(&TWO_ORDERS, |dev| {
        let (da, db) = (dev.upload(&a)?, dev.upload(&b)?);
        let mut dd = dev.upload(&vec![f32::NAN; 256])?;
        // SAFETY: A and B are 16 columns of 24, D is 16x16.
        unsafe { k::wmma_col_major(dev, cfg(1, 32), &da, &db, &mut dd)? };
        dev.download(&dd)
    })
    .unwrap();
    assert_gemm_16(
        &got,
        |m, k| h(&a, k * 24 + m),
        |k, n| h(&b, n * 24 + k),
        |_, _| 0.0,
        |m, n| n * 16 + m,
    );
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn dynamic_shared_memory_is_per_block() {
    for threads in [1u32, 33, 256] {
        let blocks = 4u32;
        let n = (blocks * threads) as usize;
        let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let got = same_under_lane_orders(&TWO_ORDERS, |dev| {
            let din = dev.upload(&input)?;
            let mut dout = dev.upload(&vec![f32::NAN; n])?;
            let shape = LaunchConfig {
                shared_bytes: threads * 4,
                ..cfg(blocks, threads)
            };
            // SAFETY: one element per thread; blockDim floats of dynamic shared memory.
            unsafe { k::reverse_in_block(dev, shape, &din, &mut dout)? };
            dev.download(&dout)
        })
        .unwrap();
        for b in 0..blocks as usize {
            for t in 0..threads as usize {
                assert_eq!(
                    got[b * threads as usize + t],
                    input[b * threads as usize + threads as usize - 1 - t]
                );
            }
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn barrier_heavy_launch_gives_exact_results() {
    let (blocks, threads, rounds) = (16u32, 256u32, 4i32);
    let got = same_under_lane_orders(&THREE_ORDERS, |dev| {
        let mut out = dev.upload(&vec![f32::NAN; (blocks * threads) as usize])?;
        // SAFETY: one output per thread.
        unsafe { k::barrier_rounds(dev, cfg(blocks, threads), &mut out, rounds)? };
        dev.download(&out)
    })
    .unwrap();
    for (i, v) in got.iter().enumerate() {
        let tid = i as u32 % threads;
        let neighbour = (tid + 1) % threads;
        let want: f32 = (0..rounds).map(|r| (neighbour as i32 + r) as f32).sum();
        assert_eq!(*v, want, "thread {i}");
    }
}

// ------------------------------------------------------------------ the broken kernels

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_missing_barrier_is_exposed_by_lane_order_and_poison() {
    let run = |dev: &SimtDevice| -> Result<Vec<f32>, BackendError> {
        let mut out = dev.upload(&vec![0.0f32; 256])?;
        // SAFETY: one output per thread.
        unsafe { k::broken_missing_barrier(dev, cfg(2, 128), &mut out)? };
        dev.download(&out)
    };
    let verdict = same_under_lane_orders(&TWO_ORDERS, run);
    assert!(
        matches!(verdict, Err(OrderDependence::Differs { .. })),
        "{verdict:?}"
    );
    // In forward order, thread 0 reads slot[1] before thread 1 ran: poison, not a stale value,
    // also in the second block, which runs on the same worker after the first wrote slot[].
    let one_worker = SimtConfig {
        lane_order: LaneOrder::Forward,
        workers: 1,
        ..Default::default()
    };
    let forward = run(&SimtDevice::with_config(0, one_worker)).unwrap();
    assert!(
        forward[0].is_nan() && forward[128].is_nan(),
        "unwritten shared memory must read as NaN in every block"
    );
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn divergent_barrier_is_an_error_not_a_hang() {
    let (result, took) = finishes_within(HANG, || {
        let dev = SimtDevice::new(0);
        let mut out = dev.upload(&vec![0.0f32; 64]).unwrap();
        // SAFETY: one output per thread.
        unsafe { k::broken_divergent_barrier(&dev, cfg(1, 64), &mut out) }
    });
    let e = emulator_error(result);
    assert_eq!(e.fault, EmulatorFault::BarrierDivergence, "{e}");
    assert_eq!(e.kernel, "broken_divergent_barrier");
    assert!(
        e.site
            .as_deref()
            .is_some_and(|s| s.starts_with("kernels/selftest.cu:")),
        "{e}"
    );
    assert!(e.message.contains("divergent"), "{e}");
    eprintln!("divergent barrier reported in {took:?}: {e}");
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn early_exit_before_a_barrier_is_an_error() {
    let (result, _) = finishes_within(HANG, || {
        let dev = SimtDevice::with_config(
            0,
            SimtConfig {
                lane_order: LaneOrder::Reverse,
                workers: 0,
                ..Default::default()
            },
        );
        let mut out = dev.upload(&[0.0f32; 32]).unwrap();
        // SAFETY: one output per thread.
        unsafe { k::broken_early_exit(&dev, cfg(3, 32), &mut out) }
    });
    let e = emulator_error(result);
    assert_eq!(e.fault, EmulatorFault::BarrierDivergence, "{e}");
    assert!(e.message.contains("exited"), "{e}");
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn out_of_bounds_write_names_the_kernel_block_and_thread() {
    let dev = SimtDevice::new(0);
    let n = 1000u32;
    let mut out = dev.upload(&vec![0.0f32; n as usize]).unwrap();
    // SAFETY: deliberately not: the kernel writes out[n], one past the end, and the guard
    // page after the allocation turns that into an error instead of corruption.
    let e = emulator_error(unsafe { k::broken_off_by_one(&dev, cfg(1, 256), &mut out, n) });
    assert_eq!(e.fault, EmulatorFault::MemoryFault, "{e}");
    assert_eq!(e.kernel, "broken_off_by_one");
    assert_eq!(e.thread, Some([n % 256, 0, 0]), "{e}");
    assert!(
        e.message
            .contains("1 byte(s) past the end of a 4000-byte device allocation"),
        "{e}"
    );
    // The fault stopped the launch cleanly: the device is usable afterwards.
    let mut fine = dev.upload(&vec![0.0f32; 64]).unwrap();
    // SAFETY: one output per thread.
    unsafe { k::barrier_rounds(&dev, cfg(1, 64), &mut fine, 1).unwrap() };
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn warp_misuse_is_reported() {
    let dev = SimtDevice::new(0);
    let mut out = dev.upload(&[0i32; 32]).unwrap();
    // SAFETY: one output per thread.
    let e = emulator_error(unsafe { k::broken_exited_lane(&dev, cfg(1, 32), &mut out) });
    assert_eq!(e.fault, EmulatorFault::WarpMisuse, "{e}");
    assert!(e.message.contains("exited"), "{e}");

    for order in TWO_ORDERS {
        // Forward: the half-mask lanes finish and exit first; reverse: they meet the full-mask
        // group. Either way the diagnosis is the disagreement.
        dev.set_lane_order(order);
        // SAFETY: one output per thread.
        let e = emulator_error(unsafe { k::broken_mask_mismatch(&dev, cfg(1, 32), &mut out) });
        assert_eq!(e.fault, EmulatorFault::WarpMisuse, "{e}");
        assert!(e.message.contains("disagree on the mask"), "{order:?}: {e}");
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn deadlock_is_reported_with_every_waiting_site() {
    let (result, _) = finishes_within(HANG, || {
        let dev = SimtDevice::new(0);
        let mut out = dev.upload(&[0i32; 32]).unwrap();
        // SAFETY: one output per thread.
        unsafe { k::broken_deadlock(&dev, cfg(1, 32), &mut out) }
    });
    let e = emulator_error(result);
    assert_eq!(e.fault, EmulatorFault::Deadlock, "{e}");
    assert!(
        e.message.contains("__syncthreads") && e.message.contains("__shfl_sync"),
        "{e}"
    );
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn an_endless_kernel_times_out_and_the_device_stays_usable() {
    let ((e, after), _) = finishes_within(HANG, || {
        let dev = SimtDevice::with_config(
            0,
            SimtConfig {
                workers: 2,
                launch_timeout: Some(Duration::from_millis(200)),
                ..Default::default()
            },
        );
        let (blocks, threads) = (3u32, 64u32);
        let mut out = dev
            .upload(&vec![0.0f32; (blocks * threads) as usize])
            .unwrap();
        // SAFETY: one output per thread; thread 5 of each block spins until the time limit.
        let e =
            emulator_error(unsafe { k::broken_endless(&dev, cfg(blocks, threads), &mut out, 5) });
        // The same device, right after: a correct kernel runs and gives the right answer.
        let mut fine = dev.upload(&vec![f32::NAN; 128]).unwrap();
        // SAFETY: one output per thread.
        unsafe { k::barrier_rounds(&dev, cfg(2, 64), &mut fine, 3).unwrap() };
        (e, dev.download(&fine).unwrap())
    });
    assert_eq!(e.fault, EmulatorFault::Timeout, "{e}");
    assert_eq!(e.kernel, "broken_endless");
    assert_eq!(e.thread, Some([5, 0, 0]), "{e}");
    let m = &e.message;
    assert!(m.contains("time limit of 200 ms"), "{e}");
    assert!(m.contains("of 3 block(s) finished"), "{e}");
    // The spinning thread, named with the function it was stopped in...
    assert!(
        m.contains("thread (5,0,0) was running in") && m.contains("broken_endless"),
        "{e}"
    );
    // ...and the five threads ahead of it in forward order, waiting at the barrier.
    assert!(
        m.contains("5 wait in __syncthreads at kernels/selftest.cu:"),
        "{e}"
    );
    assert!(
        m.contains(LAUNCH_TIMEOUT_ENV),
        "the message says what to raise: {e}"
    );
    for (i, v) in after.iter().enumerate() {
        let neighbour = (i as u32 % 64 + 1) % 64;
        let want: f32 = (0..3).map(|r| (neighbour as i32 + r) as f32).sum();
        assert_eq!(*v, want, "thread {i} of the launch after the timeout");
    }
    eprintln!("endless kernel reported: {e}");
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_default_launch_time_limit_is_generous() {
    assert!(DEFAULT_LAUNCH_TIMEOUT >= Duration::from_secs(60));
    assert_eq!(
        launch_timeout_from_env_value(None),
        Ok(Some(DEFAULT_LAUNCH_TIMEOUT))
    );
    if std::env::var_os(LAUNCH_TIMEOUT_ENV).is_none() {
        assert_eq!(
            SimtConfig::default().effective_launch_timeout(),
            Ok(Some(DEFAULT_LAUNCH_TIMEOUT))
        );
    }
    // The variable's other readings, and the configuration overriding it.
    assert_eq!(
        launch_timeout_from_env_value(Some("2.5")),
        Ok(Some(Duration::from_millis(2500)))
    );
    assert_eq!(launch_timeout_from_env_value(Some("0")), Ok(None));
    assert_eq!(launch_timeout_from_env_value(Some("1e300")), Ok(None));
    for bad in ["", "ten", "-1", "NaN"] {
        let err = launch_timeout_from_env_value(Some(bad)).unwrap_err();
        assert!(err.contains(LAUNCH_TIMEOUT_ENV), "{bad:?}: {err}");
    }
    let limited = SimtConfig {
        launch_timeout: Some(Duration::from_secs(7)),
        ..Default::default()
    };
    assert_eq!(
        limited.effective_launch_timeout(),
        Ok(Some(Duration::from_secs(7)))
    );
    let unlimited = SimtConfig {
        launch_timeout: Some(Duration::ZERO),
        ..Default::default()
    };
    assert_eq!(unlimited.effective_launch_timeout(), Ok(None));
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn emulated_devices_launch_concurrently_and_read_each_other() {
    // Four "GPUs" on four threads, as the collectives will use them; each reduces its own
    // data, then one kernel reads a peer's buffer directly (P2P).
    let handles: Vec<_> = (0..4)
        .map(|d| {
            std::thread::spawn(move || {
                let dev = SimtDevice::new(d);
                let input: Vec<f32> = (0..4096).map(|i| ((i + d) % 7) as f32).collect();
                let din = dev.upload(&input).unwrap();
                let mut out = dev.upload(&[f32::NAN; 16]).unwrap();
                for _ in 0..20 {
                    // SAFETY: reads in[0, 4096), writes out[0, 16).
                    unsafe { k::block_sum(&dev, cfg(16, 256), &din, &mut out, 4096).unwrap() };
                }
                let got: f64 = dev.download(&out).unwrap().iter().map(|&v| v as f64).sum();
                assert_eq!(
                    got,
                    input.iter().map(|&v| v as f64).sum::<f64>(),
                    "device {d}"
                );
                din
            })
        })
        .collect();
    let buffers: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let reader = SimtDevice::new(9);
    let mut sum = reader.upload(&vec![f32::NAN; 4096]).unwrap();
    // SAFETY: both peer buffers hold 4096 elements and live until after the launch.
    unsafe {
        k::vector_add(
            &reader,
            cfg(8, 128),
            &buffers[1],
            &buffers[2],
            &mut sum,
            4096,
        )
        .unwrap()
    };
    let got = reader.download(&sum).unwrap();
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, &v)| v == (((i + 1) % 7) + ((i + 2) % 7)) as f32));
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn launch_bounds_refuse_bigger_blocks_before_the_kernel_runs() {
    common::launch_bounds_are_enforced(&SimtDevice::new(0));
}
