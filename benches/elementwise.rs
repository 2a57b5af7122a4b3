//! Costs of the kernel pipeline that can be measured on any machine, plus GPU bandwidth
//! where a GPU exists.
//!
//! * `nvrtc/<module>/<arch>`: the one-time cost of compiling a module at run time, paid on
//!   first use when no prebuilt fatbin fits (needs libnvrtc.so.13 on the library path).
//! * `cuda/axpy/<n>`: device throughput of `axpy_f32` (12 bytes per element), reported as
//!   bytes/s by criterion, to set against the GPU's DRAM bandwidth (needs a GPU).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nanoddp::backend::cuda::CudaDevice;
use nanoddp::backend::nvrtc::{self, Output};
use nanoddp::backend::{Backend, Memory};
use nanoddp::kernels::MODULES;

fn nvrtc_compile(c: &mut Criterion) {
    if !nvrtc::is_available() {
        eprintln!("nvrtc benches skipped: libnvrtc.so.13 not found");
        return;
    }
    let mut group = c.benchmark_group("nvrtc");
    group.sample_size(10);
    for m in MODULES {
        for (cc, output) in [
            ((8, 0), Output::Cubin),
            ((9, 0), Output::Cubin),
            ((7, 5), Output::Ptx),
        ] {
            let label = match output {
                Output::Cubin => format!("sm_{}{}", cc.0, cc.1),
                Output::Ptx => format!("compute_{}{}", cc.0, cc.1),
            };
            group.bench_function(BenchmarkId::new(m.name, label), |b| {
                b.iter(|| nvrtc::compile(m, cc, output).expect("compiles"))
            });
        }
    }
    group.finish();
}

fn cuda_axpy(c: &mut Criterion) {
    let dev = match CudaDevice::new(0) {
        Ok(dev) => dev,
        Err(e) => {
            eprintln!("cuda benches skipped: {e}");
            return;
        }
    };
    let mut group = c.benchmark_group("cuda/axpy");
    for n in [1usize << 16, 1 << 20, 1 << 24, 1 << 26] {
        let x = dev.upload(&vec![1.0f32; n]).expect("upload");
        let mut y = dev.upload(&vec![2.0f32; n]).expect("upload");
        group.throughput(Throughput::Bytes(12 * n as u64));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                dev.axpy(1e-3, &x, &mut y).expect("launch");
                dev.synchronize().expect("sync");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, nvrtc_compile, cuda_axpy);
criterion_main!(benches);
