//! The CPU stand-in for the CUDA driver (`cuda-standin/`) against its own rules, each
//! triggered on purpose: lazy asynchronous streams, peer access checked per allocation kind,
//! sticky errors, cross-stream hazards, launch limits, the watchdog; and the CUDA backend's
//! fixes for what the stand-in exposed (pool access for peers, buffers finished before
//! peers read them, downloads that wait, the dynamic shared memory opt-in, modules loaded
//! once per GPU).
//!
//! Errors that kill a context are sticky for the whole process, as on a GPU, so each test
//! that provokes one uses GPUs no other test in this file touches (the stand-in shows 8).
//! On a real GPU these tests do not apply (they check the stand-in's diagnostics) and say so.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaContext, CudaStream, DevicePtrMut, DriverError, PushKernelArg};
use cudarc::nvrtc::Ptx;
use nanoddp::backend::cuda::{self, CudaDevice};
use nanoddp::backend::{BackendError, DeviceBuffer, KernelArg, KernelDevice, LaunchConfig, Memory};
use nanoddp::comm::communicator::{communicator, CommConfig, ReduceOp};
use nanoddp::comm::schedule::Algorithm;
use nanoddp::kernels::{elementwise, selftest, KernelModule};

/// True when the tests run on the stand-in; false (with a note) on a real GPU.
fn on_standin() -> bool {
    let driver = common::cuda_driver();
    if cuda::is_standin() {
        return true;
    }
    eprintln!("not applicable on {driver}: this test checks the CPU stand-in's own rules");
    false
}

/// GPU `ordinal` of the stand-in, for a test of the stand-in's own rules; `None` (with a
/// note) on a real GPU.
fn standin_gpu(ordinal: usize) -> Option<CudaDevice> {
    on_standin().then(|| common::cuda_device(ordinal))
}

/// The stand-in's counters for `gpu`: [module loads, launches, hazards, failed kernels].
fn counters(gpu: usize) -> [u64; 4] {
    let mut out = [0u64; 4];
    // SAFETY: the stand-in is loaded (on_standin); the function writes at most 4 values.
    unsafe {
        let f = sys::culib()
            .get::<unsafe extern "C" fn(i32, *mut u64, i32) -> i32>(b"nanoddpStandinCounters\0")
            .expect("the stand-in exports its counters");
        assert_eq!(f(gpu as i32, out.as_mut_ptr(), 4), 4);
    }
    out
}

fn set_kernel_timeout(gpu: usize, seconds: f64) {
    // SAFETY: the stand-in is loaded; plain values.
    unsafe {
        let f = sys::culib()
            .get::<unsafe extern "C" fn(i32, f64) -> i32>(b"nanoddpStandinSetKernelTimeout\0")
            .expect("the stand-in exports the watchdog setting");
        assert_eq!(f(gpu as i32, seconds), 0);
    }
}

fn driver_code(e: &BackendError) -> sys::CUresult {
    match e {
        BackendError::Driver {
            source: DriverError(code),
            ..
        } => *code,
        other => panic!("expected a driver error, got {other}"),
    }
}

/// y = 2·x + y on `dev`, with x and y given as raw addresses (which may be a peer's).
fn axpy_raw(dev: &CudaDevice, x: u64, y: u64, n: usize) -> Result<(), BackendError> {
    let args = [
        KernelArg::Ptr {
            addr: x,
            elem: nanoddp::kernels::Scalar::F32,
            mutable: false,
        },
        KernelArg::Ptr {
            addr: y,
            elem: nanoddp::kernels::Scalar::F32,
            mutable: true,
        },
        KernelArg::F32(2.0),
        KernelArg::U64(n as u64),
    ];
    // SAFETY: x and y address n floats each (the tests allocate them so); the access rules
    // the stand-in checks are the point of the test.
    unsafe { dev.launch(&elementwise::AXPY_F32, LaunchConfig::flat(n), &args) }
}

fn raw_stream(gpu: usize) -> (Arc<CudaContext>, Arc<CudaStream>) {
    let ctx = CudaContext::new(gpu).expect("context");
    // SAFETY: before any allocation on this handle; the tests order their own work.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().expect("stream");
    (ctx, stream)
}

#[test]
fn streams_are_lazy_and_a_pageable_download_is_not_there_until_synchronized() {
    if !on_standin() {
        return;
    }
    let (_ctx, stream) = raw_stream(0);
    let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let dev = stream.clone_htod(&data).expect("upload");
    let mut host = vec![0.0f32; 1000];
    stream.memcpy_dtoh(&dev, &mut host).expect("queued");
    // cudarc does not wait for a copy into pageable memory; no driver promises it is done.
    assert!(
        host.iter().all(|v| v.is_nan()),
        "the copy must not have happened yet"
    );
    stream.synchronize().expect("sync");
    assert_eq!(host, data);
}

#[test]
fn a_copy_from_pinned_memory_reads_it_when_the_stream_gets_there_and_pinning_is_checked() {
    if !on_standin() {
        return;
    }
    let (ctx, stream) = raw_stream(1);
    ctx.bind_to_thread().expect("bind");
    let n = 256usize;
    let bytes = n * 4;
    let mut dev = stream.alloc_zeros::<f32>(n).expect("alloc");
    // A download into pageable memory is there once the stream is synchronized.
    let read = |d: &cudarc::driver::CudaSlice<f32>| {
        let mut out = vec![0.0f32; n];
        stream.memcpy_dtoh(d, &mut out).expect("queued");
        stream.synchronize().expect("sync");
        out
    };
    let raw_stream = stream.cu_stream();
    // Pinned (cuMemHostAlloc): the copy is a DMA that reads the buffer when it runs, so what
    // the host writes after enqueuing it, before the stream runs (streams are lazy), arrives.
    let mut pinned: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the driver allocates `bytes` bytes.
    unsafe { sys::cuMemHostAlloc(&mut pinned, bytes, 0) }
        .result()
        .expect("cuMemHostAlloc");
    // SAFETY: `pinned` holds `bytes` bytes, f32-aligned (page-aligned).
    let host = unsafe { std::slice::from_raw_parts_mut(pinned.cast::<f32>(), n) };
    host.fill(1.0);
    {
        let (dptr, _guard) = dev.device_ptr_mut(&stream);
        // SAFETY: `dptr` holds `bytes` bytes; `pinned` stays allocated until after the sync.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dptr, pinned, bytes, raw_stream) }
            .result()
            .expect("queued");
    }
    host.fill(2.0);
    assert_eq!(
        read(&dev),
        vec![2.0; n],
        "a pinned source is read when the copy runs"
    );
    // Pageable: staged at the call, so the later write does not arrive.
    let mut pageable = vec![3.0f32; n];
    stream.memcpy_htod(&pageable, &mut dev).expect("queued");
    pageable.fill(4.0);
    assert_eq!(
        read(&dev),
        vec![3.0; n],
        "a pageable source is staged at the call"
    );
    // The driver's rules: cuMemFreeHost takes only what it allocated; a range registers once;
    // unregistering what was never registered fails.
    let code = |r: sys::CUresult| r;
    let p = pageable.as_mut_ptr().cast::<std::ffi::c_void>();
    // SAFETY: every pointer is live; the calls only record or check ranges.
    unsafe {
        assert_eq!(
            code(sys::cuMemFreeHost(p)),
            sys::CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            code(sys::cuMemHostRegister_v2(p, bytes, 0)),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            code(sys::cuMemHostRegister_v2(
                p.cast::<u8>().add(4).cast(),
                8,
                0
            )),
            sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        assert_eq!(
            code(sys::cuMemHostUnregister(p)),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            code(sys::cuMemHostUnregister(p)),
            sys::CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        );
        assert_eq!(
            code(sys::cuMemFreeHost(pinned)),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            code(sys::cuMemFreeHost(pinned)),
            sys::CUresult::CUDA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn download_waits_for_the_copy() {
    // The backend's download must synchronize (item 4): otherwise this reads the poison.
    let Some(dev) = standin_gpu(0) else {
        return;
    };
    let data: Vec<f32> = (0..4097).map(|i| i as f32 * 0.5).collect();
    let buf = dev.upload(&data).expect("upload");
    assert_eq!(dev.download(&buf).expect("download"), data);
}

#[test]
fn pool_memory_needs_pool_access_not_just_context_peer_access() {
    if !on_standin() {
        return;
    }
    // GPU 2 reads GPU 3's pool memory with only cuCtxEnablePeerAccess: what the backend did
    // before (item 1). Sticky for GPU 2.
    let (a, b) = (common::cuda_device(2), common::cuda_device(3));
    let x = b.upload(&[1.0f32; 300]).expect("x on GPU 3");
    b.synchronize().expect("x is there");
    let y = a.upload(&[0.0f32; 300]).expect("y on GPU 2");
    let (ctx_a, ctx_b) = (CudaContext::new(2).unwrap(), CudaContext::new(3).unwrap());
    ctx_a.bind_to_thread().unwrap();
    // SAFETY: both contexts are live; enables GPU 2 → GPU 3 peer access for cuMemAlloc memory.
    unsafe { sys::cuCtxEnablePeerAccess(ctx_b.cu_ctx(), 0) }
        .result()
        .expect("peer access");
    axpy_raw(&a, x.device_addr(), y.device_addr(), 300).expect("queued");
    let err = a
        .synchronize()
        .expect_err("GPU 2 may not read GPU 3's pool memory");
    assert_eq!(
        driver_code(&err),
        sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("axpy_f32") && text.contains("cuMemPoolSetAccess") && text.contains("GPU 3"),
        "the diagnostic names the kernel, the owner and the missing grant: {text}"
    );
    // Sticky: GPU 2 is unusable from now on; GPU 3 is not.
    assert_eq!(
        driver_code(
            &a.upload(&[1.0f32])
                .and_then(|b| a.download(&b))
                .unwrap_err()
        ),
        sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
    );
    let z = b.upload(&[5.0f32; 3]).expect("GPU 3 still works");
    assert_eq!(b.download(&z).unwrap(), [5.0; 3]);
}

#[test]
fn enable_peer_access_covers_pool_and_plain_memory() {
    if !on_standin() {
        return;
    }
    let (a, b) = (common::cuda_device(0), common::cuda_device(1));
    a.enable_peer_access(&b).expect("peer access");
    // Pool memory (what cudarc allocates): read through the pool grant.
    let x = b.upload(&[1.5f32; 700]).expect("x on GPU 1");
    b.synchronize().unwrap();
    let y = a.upload(&[1.0f32; 700]).expect("y on GPU 0");
    axpy_raw(&a, x.device_addr(), y.device_addr(), 700).expect("launch");
    assert_eq!(a.download(&y).unwrap(), vec![4.0f32; 700]);
    // cuMemAlloc memory: read through the context's peer access.
    let ctx_b = CudaContext::new(1).unwrap();
    ctx_b.bind_to_thread().unwrap();
    // SAFETY: a fresh 4 KiB cuMemAlloc allocation on GPU 1, freed below.
    let plain = unsafe { cudarc::driver::result::malloc_sync(4096) }.expect("cuMemAlloc");
    let ones = [1.0f32; 1024];
    // SAFETY: 4096 bytes to a 4096-byte allocation.
    unsafe { cudarc::driver::result::memcpy_htod_sync(plain, &ones) }.expect("copy");
    let y2 = a.upload(&[0.0f32; 1024]).unwrap();
    axpy_raw(&a, plain, y2.device_addr(), 1024).expect("launch");
    assert_eq!(a.download(&y2).unwrap(), vec![2.0f32; 1024]);
    // SAFETY: allocated above, no work on it remains (downloaded).
    unsafe { cudarc::driver::result::free_sync(plain) }.expect("free");
}

#[test]
fn plain_memory_without_context_peer_access_faults() {
    // GPU 4 reads GPU 5's cuMemAlloc memory with no peer access at all. Sticky for GPU 4.
    let Some(a) = standin_gpu(4) else {
        return;
    };
    let ctx_b = CudaContext::new(5).unwrap();
    ctx_b.bind_to_thread().unwrap();
    // SAFETY: a fresh allocation of 4 KiB on GPU 5.
    let plain = unsafe { cudarc::driver::result::malloc_sync(4096) }.expect("cuMemAlloc");
    let y = a.upload(&[0.0f32; 1024]).unwrap();
    axpy_raw(&a, plain, y.device_addr(), 1024).expect("queued");
    let err = a.download(&y).expect_err("no peer access");
    assert_eq!(driver_code(&err), sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    assert!(err.to_string().contains("cuCtxEnablePeerAccess"), "{err}");
}

#[test]
fn unordered_streams_touching_one_buffer_are_a_hazard() {
    // GPU 6: one handle writes y, a fork (its own queue) reads it. Ordered by a fence: fine.
    let Some(a) = standin_gpu(6) else {
        return;
    };
    let b = a.fork().expect("fork");
    let x = a.upload(&[1.0f32; 512]).unwrap();
    let mut y = a.upload(&[0.0f32; 512]).unwrap();
    let mut z = b.upload(&[0.0f32; 512]).unwrap();
    b.synchronize().unwrap();
    // SAFETY: x, y, z hold 512 floats each.
    unsafe { elementwise::axpy_f32(&a, LaunchConfig::flat(512), &x, &mut y, 1.0, 512) }.unwrap();
    a.fence().unwrap().wait().unwrap();
    unsafe { elementwise::axpy_f32(&b, LaunchConfig::flat(512), &y, &mut z, 1.0, 512) }.unwrap();
    assert_eq!(b.download(&z).unwrap(), vec![1.0f32; 512]);
    let hazards = counters(6)[2];
    // Unordered: a writes y again while b reads it. Sticky for GPU 6.
    unsafe { elementwise::axpy_f32(&a, LaunchConfig::flat(512), &x, &mut y, 1.0, 512) }.unwrap();
    unsafe { elementwise::axpy_f32(&b, LaunchConfig::flat(512), &y, &mut z, 1.0, 512) }.unwrap();
    let err = b.synchronize().expect_err("a hazard");
    assert_eq!(driver_code(&err), sys::CUresult::CUDA_ERROR_LAUNCH_FAILED);
    let text = err.to_string();
    assert!(
        text.contains("cross-stream hazard") && text.matches("axpy_f32").count() >= 2,
        "names both kernels: {text}"
    );
    assert!(counters(6)[2] > hazards);
}

/// The fatbin (or NVRTC) image of a module, loaded through cudarc directly: the stand-in's
/// own launch checks, without the backend's in front of them.
fn raw_function(
    ctx: &Arc<CudaContext>,
    module: &str,
    kernel: &str,
) -> cudarc::driver::CudaFunction {
    let m = KernelModule::find(module).expect("module");
    let image = match m.fatbin {
        Some(fatbin) => fatbin.to_vec(),
        None => {
            format!("//\n.version 9.0\n.target sm_90\n.visible .entry {kernel}(\n").into_bytes()
        }
    };
    let mut image = image;
    image.push(0);
    ctx.load_module(Ptx::from_binary(image))
        .expect("module")
        .load_function(kernel)
        .expect("function")
}

#[test]
fn launches_are_checked_against_the_limits() {
    if !on_standin() {
        return;
    }
    let (ctx, stream) = raw_stream(1);
    let out = stream.alloc_zeros::<f32>(1 << 16).unwrap();
    let input = stream.alloc_zeros::<f32>(1 << 16).unwrap();
    let reverse = raw_function(&ctx, "selftest", "reverse_in_block");
    let launch = |block: u32, grid: (u32, u32, u32), shared: u32| {
        let mut b = stream.launch_builder(&reverse);
        b.arg(&input).arg(&out);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: shared,
        };
        // SAFETY: blocks of `block` threads over 65536 floats, grid.x * block <= 65536.
        unsafe { b.launch(cfg) }.map(|_| ())
    };
    let code = |r: Result<(), DriverError>| r.expect_err("rejected").0;
    assert_eq!(
        code(launch(2048, (1, 1, 1), 0)),
        sys::CUresult::CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        code(launch(64, (1, 65536, 1), 0)),
        sys::CUresult::CUDA_ERROR_INVALID_VALUE
    );
    // Dynamic shared memory above 48 KiB needs the kernel's opt-in (227 KiB at most).
    assert_eq!(
        code(launch(64, (1, 1, 1), 64 << 10)),
        sys::CUresult::CUDA_ERROR_INVALID_VALUE
    );
    reverse
        .set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            64 << 10,
        )
        .unwrap();
    launch(64, (1, 1, 1), 64 << 10).expect("allowed after the opt-in");
    assert!(reverse
        .set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            228 << 10,
        )
        .is_err());
    // __launch_bounds__(256) kernels refuse bigger blocks.
    let conv = raw_function(&ctx, "conv", "conv2d_forward_f32");
    let sig = nanoddp::kernels::conv::CONV2D_FORWARD_F32.max_threads;
    assert_eq!(sig, Some(256));
    let mut b = stream.launch_builder(&conv);
    let zero = 0i32;
    for _ in 0..3 {
        b.arg(&input);
    }
    b.arg(&out);
    for _ in 0..(nanoddp::kernels::conv::CONV2D_FORWARD_F32.params.len() - 4) {
        b.arg(&zero);
    }
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (512, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: rejected before it runs.
    let r = unsafe { b.launch(cfg) };
    assert_eq!(
        code(r.map(|_| ())),
        sys::CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    );
    // A function of GPU 1's context on a stream of GPU 0's: not allowed.
    let (_ctx0, stream0) = raw_stream(0);
    ctx.bind_to_thread().unwrap();
    let mut b = stream0.launch_builder(&reverse);
    b.arg(&input).arg(&out);
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: rejected before it runs.
    let r = unsafe { b.launch(cfg) };
    assert!(r.is_err(), "a launch across contexts must fail");
    // None of these is sticky: GPU 1 still computes.
    stream.synchronize().expect("not sticky");
}

#[test]
fn the_backend_opts_in_to_large_dynamic_shared_memory() {
    // Item 5: the backend raises the kernel's limit when a launch asks for more than 48 KiB.
    let Some(dev) = standin_gpu(1) else {
        return;
    };
    let input: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let x = dev.upload(&input).unwrap();
    let mut y = dev.alloc_zeros::<f32>(256).unwrap();
    let cfg = LaunchConfig {
        grid: (1, 1, 1),
        block: (256, 1, 1),
        shared_bytes: 96 << 10,
    };
    // SAFETY: one block of 256 threads over 256 floats.
    unsafe { selftest::reverse_in_block(&dev, cfg, &x, &mut y) }.expect("launch");
    let mut want = input.clone();
    want.reverse();
    assert_eq!(dev.download(&y).unwrap(), want);
    // And __launch_bounds__ is enforced before the driver sees the launch.
    let bad = LaunchConfig {
        grid: (1, 1, 1),
        block: (512, 1, 1),
        shared_bytes: 0,
    };
    let args = vec![KernelArg::I32(0); nanoddp::kernels::conv::CONV2D_FORWARD_F32.params.len()];
    // SAFETY: rejected by the check before any launch.
    let err = unsafe { dev.launch(&nanoddp::kernels::conv::CONV2D_FORWARD_F32, bad, &args) };
    assert!(
        matches!(err, Err(BackendError::BadLaunch { .. })),
        "{err:?}"
    );
}

#[test]
fn launch_bounds_refuse_bigger_blocks_before_the_driver_sees_them() {
    // The backend's own check, on the stand-in or a GPU alike.
    common::launch_bounds_are_enforced(&common::cuda_device(2));
}

#[test]
fn modules_load_once_per_gpu_whatever_the_handles() {
    // Item 6: GPU 3's module loads, before and after clones and forks launch kernels.
    let Some(dev) = standin_gpu(3) else {
        return;
    };
    let x = dev.upload(&[1.0f32; 64]).unwrap();
    let mut y = dev.alloc_zeros::<f32>(64).unwrap();
    // SAFETY: 64 floats each.
    unsafe { elementwise::axpy_f32(&dev, LaunchConfig::flat(64), &x, &mut y, 1.0, 64) }.unwrap();
    dev.synchronize().unwrap();
    let loads = counters(3)[0];
    for handle in [
        dev.clone(),
        dev.fork().unwrap(),
        dev.fork().unwrap().clone(),
    ] {
        let mut z = handle.alloc_zeros::<f32>(64).unwrap();
        handle.synchronize().unwrap();
        unsafe { elementwise::axpy_f32(&handle, LaunchConfig::flat(64), &x, &mut z, 1.0, 64) }
            .unwrap();
        assert_eq!(handle.download(&z).unwrap(), vec![1.0f32; 64]);
    }
    assert_eq!(counters(3)[0], loads, "no handle may load the module again");
}

#[test]
fn a_collective_never_reads_buffers_before_they_are_finished() {
    if !on_standin() {
        return;
    }
    // Item 2: each rank uploads (queued, not yet done on the lazy stand-in) and calls
    // the collective at once; the collective must finish the upload before peers read it.
    let devices: Vec<CudaDevice> = (0..2).map(common::cuda_device).collect();
    let ranks = communicator(devices, CommConfig::default()).expect("communicator");
    std::thread::scope(|s| {
        for mut rank in ranks {
            s.spawn(move || {
                let dev = rank.device().clone();
                let n = 1 << 12;
                let mine: Vec<f32> = (0..n)
                    .map(|i| (i % 7) as f32 + rank.rank() as f32)
                    .collect();
                let mut x = dev.upload(&mine).unwrap();
                rank.all_reduce(&mut x, ReduceOp::Sum, Some(Algorithm::Ring))
                    .expect("allreduce");
                let got = dev.download(&x).unwrap();
                let want: Vec<f32> = (0..n).map(|i| 2.0 * (i % 7) as f32 + 1.0).collect();
                assert_eq!(got, want);
            });
        }
    });
}

#[test]
fn an_endless_kernel_times_out_with_where_its_threads_are() {
    // GPU 7: a 0.5 s watchdog. Sticky for GPU 7 (a timed-out kernel kills its context).
    let Some(dev) = standin_gpu(7) else {
        return;
    };
    set_kernel_timeout(7, 0.5);
    let mut out = dev.alloc_zeros::<f32>(256).unwrap();
    let cfg = LaunchConfig {
        grid: (2, 1, 1),
        block: (64, 1, 1),
        shared_bytes: 0,
    };
    let start = Instant::now();
    // SAFETY: 2 blocks of 64 threads over 256 floats; the kernel never finishes on purpose.
    unsafe { selftest::broken_endless(&dev, cfg, &mut out, 5) }.expect("queued");
    let err = dev.synchronize().expect_err("the watchdog stops it");
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_eq!(driver_code(&err), sys::CUresult::CUDA_ERROR_LAUNCH_TIMEOUT);
    assert!(err.to_string().contains("broken_endless"), "{err}");
}

#[test]
fn an_old_driver_is_named_before_anything_runs() {
    if !on_standin() {
        return;
    }
    // Item 7: the kernels need a CUDA 13.0 (R580+) driver; say so up front, not at the first
    // module load. The command line on the stand-in, told to report CUDA 12.8.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nanoddp"))
        .args([
            "train",
            "--backend",
            "cuda",
            "--devices",
            "1",
            "--max-steps",
            "1",
        ])
        .args([
            "--data",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/fashion-mnist-subset"
            ),
        ])
        .env("LD_LIBRARY_PATH", cuda::STANDIN_DIR)
        .env("NANODDP_STANDIN_DRIVER_VERSION", "12080")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("CUDA 12.8") && stderr.contains("580"),
        "names the driver's version and the one needed: {stderr}"
    );
}
