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
use nanoddp::backend::nvrtc::{self, Output};
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn kernels_store_into_mapped_pinned_memory_at_its_device_address_and_only_there() {
    // What a step's record rides on (Memory::alloc_staging): cuMemHostAlloc memory is mapped,
    // cuMemHostGetDevicePointer gives where kernels see it, a kernel's stores are there once
    // its stream is done and touch nothing else; memory that is not mapped has no device
    // address.
    let Some(dev) = standin_gpu(1) else {
        return;
    };
    let n = 300usize;
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; 4 more floats past `n` stay untouched.
    unsafe { sys::cuMemHostAlloc(&mut p, (n + 4) * 4, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
        .result()
        .expect("cuMemHostAlloc");
    // SAFETY: n + 4 floats of live pinned memory, leaked (the process ends with the tests).
    let host = unsafe { std::slice::from_raw_parts_mut(p.cast::<f32>(), n + 4) };
    host.fill(1.0);
    let mut at: sys::CUdeviceptr = 0;
    // SAFETY: valid pointers.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut at, p, 0) }
        .result()
        .expect("a device address");
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = dev.upload(&x).unwrap();
    axpy_raw(&dev, x.device_addr(), at, n).expect("queued");
    dev.synchronize().expect("the kernel ran");
    for (i, v) in host.iter().enumerate() {
        let want = if i < n { 2.0 * i as f32 + 1.0 } else { 1.0 };
        assert_eq!(*v, want, "float {i}");
    }
    // No device address: pageable memory, memory registered without DEVICEMAP, a flag.
    let mut pageable = vec![0u8; 4096];
    let q = pageable.as_mut_ptr().cast::<std::ffi::c_void>();
    let mut none: sys::CUdeviceptr = 0;
    // SAFETY: live pointers; the calls only look ranges up.
    unsafe {
        let invalid = sys::CUresult::CUDA_ERROR_INVALID_VALUE;
        assert_eq!(sys::cuMemHostGetDevicePointer_v2(&mut none, q, 0), invalid);
        assert_eq!(
            sys::cuMemHostRegister_v2(q, 4096, 0),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(sys::cuMemHostGetDevicePointer_v2(&mut none, q, 0), invalid);
        assert_eq!(sys::cuMemHostUnregister(q), sys::CUresult::CUDA_SUCCESS);
        let mapped = sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        assert_eq!(
            sys::cuMemHostRegister_v2(q, 4096, mapped),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuMemHostGetDevicePointer_v2(&mut none, q.cast::<u8>().add(8).cast(), 0),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            none,
            q as u64 + 8,
            "unified addressing: the host's own address"
        );
        assert_eq!(sys::cuMemHostGetDevicePointer_v2(&mut none, q, 1), invalid);
        assert_eq!(sys::cuMemHostUnregister(q), sys::CUresult::CUDA_SUCCESS);
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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

/// The shipped compute_90 PTX of a module (what the stand-in's H100-like GPUs take), loaded
/// through cudarc directly: the stand-in's own launch checks, without the backend's in front
/// of them.
fn raw_function(
    ctx: &Arc<CudaContext>,
    module: &str,
    kernel: &str,
) -> cudarc::driver::CudaFunction {
    let m = KernelModule::find(module).expect("module");
    let ptx = m.ptx_for((9, 0)).expect("shipped compute_90 PTX");
    ctx.load_module(Ptx::from_src(ptx.text))
        .expect("module")
        .load_function(kernel)
        .expect("function")
}

/// Every kind of image the CUDA backend may load runs the same kernel on the stand-in: the
/// shipped PTX of each architecture, the fatbin (a build with nvcc), and NVRTC's cubin and
/// PTX (where NVRTC is installed, as in CI's nvcc step, `NANODDP_EXPECT_NVRTC=1`). The PTX
/// executor refuses the cubin, as a real driver refuses machine code for another GPU.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn every_kind_of_kernel_image_runs_on_the_standin() {
    if !on_standin() {
        return;
    }
    let m = KernelModule::find("elementwise").expect("module");
    let with_nul = |bytes: &[u8]| [bytes, &[0]].concat();
    let mut images: Vec<(String, Vec<u8>)> = m
        .ptx
        .iter()
        .map(|p| {
            (
                format!("shipped compute_{} PTX", p.arch),
                with_nul(p.text.as_bytes()),
            )
        })
        .collect();
    assert_eq!(images.len(), 3, "the shipped PTX of every architecture");
    if let Some(fatbin) = m.fatbin {
        images.push(("nvcc's fatbin".into(), fatbin.to_vec()));
    }
    if nvrtc::is_available() {
        for (output, what) in [
            (Output::Cubin, "NVRTC's sm_90 cubin"),
            (Output::Ptx, "NVRTC's compute_90 PTX"),
        ] {
            let image = nvrtc::compile(m, (9, 0), output).unwrap_or_else(|e| panic!("{what}: {e}"));
            images.push((what.into(), image));
        }
    } else {
        assert_ne!(
            std::env::var("NANODDP_EXPECT_NVRTC").as_deref(),
            Ok("1"),
            "NANODDP_EXPECT_NVRTC=1 but libnvrtc.so could not be loaded"
        );
        eprintln!("NVRTC not installed: its images are tried where it is");
    }
    let (ctx, stream) = raw_stream(0);
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    for (what, image) in images {
        let loaded = ctx.load_module(Ptx::from_binary(image.clone()));
        if image.starts_with(b"\x7fELF") && common::on_the_ptx_executor() {
            let refused = loaded.err().unwrap_or_else(|| panic!("{what}: loaded"));
            assert_eq!(
                refused.0,
                sys::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
                "{what}"
            );
            continue;
        }
        let axpy = loaded
            .and_then(|module| module.load_function("axpy_f32"))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let dx = stream.clone_htod(&x).expect("upload");
        let mut dy = stream.clone_htod(&vec![1.0f32; n]).expect("upload");
        let (alpha, count) = (2.0f32, n as u64);
        let mut b = stream.launch_builder(&axpy);
        b.arg(&dx).arg(&mut dy).arg(&alpha).arg(&count);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (4, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: axpy_f32(x, y, alpha, n) over n floats each, grid-stride.
        unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("{what}: {e}"));
        let y = stream.clone_dtoh(&dy).expect("download");
        stream.synchronize().expect("the download done");
        let wrong = (0..n).find(|&i| y[i] != 2.0 * i as f32 + 1.0);
        assert_eq!(wrong, None, "{what}: y[{wrong:?}] is wrong");
    }
}

/// The SIMT executor finds a registered kernel in a PTX image where an entry names it: after
/// `.entry` and a space, a tab or a newline, and before `(` or ` (`. A longer name that
/// starts with it, or the name before a newline and then `(`, is not it. (The PTX executor
/// parses the PTX it runs: `tests/ptx_executor.rs`.)
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_ptx_image_holds_the_kernels_its_entries_name() {
    if !on_standin() {
        return;
    }
    if common::on_the_ptx_executor() {
        println!("not applicable on the PTX executor: this test checks the SIMT executor's");
        return;
    }
    let (ctx, _stream) = raw_stream(0);
    let mut image = concat!(
        "//\n.version 9.0\n.target sm_90\n",
        ".visible .entry reverse_in_block(\n)\n",
        ".visible .entry\tscale_f32 (\n)\n",
        ".entry\nfill_f32(\n)\n",
        ".entry add_f32_twice(\n)\n",
        ".entry axpy_f32\n(\n)\n",
    )
    .as_bytes()
    .to_vec();
    image.push(0);
    let module = ctx.load_module(Ptx::from_binary(image)).expect("module");
    for (kernel, named) in [
        ("reverse_in_block", true),
        ("scale_f32", true),
        ("fill_f32", true),
        ("add_f32", false),
        ("axpy_f32", false),
    ] {
        let found = module.load_function(kernel);
        match named {
            true => assert!(found.is_ok(), "{kernel}: {:?}", found.err()),
            false => assert_eq!(
                found.err().map(|e| e.0),
                Some(sys::CUresult::CUDA_ERROR_NOT_FOUND),
                "{kernel}"
            ),
        }
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
    let conv = raw_function(&ctx, "conv", "conv2d_forward_64x64_f32");
    let sig = nanoddp::kernels::conv::CONV2D_FORWARD_64X64_F32.max_threads;
    assert_eq!(sig, Some(256));
    let mut b = stream.launch_builder(&conv);
    let zero = 0i32;
    for _ in 0..3 {
        b.arg(&input);
    }
    b.arg(&out);
    for _ in 0..(nanoddp::kernels::conv::CONV2D_FORWARD_64X64_F32
        .params
        .len()
        - 4)
    {
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
    let args = vec![
        KernelArg::I32(0);
        nanoddp::kernels::conv::CONV2D_FORWARD_64X64_F32
            .params
            .len()
    ];
    // SAFETY: rejected by the check before any launch.
    let err = unsafe {
        dev.launch(
            &nanoddp::kernels::conv::CONV2D_FORWARD_64X64_F32,
            bad,
            &args,
        )
    };
    assert!(
        matches!(err, Err(BackendError::BadLaunch { .. })),
        "{err:?}"
    );
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn launch_bounds_refuse_bigger_blocks_before_the_driver_sees_them() {
    // The backend's own check, on the stand-in or a GPU alike.
    common::launch_bounds_are_enforced(&common::cuda_device(2));
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
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

// ---- stream capture and graphs
//
// Two tests run here on GPU 5 (whose context no test of this file kills) in THREAD_LOCAL mode,
// which binds only the capturing thread, so the tests beside them are undisturbed. The others run
// in a process of their own (`in_own_process`): a GLOBAL capture prohibits other threads' calls,
// the audit counts a whole process, and the errors a replay must meet kill contexts, which there
// may be any of its 8 GPUs.

/// Set in a test's own process (see `in_own_process`).
const OWN_PROCESS: &str = "NANODDP_STANDIN_OWN_PROCESS";

const THREAD_LOCAL: sys::CUstreamCaptureMode =
    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
const GLOBAL: sys::CUstreamCaptureMode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
const RELAXED: sys::CUstreamCaptureMode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// Runs test `name` of this binary again, alone in a process of its own with `envs` set, and
/// returns its stderr once it passed; `None` inside that process, where the caller runs the
/// test's body.
fn in_own_process(name: &str, envs: &[(&str, &str)]) -> Option<String> {
    if std::env::var_os(OWN_PROCESS).is_some() {
        return None;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS, "1")
        .envs(envs.iter().copied())
        .output()
        .expect("the test binary runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} in its own process:\n{stdout}\n{stderr}"
    );
    Some(stderr.into_owned())
}

/// The stand-in's diagnostic behind its last error.
fn last_error() -> String {
    // SAFETY: the stand-in is loaded; the string stays valid until this thread asks again.
    unsafe {
        let f = sys::culib()
            .get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(b"nanoddpStandinLastError\0")
            .expect("the stand-in exports its last error");
        std::ffi::CStr::from_ptr(f()).to_string_lossy().into_owned()
    }
}

/// y = a·x + y over `n` floats, launched through cudarc on `stream`.
fn axpy(
    stream: &Arc<CudaStream>,
    f: &cudarc::driver::CudaFunction,
    x: u64,
    y: u64,
    a: f32,
    n: usize,
) -> Result<(), DriverError> {
    let count = n as u64;
    let mut b = stream.launch_builder(f);
    b.arg(&x).arg(&y).arg(&a).arg(&count);
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (n.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x and y address n floats each where the tests call it, or the test is about
    // what the stand-in does when they do not.
    unsafe { b.launch(cfg) }.map(|_| ())
}

/// The device address of `s` (tests pass raw addresses, so captured launches borrow nothing).
fn addr(s: &cudarc::driver::CudaSlice<f32>, stream: &Arc<CudaStream>) -> u64 {
    use cudarc::driver::DevicePtr;
    s.device_ptr(stream).0
}

/// `n` floats from `dev` once `stream` has finished.
fn read(stream: &Arc<CudaStream>, dev: &cudarc::driver::CudaSlice<f32>) -> Vec<f32> {
    let mut out = vec![0.0f32; dev.len()];
    stream.memcpy_dtoh(dev, &mut out).expect("queued");
    stream.synchronize().expect("sync");
    out
}

/// `n` floats of pinned host memory (cuMemHostAlloc), leaked: tests end with their process.
fn pinned_floats(n: usize, value: f32) -> &'static mut [f32] {
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the driver allocates n floats, page-aligned.
    unsafe { sys::cuMemHostAlloc(&mut p, n * 4, 0) }
        .result()
        .expect("cuMemHostAlloc");
    // SAFETY: p holds n floats, never freed.
    let host = unsafe { std::slice::from_raw_parts_mut(p.cast::<f32>(), n) };
    host.fill(value);
    host
}

/// Copies `n` floats from host memory at `src` to `dst` on `stream` (cuMemcpyHtoDAsync).
fn htod_raw(stream: &Arc<CudaStream>, dst: u64, src: *const f32, n: usize) -> sys::CUresult {
    // SAFETY: the callers' buffers hold n floats and outlive the stream's use of them.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), n * 4, stream.cu_stream()) }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_captured_graph_replays_as_eager_work_does_with_arguments_frozen_and_pinned_memory_read_at_launch(
) {
    if !on_standin() {
        return;
    }
    let (ctx, stream) = raw_stream(5);
    ctx.bind_to_thread().unwrap();
    let f = raw_function(&ctx, "elementwise", "axpy_f32");
    let n = 300;
    let x = stream.alloc_zeros::<f32>(n).unwrap();
    let y = stream.alloc_zeros::<f32>(n).unwrap();
    let eager = stream.alloc_zeros::<f32>(n).unwrap();
    let pinned = pinned_floats(n, 1.0);
    let source = pinned.as_ptr();
    stream.synchronize().unwrap();
    // One step: x from the pinned buffer, then y += a·x + 0.5·x.
    let mut a = 2.0f32;
    let step = |y: u64, a: f32| {
        assert_eq!(
            htod_raw(&stream, addr(&x, &stream), source, n),
            sys::CUresult::CUDA_SUCCESS
        );
        axpy(&stream, &f, addr(&x, &stream), y, a, n).unwrap();
        axpy(&stream, &f, addr(&x, &stream), y, 0.5, n).unwrap();
    };
    stream.begin_capture(THREAD_LOCAL).expect("begin");
    assert_eq!(
        stream.capture_status().unwrap(),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    step(addr(&y, &stream), a);
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .expect("end")
        .expect("a graph");
    assert_eq!(
        read(&stream, &y),
        vec![0.0; n],
        "captured work does not run"
    );
    // After the capture: the kernel's argument was copied (the graph keeps 2.0), the pinned
    // buffer is read when the copy node runs (3.0 arrives).
    a = 100.0;
    pinned.fill(3.0);
    graph.upload().expect("upload");
    for launch in 0..3 {
        if launch == 2 {
            pinned.fill(1.0);
        }
        graph.launch().expect("launch");
        step(addr(&eager, &stream), 2.0);
        assert_eq!(
            read(&stream, &y),
            read(&stream, &eager),
            "launch {launch} equals eager work"
        );
    }
    assert_eq!(read(&stream, &y), vec![2.5 * 3.0 * 2.0 + 2.5; n]);
    assert_eq!(a, 100.0);
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_forked_capture_keeps_its_nodes_edges_and_captured_arguments_and_replays_both_branches() {
    if !on_standin() {
        return;
    }
    let (ctx, stream) = raw_stream(5);
    ctx.bind_to_thread().unwrap();
    let f = raw_function(&ctx, "elementwise", "axpy_f32");
    let n = 64;
    let x = stream.clone_htod(&[1.0f32; 64]).unwrap();
    let (y, z) = (
        stream.alloc_zeros::<f32>(n).unwrap(),
        stream.alloc_zeros::<f32>(n).unwrap(),
    );
    let pinned = pinned_floats(n, 4.0);
    stream.synchronize().unwrap();
    let (xa, ya, za) = (addr(&x, &stream), addr(&y, &stream), addr(&z, &stream));
    stream.begin_capture(THREAD_LOCAL).expect("begin");
    assert_eq!(
        htod_raw(&stream, xa, pinned.as_ptr(), n),
        sys::CUresult::CUDA_SUCCESS
    );
    // Fork: `side` waits for an event recorded in the capture, and so joins it.
    let side = stream.fork().expect("fork");
    assert_eq!(
        side.capture_status().unwrap(),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    axpy(&stream, &f, xa, ya, 2.0, n).unwrap();
    axpy(&side, &f, xa, za, 3.0, n).unwrap();
    // What side's next node will depend on: the kernel it just captured.
    let (mut status, mut id, mut count) = (
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        0u64,
        0usize,
    );
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    // SAFETY: valid out-pointers; graph and edge data not asked for.
    unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            side.cu_stream(),
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            &mut deps,
            std::ptr::null_mut(),
            &mut count,
        )
    }
    .result()
    .expect("capture info");
    assert_eq!(
        status,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    assert!(id > 0 && count == 1 && !deps.is_null());
    stream.join(&side).expect("join");
    // SAFETY: 64 bytes of y.
    unsafe { sys::cuMemsetD8Async(za, 0, 4, stream.cu_stream()) }
        .result()
        .expect("memset captured");
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .expect("end")
        .expect("a graph");
    // Four nodes in capture order, three edges besides the join: copy → both kernels → memset.
    let g = graph.cu_graph();
    let mut count = 0usize;
    // SAFETY: count only, then 4 handles into a 5-slot array (the fifth comes back null).
    let nodes = unsafe {
        sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut count)
            .result()
            .unwrap();
        assert_eq!(count, 4);
        let mut nodes = [std::ptr::null_mut(); 5];
        count = 5;
        sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut count)
            .result()
            .unwrap();
        assert_eq!(count, 4);
        assert!(nodes[4].is_null());
        nodes
    };
    use sys::CUgraphNodeType::*;
    let types: Vec<_> = nodes[..4]
        .iter()
        .map(|&node| {
            let mut t = CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a node of the graph.
            unsafe { sys::cuGraphNodeGetType(node, &mut t) }
                .result()
                .unwrap();
            t
        })
        .collect();
    assert_eq!(
        types,
        [
            CU_GRAPH_NODE_TYPE_MEMCPY,
            CU_GRAPH_NODE_TYPE_KERNEL,
            CU_GRAPH_NODE_TYPE_KERNEL,
            CU_GRAPH_NODE_TYPE_MEMSET
        ]
    );
    let mut edges = 0usize;
    // SAFETY: count only.
    unsafe {
        sys::cuGraphGetEdges_v2(
            g,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut edges,
        )
    }
    .result()
    .unwrap();
    assert_eq!(edges, 4, "copy→kernel twice, both kernels→memset");
    // The side branch's kernel: its function, shape and the argument values of the call.
    // SAFETY: a zeroed struct is a valid out-parameter; kernelParams then points into the
    // graph's own copy of the 4 arguments, alive as long as the graph.
    unsafe {
        let mut p: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        sys::cuGraphKernelNodeGetParams_v2(nodes[2], &mut p)
            .result()
            .expect("kernel node");
        assert_eq!(p.func, f.cu_function());
        assert_eq!((p.gridDimX, p.blockDimX, p.sharedMemBytes), (1, 256, 0));
        let arg = |i: usize| *p.kernelParams.add(i);
        assert_eq!(*arg(0).cast::<u64>(), xa);
        assert_eq!(*arg(1).cast::<u64>(), za);
        assert_eq!(*arg(2).cast::<f32>(), 3.0);
        assert_eq!(*arg(3).cast::<u64>(), n as u64);
        let mut not_kernel: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        assert_eq!(
            sys::cuGraphKernelNodeGetParams_v2(nodes[0], &mut not_kernel),
            sys::CUresult::CUDA_ERROR_INVALID_VALUE
        );
    }
    // Both branches run at every launch, ordered by the fork and the join (no hazard: they
    // only read x, which the copy wrote before the fork).
    for launch in 1..=2 {
        graph.launch().expect("launch");
        assert_eq!(read(&stream, &y), vec![8.0 * launch as f32; n]);
        let z_now = read(&stream, &z);
        assert_eq!(&z_now[..1], &[0.0], "the memset after the join");
        assert_eq!(z_now[1..], vec![12.0 * launch as f32; n - 1][..]);
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn each_capture_rule_is_the_drivers_error_and_a_broken_one_invalidates_the_capture() {
    if !on_standin() {
        return;
    }
    // In a process of its own: the GLOBAL capture below prohibits every other thread's
    // potentially unsafe calls, as the driver does.
    let name = "each_capture_rule_is_the_drivers_error_and_a_broken_one_invalidates_the_capture";
    if in_own_process(name, &[]).is_some() {
        return;
    }
    use sys::CUresult::*;
    use sys::CUstreamCaptureStatus::*;
    let (ctx, stream) = raw_stream(0);
    ctx.bind_to_thread().unwrap();
    let y = stream.alloc_zeros::<f32>(64).unwrap();
    let ya = addr(&y, &stream);
    stream.synchronize().unwrap();
    let end = |s: &Arc<CudaStream>| {
        s.end_capture(sys::CUgraphInstantiate_flags(0))
            .map(|g| g.is_some())
    };
    let code = |r: Result<bool, DriverError>| r.expect_err("refused").0;
    // SAFETY: 4 bytes of y, a live allocation; `s` a live stream or the NULL one.
    let memset = |s: sys::CUstream| unsafe { sys::cuMemsetD8Async(ya, 1, 4, s) };
    let status = |s: sys::CUstream| {
        let mut st = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream (or the NULL one) and a valid out-pointer.
        let r = unsafe { sys::cuStreamIsCapturing(s, &mut st) };
        (r, st)
    };
    let s = stream.cu_stream();

    // Synchronizing or querying a capturing stream: UNSUPPORTED; the capture is invalidated,
    // later work on it is refused, and ending it fails.
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(memset(s), CUDA_SUCCESS);
    assert_eq!(
        stream.synchronize().unwrap_err().0,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    );
    assert!(
        last_error().contains("cuStreamSynchronize"),
        "{}",
        last_error()
    );
    assert_eq!(
        status(s),
        (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    );
    assert_eq!(memset(s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert!(
        last_error().contains("cuStreamSynchronize"),
        "{}",
        last_error()
    );
    assert_eq!(status(s), (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_NONE));
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(
        // SAFETY: a live stream.
        unsafe { sys::cuStreamQuery(s) },
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    // So is synchronizing the context that holds it.
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(
        ctx.synchronize().unwrap_err().0,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // An event recorded in a capture marks nodes, not work: querying or synchronizing it is
    // CAPTURED_EVENT, during the capture and after it, until it is recorded outside one.
    let event = ctx.new_event(None).unwrap();
    stream.begin_capture(THREAD_LOCAL).unwrap();
    event.record(&stream).unwrap();
    assert_eq!(
        // SAFETY: a live event.
        unsafe { sys::cuEventQuery(event.cu_event()) },
        CUDA_ERROR_CAPTURED_EVENT
    );
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_eq!(
        // SAFETY: a live event.
        unsafe { sys::cuEventSynchronize(event.cu_event()) },
        CUDA_ERROR_CAPTURED_EVENT
    );
    event.record(&stream).unwrap();
    event
        .synchronize()
        .expect("recorded outside a capture again");

    // The legacy NULL stream while a blocking stream captures: IMPLICIT (it would wait for
    // captured work). Asking whether it captures is refused too, without invalidating.
    let mut blocking: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the stream lives until the process ends.
    unsafe { sys::cuStreamCreate(&mut blocking, 0) }
        .result()
        .unwrap();
    // SAFETY: the stream just created.
    unsafe { sys::cuStreamBeginCapture_v2(blocking, THREAD_LOCAL) }
        .result()
        .unwrap();
    assert_eq!(
        status(std::ptr::null_mut()).0,
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    );
    assert_eq!(
        status(blocking),
        (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_ACTIVE)
    );
    assert_eq!(
        memset(std::ptr::null_mut()),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    );
    assert!(last_error().contains("legacy"), "{}", last_error());
    assert_eq!(
        status(blocking),
        (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    );
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    assert_eq!(
        // SAFETY: the stream just created and a valid out-pointer.
        unsafe { sys::cuStreamEndCapture(blocking, &mut graph) },
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    );
    assert!(graph.is_null());
    // A non-blocking stream's capture leaves the legacy stream free.
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(memset(std::ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(end(&stream), Ok(true));

    // A GLOBAL or THREAD_LOCAL capture ends on the thread that began it (WRONG_THREAD, and
    // the capture goes on); a RELAXED one anywhere.
    let end_elsewhere = |s: sys::CUstream| {
        let s = s as usize;
        std::thread::spawn(move || {
            let mut graph: sys::CUgraph = std::ptr::null_mut();
            // SAFETY: `s` is the test's live stream; a valid out-pointer.
            let r = unsafe { sys::cuStreamEndCapture(s as sys::CUstream, &mut graph) };
            if !graph.is_null() {
                // SAFETY: the graph this call received, destroyed once.
                unsafe { sys::cuGraphDestroy(graph) }.result().unwrap();
            }
            r
        })
        .join()
        .unwrap()
    };
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(end_elsewhere(s), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    assert_eq!(status(s), (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_ACTIVE));
    assert_eq!(end(&stream), Ok(true));
    stream.begin_capture(RELAXED).unwrap();
    assert_eq!(end_elsewhere(s), CUDA_SUCCESS);

    // A fork never joined back: UNJOINED. Ending on the forked stream: UNMATCHED.
    stream.begin_capture(THREAD_LOCAL).unwrap();
    let side = stream.fork().unwrap();
    assert_eq!(memset(side.cu_stream()), CUDA_SUCCESS);
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    assert!(last_error().contains("never joined"), "{}", last_error());
    assert_eq!(
        status(side.cu_stream()),
        (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_NONE)
    );
    stream.begin_capture(THREAD_LOCAL).unwrap();
    let side = stream.fork().unwrap();
    assert_eq!(code(end(&side)), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // A capturing stream waiting for work recorded outside the capture: ISOLATION.
    let before = stream.record_event(None).unwrap();
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(
        stream.wait(&before).unwrap_err().0,
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION
    );
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // Stream-ordered allocation inside a capture: refused (the stand-in has no memory nodes).
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(
        stream.alloc_zeros::<f32>(4).unwrap_err().0,
        CUDA_ERROR_NOT_SUPPORTED
    );
    assert!(last_error().contains("memory nodes"), "{}", last_error());
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    // Potentially unsafe calls (here cuMemAlloc and a synchronous copy). THREAD_LOCAL: the
    // capturing thread may not make them, unless it exchanges its mode for RELAXED; other
    // threads may.
    fn alloc() -> sys::CUresult {
        let mut p = 0u64;
        // SAFETY: a valid out-pointer; the 256 bytes are freed at once.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, 256) };
        if r == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the 256 bytes just allocated, unused.
            unsafe { sys::cuMemFree_v2(p) }.result().unwrap();
        }
        r
    }
    let exchange = |mode: sys::CUstreamCaptureMode| {
        let mut mode = mode;
        // SAFETY: a valid in-out pointer.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
            .result()
            .unwrap();
        mode
    };
    let elsewhere = |relaxed: bool, call: Box<dyn FnOnce() -> sys::CUresult + Send>| {
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            ctx.bind_to_thread().unwrap();
            if relaxed {
                let mut mode = RELAXED;
                // SAFETY: a valid in-out pointer.
                unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }
                    .result()
                    .unwrap();
            }
            call()
        })
        .join()
        .unwrap()
    };
    stream.begin_capture(THREAD_LOCAL).unwrap();
    assert_eq!(elsewhere(false, Box::new(alloc)), CUDA_SUCCESS);
    assert_eq!(exchange(RELAXED), GLOBAL, "a thread's mode starts GLOBAL");
    assert_eq!(alloc(), CUDA_SUCCESS, "a RELAXED thread may");
    assert_eq!(exchange(GLOBAL), RELAXED);
    assert_eq!(alloc(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert!(last_error().contains("cuMemAlloc"), "{}", last_error());
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    // GLOBAL: no thread in GLOBAL mode may while the capture lasts; a RELAXED one may.
    let copy = move || {
        let host = [0u8; 4];
        // SAFETY: 4 bytes into y.
        unsafe { sys::cuMemcpyHtoD_v2(ya, host.as_ptr().cast(), 4) }
    };
    stream.begin_capture(GLOBAL).unwrap();
    assert_eq!(elsewhere(true, Box::new(copy)), CUDA_SUCCESS);
    assert_eq!(
        elsewhere(false, Box::new(copy)),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    );
    assert!(
        last_error().contains("cuMemcpyHtoD") && last_error().contains("another thread"),
        "{}",
        last_error()
    );
    assert_eq!(code(end(&stream)), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    // After the capture, everything is allowed again, and the stream works.
    assert_eq!(alloc(), CUDA_SUCCESS);
    assert_eq!(memset(s), CUDA_SUCCESS);
    assert_eq!(read(&stream, &y)[0], f32::from_bits(0x0101_0101));
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_replayed_graph_meets_every_check_eager_work_meets() {
    if !on_standin() {
        return;
    }
    // In a process of its own: each case kills its GPU's context (sticky errors), so each
    // takes a GPU of its own there.
    if in_own_process("a_replayed_graph_meets_every_check_eager_work_meets", &[]).is_some() {
        return;
    }
    use sys::CUresult::*;
    let n = 512;
    let capture = |stream: &Arc<CudaStream>, work: &dyn Fn()| {
        stream.begin_capture(THREAD_LOCAL).unwrap();
        work();
        stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .expect("captured")
            .expect("a graph")
    };
    let setup = |gpu: usize| {
        let (ctx, stream) = raw_stream(gpu);
        ctx.bind_to_thread().unwrap();
        let f = raw_function(&ctx, "elementwise", "axpy_f32");
        let x = stream.clone_htod(&vec![1.0f32; n]).unwrap();
        let y = stream.alloc_zeros::<f32>(n).unwrap();
        stream.synchronize().unwrap();
        (ctx, stream, f, x, y)
    };

    // GPU 1's pool memory, read by GPU 0 without cuMemPoolSetAccess: the replay faults as the
    // same launch does eagerly (on GPU 6), and the error is sticky.
    let (_c1, s1) = raw_stream(1);
    let far = s1.clone_htod(&vec![1.0f32; n]).unwrap();
    s1.synchronize().unwrap();
    let far_addr = addr(&far, &s1);
    let (_c6, s6, f6, _x6, y6) = setup(6);
    axpy(&s6, &f6, far_addr, addr(&y6, &s6), 1.0, n).unwrap();
    let eager = s6.synchronize().unwrap_err().0;
    assert_eq!(eager, CUDA_ERROR_ILLEGAL_ADDRESS);
    let (_c0, s0, f0, _x0, y0) = setup(0);
    let graph = capture(&s0, &|| {
        axpy(&s0, &f0, far_addr, addr(&y0, &s0), 1.0, n).unwrap()
    });
    graph.launch().expect("launched");
    assert_eq!(s0.synchronize().unwrap_err().0, eager);
    let text = last_error();
    assert!(
        text.contains("graph node 0") && text.contains("cuMemPoolSetAccess"),
        "{text}"
    );
    assert_eq!(graph.launch().unwrap_err().0, eager, "sticky");

    // Memory freed after the capture: a use after free at the next launch.
    let (_c2, s2, f2, x2, y2) = setup(2);
    let (xa, ya) = (addr(&x2, &s2), addr(&y2, &s2));
    let graph = capture(&s2, &|| axpy(&s2, &f2, xa, ya, 1.0, n).unwrap());
    graph.launch().unwrap();
    assert_eq!(read(&s2, &y2), vec![1.0; n]);
    drop(y2);
    s2.synchronize().unwrap();
    graph.launch().expect("launched");
    assert_eq!(s2.synchronize().unwrap_err().0, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert!(last_error().contains("freed"), "{}", last_error());
    drop(x2);

    // A replay and another stream's kernel, unordered, on one buffer: a cross-stream hazard
    // naming both.
    let (c3, s3, f3, x3, y3) = setup(3);
    let (xa, ya) = (addr(&x3, &s3), addr(&y3, &s3));
    let graph = capture(&s3, &|| axpy(&s3, &f3, xa, ya, 1.0, n).unwrap());
    let other = c3.new_stream().unwrap();
    let z3 = other.alloc_zeros::<f32>(n).unwrap();
    other.synchronize().unwrap();
    graph.launch().unwrap();
    axpy(&other, &f3, ya, addr(&z3, &other), 1.0, n).unwrap();
    assert_eq!(other.synchronize().unwrap_err().0, CUDA_ERROR_LAUNCH_FAILED);
    let text = last_error();
    assert!(
        text.contains("cross-stream hazard") && text.contains("graph node 0"),
        "{text}"
    );

    // Two branches of one graph the capture left unordered, both writing y: a hazard at
    // launch, as between two streams.
    let (_c4, s4, f4, x4, y4) = setup(4);
    let (xa, ya) = (addr(&x4, &s4), addr(&y4, &s4));
    let graph = capture(&s4, &|| {
        let side = s4.fork().unwrap();
        axpy(&s4, &f4, xa, ya, 1.0, n).unwrap();
        axpy(&side, &f4, xa, ya, 1.0, n).unwrap();
        s4.join(&side).unwrap();
    });
    graph.launch().unwrap();
    assert_eq!(s4.synchronize().unwrap_err().0, CUDA_ERROR_LAUNCH_FAILED);
    assert!(
        last_error().contains("cross-stream hazard"),
        "{}",
        last_error()
    );

    // The watchdog: a replayed kernel that never ends times out, naming it.
    let (c5, s5) = raw_stream(5);
    c5.bind_to_thread().unwrap();
    set_kernel_timeout(5, 0.5);
    let endless = raw_function(&c5, "selftest", "broken_endless");
    let out = s5.alloc_zeros::<f32>(256).unwrap();
    s5.synchronize().unwrap();
    let out_addr = addr(&out, &s5);
    let graph = capture(&s5, &|| {
        let spin = 5i32;
        let mut b = s5.launch_builder(&endless);
        b.arg(&out_addr).arg(&spin);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (2, 1, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: 2 blocks of 64 threads over 256 floats; it never ends, on purpose.
        unsafe { b.launch(cfg) }.unwrap();
    });
    graph.launch().unwrap();
    assert_eq!(s5.synchronize().unwrap_err().0, CUDA_ERROR_LAUNCH_TIMEOUT);
    assert!(last_error().contains("broken_endless"), "{}", last_error());
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_audit_counts_a_replay_as_one_graph_launch_not_as_kernel_launches() {
    if !on_standin() {
        return;
    }
    // In a process of its own, where the audit counts what this test does and nothing else.
    let name = "the_audit_counts_a_replay_as_one_graph_launch_not_as_kernel_launches";
    let Some(stderr) = in_own_process(name, &[("NANODDP_STANDIN_STATS", "1")]) else {
        let (ctx, stream) = raw_stream(0);
        ctx.bind_to_thread().unwrap();
        let f = raw_function(&ctx, "elementwise", "axpy_f32");
        let x = stream.clone_htod(&[1.0f32; 64]).unwrap();
        let y = stream.alloc_zeros::<f32>(64).unwrap();
        stream.synchronize().unwrap();
        let (xa, ya) = (addr(&x, &stream), addr(&y, &stream));
        stream.begin_capture(THREAD_LOCAL).unwrap();
        axpy(&stream, &f, xa, ya, 1.0, 64).unwrap();
        axpy(&stream, &f, xa, ya, 2.0, 64).unwrap();
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .unwrap()
            .unwrap();
        let before = counters(0)[1];
        for _ in 0..3 {
            graph.launch().unwrap();
        }
        assert_eq!(read(&stream, &y), vec![9.0; 64]);
        assert_eq!(counters(0)[1] - before, 6, "six kernels ran");
        return;
    };
    let count = |entry: &str| {
        let prefix = format!("[cuda stand-in] calls {entry} 0 ");
        stderr
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |n| n.parse::<u64>().expect("a count"))
    };
    assert_eq!(count("cuGraphLaunch"), 3, "{stderr}");
    assert_eq!(
        count("cuLaunchKernel"),
        2,
        "the two captured calls only: {stderr}"
    );
    assert_eq!(count("cuGraphInstantiateWithFlags"), 1, "{stderr}");
    assert_eq!(count("cuStreamBeginCapture_v2"), 1, "{stderr}");
    assert_eq!(count("cuStreamEndCapture"), 1, "{stderr}");
}
