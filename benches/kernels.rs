//! The CPU backend at LeNet's shapes (batch 256) and a 1024³ GEMM, as criterion measures
//! them; `nanoddp bench kernels` prints the same operations as a GFLOP/s table next to the
//! machine's measured peak. Throughput is set to the FLOP count, so criterion's
//! "Gelem/s" reads as GFLOP/s.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::{Backend, Conv2dShape, Epilogue, GemmShape, Memory};

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn gemm(c: &mut Criterion) {
    let dev = CpuDevice::new();
    let mut group = c.benchmark_group("cpu/gemm");
    group.sample_size(10);
    let shapes = [
        ("1024", GemmShape::new(1024, 1024, 1024)),
        (
            "fc1_forward",
            GemmShape {
                m: 256,
                n: 120,
                k: 256,
                trans_a: false,
                trans_b: true,
            },
        ),
        (
            "fc1_weight_grad",
            GemmShape {
                m: 120,
                n: 256,
                k: 256,
                trans_a: true,
                trans_b: false,
            },
        ),
    ];
    for (name, s) in shapes {
        let a = dev.upload(&values(s.m * s.k)).expect("upload");
        let b = dev.upload(&values(s.k * s.n)).expect("upload");
        let mut out = dev.alloc_zeros::<f32>(s.m * s.n).expect("alloc");
        group.throughput(Throughput::Elements(s.flops() as u64));
        group.bench_function(BenchmarkId::from_parameter(name), |bench| {
            bench.iter(|| {
                dev.gemm(&s, &a, &b, None, &mut out, Epilogue::default())
                    .expect("gemm")
            })
        });
    }
    group.finish();
}

fn conv(c: &mut Criterion) {
    let dev = CpuDevice::new();
    let mut group = c.benchmark_group("cpu/conv");
    group.sample_size(10);
    let shapes = [
        (
            "conv1",
            Conv2dShape {
                batch: 256,
                in_c: 1,
                in_h: 28,
                in_w: 28,
                out_c: 6,
                k_h: 5,
                k_w: 5,
                stride: 1,
                pad: 0,
            },
        ),
        (
            "conv2",
            Conv2dShape {
                batch: 256,
                in_c: 6,
                in_h: 12,
                in_w: 12,
                out_c: 16,
                k_h: 5,
                k_w: 5,
                stride: 1,
                pad: 0,
            },
        ),
    ];
    for (name, s) in shapes {
        let (xs, ws, ys) = s.sizes();
        let (x, w, dy) = (
            dev.upload(&values(xs)).expect("x"),
            dev.upload(&values(ws)).expect("w"),
            dev.upload(&values(ys)).expect("dy"),
        );
        let mut y = dev.alloc_zeros::<f32>(ys).expect("y");
        let mut dx = dev.alloc_zeros::<f32>(xs).expect("dx");
        let mut dw = dev.alloc_zeros::<f32>(ws).expect("dw");
        group.throughput(Throughput::Elements(s.flops() as u64));
        group.bench_function(BenchmarkId::new(name, "forward"), |b| {
            b.iter(|| {
                dev.conv2d_forward(&s, &x, &w, None, &mut y, true)
                    .expect("forward")
            })
        });
        group.bench_function(BenchmarkId::new(name, "backward_input"), |b| {
            b.iter(|| {
                dev.conv2d_backward_input(&s, &dy, &w, &mut dx)
                    .expect("backward input")
            })
        });
        group.bench_function(BenchmarkId::new(name, "backward_filter"), |b| {
            b.iter(|| {
                dev.conv2d_backward_filter(&s, &x, &dy, &mut dw)
                    .expect("backward filter")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, gemm, conv);
criterion_main!(benches);
