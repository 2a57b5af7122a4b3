//! The SIMT emulator's cost: how long the CPU takes to run a CUDA launch.
//!
//! * `simt/barriers/256x256x8`: 256 blocks of 256 threads, each thread passing 8
//!   `__syncthreads` (the emulator's worst case: every barrier switches every fiber out
//!   and back in).
//! * `simt/no_barriers/256x256`: the same grid with no barrier (`vector_add`, one element
//!   per thread): the plain-loop path, two switches per thread.
//! * `simt/warp_shuffles/256x256`: 10 shuffles per thread (`warp_sums`).
//!
//! Emulator timings say nothing about GPU speed; they bound how long kernel tests take.

use criterion::{criterion_group, criterion_main, Criterion};
use nanoddp::backend::simt::SimtDevice;
use nanoddp::backend::{LaunchConfig, Memory};
use nanoddp::kernels::selftest as k;

const GRID: LaunchConfig = LaunchConfig {
    grid: (256, 1, 1),
    block: (256, 1, 1),
    shared_bytes: 0,
};

fn emulator(c: &mut Criterion) {
    let dev = SimtDevice::new(0);
    let n = 256 * 256;
    let a = dev.upload(&vec![1.0f32; n]).expect("upload");
    let b = dev.upload(&vec![2.0f32; n]).expect("upload");
    let mut out = dev.upload(&vec![0.0f32; n]).expect("upload");
    let mut per_warp = dev.upload(&vec![0.0f32; n / 32]).expect("upload");
    let mut group = c.benchmark_group("simt");
    group.sample_size(10);
    group.bench_function("barriers/256x256x8", |bench| {
        // SAFETY: one output per thread of the grid.
        bench.iter(|| unsafe { k::barrier_rounds(&dev, GRID, &mut out, 4).expect("launch") })
    });
    group.bench_function("no_barriers/256x256", |bench| {
        // SAFETY: all buffers hold n = one element per thread.
        bench.iter(|| unsafe {
            k::vector_add(&dev, GRID, &a, &b, &mut out, n as u64).expect("launch")
        })
    });
    group.bench_function("warp_shuffles/256x256", |bench| {
        // SAFETY: one input and one xor output per thread, one down output per warp.
        bench.iter(|| unsafe {
            k::warp_sums(&dev, GRID, &a, &mut per_warp, &mut out).expect("launch")
        })
    });
    group.finish();
}

criterion_group!(benches, emulator);
criterion_main!(benches);
