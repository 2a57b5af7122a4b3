//! The CUDA stand-in's PTX executor, which runs the PTX nvcc and NVRTC emitted instead of the
//! kernels' C++ source: it implements every instruction nanoddp's kernels compile to (the
//! coverage, the same list as docs/ptx-coverage.md), it catches each of the selftest's broken
//! kernels as the SIMT executor does, and it catches one bug only the compiled code has.
//!
//! Every CUDA test of the suite runs under it when `NANODDP_STANDIN_EXEC=ptx` (CI's second
//! pass), each result compared bit for bit with the SIMT executor's
//! (`common::same_bits_as_the_simt_executor`). The tests here pick an executor per GPU, so
//! they check both in either pass. Each provokes sticky errors on GPUs of its own (the
//! stand-in shows this binary 16).

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use cudarc::driver::sys;
use nanoddp::backend::cuda::{self, CudaDevice};
use nanoddp::backend::nvrtc::{self, Output};
use nanoddp::backend::simt_module::SimtModule;
use nanoddp::backend::{BackendError, LaunchConfig, Memory};
use nanoddp::kernels::{selftest, MODULES};

/// GPU `ordinal` of the stand-in, its modules run by `executor`. The stand-in shows this
/// binary 16 GPUs: 0-5 the SIMT executor's broken kernels, 6-11 the PTX executor's, 12 and 13
/// the two lane orders (12 also the planted bug under PTX), 14 the planted bug under SIMT, 15
/// the byte-exact bounds check.
fn standin_gpu(ordinal: usize, executor: &str, reverse_lanes: bool) -> Option<CudaDevice> {
    static GPUS: std::sync::Once = std::sync::Once::new();
    GPUS.call_once(|| {
        if std::env::var_os("NANODDP_STANDIN_GPUS").is_none() {
            std::env::set_var("NANODDP_STANDIN_GPUS", "16");
        }
    });
    let driver = common::cuda_driver();
    if !cuda::is_standin() {
        eprintln!("not applicable on {driver}: this test checks the CPU stand-in's executors");
        return None;
    }
    common::standin_use_executor(ordinal, executor, reverse_lanes);
    Some(common::cuda_device(ordinal))
}

/// The stand-in library, loaded by its path: its coverage query needs no GPU and no driver
/// state, so it runs on a machine with a real GPU too.
fn standin_library() -> libloading::Library {
    let path = format!("{}/libcuda.so.1", cuda::STANDIN_DIR);
    // SAFETY: the stand-in this crate built; its initializers only read the environment.
    unsafe { libloading::Library::new(&path) }
        .unwrap_or_else(|e| panic!("the stand-in at {path} does not load: {e}"))
}

/// The instruction spellings the PTX executor reads in `image` (PTX, or a fatbin's PTX
/// entries), or why it cannot run them.
fn spellings(lib: &libloading::Library, image: &[u8]) -> Result<Vec<String>, String> {
    type Spellings = unsafe extern "C" fn(*const u8, usize, *mut u8, usize) -> i64;
    // SAFETY: the stand-in's export with this signature.
    let f = unsafe { lib.get::<Spellings>(b"nanoddpStandinPtxSpellings\0") }
        .expect("the stand-in exports nanoddpStandinPtxSpellings");
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: `image` and `buf` are live for the call, with their true lengths.
        let n = unsafe { f(image.as_ptr(), image.len(), buf.as_mut_ptr(), buf.len()) };
        let text_end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let text = String::from_utf8_lossy(&buf[..text_end]).into_owned();
        if n < 0 {
            return Err(text);
        }
        if n as usize > buf.len() {
            buf = vec![0u8; n as usize];
            continue;
        }
        return Ok(text.lines().map(str::to_owned).collect());
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_executor_asked_for_is_the_one_that_runs() {
    let driver = common::cuda_driver();
    if !cuda::is_standin() {
        eprintln!("not applicable on {driver}");
        return;
    }
    let want = match std::env::var("NANODDP_STANDIN_EXEC").as_deref() {
        Ok("ptx") => "PTX executor",
        _ => "SIMT emulator",
    };
    // SAFETY: the stand-in is loaded; the export returns a static NUL-terminated string.
    let name = unsafe {
        let f = sys::culib()
            .get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(b"nanoddpStandinExecutor\0")
            .expect("the stand-in exports nanoddpStandinExecutor");
        std::ffi::CStr::from_ptr(f()).to_string_lossy().into_owned()
    };
    assert_eq!(name, want, "NANODDP_STANDIN_EXEC asked for the {want}");
}

/// Every instruction (opcode and modifiers) in the PTX of every nanoddp kernel and of the
/// custom-kernel example, as nvcc built it (the PTX shipped in kernels/ptx/) and as
/// NVRTC compiles it for sm_80 and sm_90, is one the PTX executor implements; together they
/// are exactly the table in docs/ptx-coverage.md.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn every_instruction_nvcc_and_nvrtc_emit_is_implemented() {
    let lib = standin_library();
    let mut all = BTreeSet::new();
    let mut check = |what: &str, image: &[u8]| match spellings(&lib, image) {
        Ok(s) => {
            assert!(!s.is_empty(), "{what}: no instructions read");
            all.extend(s);
        }
        Err(why) => panic!("{what}: {why}"),
    };
    let expect = |var: &str| std::env::var(var).is_ok_and(|v| v == "1");
    let mut complete = true;
    // The shipped PTX is what nvcc puts in the fatbins (tests/kernel_build.rs holds them equal).
    for m in MODULES {
        assert!(!m.ptx.is_empty(), "{}: no shipped PTX", m.name);
        for p in m.ptx {
            let mut image = p.text.as_bytes().to_vec();
            image.push(0);
            check(
                &format!("{} (kernels/ptx, compute_{})", m.name, p.arch),
                &image,
            );
        }
    }
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/custom_kernel/transpose.cu");
    if nvrtc::is_available() {
        for cc in [(8, 0), (9, 0)] {
            for m in MODULES {
                let ptx = nvrtc::compile(m, cc, Output::Ptx).unwrap_or_else(|e| panic!("{e}"));
                check(&format!("{} (NVRTC, sm_{}{})", m.name, cc.0, cc.1), &ptx);
            }
            let ptx = SimtModule::compile_for_gpu(&example, cc, Output::Ptx)
                .unwrap_or_else(|e| panic!("{e}"));
            check(&format!("{} (NVRTC)", example.display()), &ptx);
        }
    } else {
        assert!(
            !expect("NANODDP_EXPECT_NVRTC"),
            "NANODDP_EXPECT_NVRTC=1 but libnvrtc.so could not be loaded"
        );
        complete = false;
    }
    // The table in the docs, between its markers: one `| `spelling` |` row per instruction.
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ptx-coverage.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/ptx-coverage.md");
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect();
    let missing: Vec<&String> = all.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "{} instructions the kernels compile to are not in docs/ptx-coverage.md: {missing:?}",
        missing.len()
    );
    if complete {
        let stale: Vec<&String> = documented.difference(&all).collect();
        assert!(
            stale.is_empty(),
            "docs/ptx-coverage.md lists instructions no kernel compiles to any more: {stale:?}"
        );
    }
    eprintln!(
        "{} distinct instructions, every one implemented by the PTX executor",
        all.len()
    );
}

fn block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1, 1),
        block: (threads, 1, 1),
        shared_bytes: 0,
    }
}

/// A broken kernel's launch: queued fine, then the error the executor found.
fn caught(what: &str, result: Result<(), BackendError>, dev: &CudaDevice) -> String {
    result.expect("queued");
    match dev.synchronize() {
        Err(e) => e.to_string(),
        Ok(()) => panic!("{what}: the bug went uncaught"),
    }
}

/// Each broken selftest kernel the SIMT emulator reports as an error, under each executor:
/// the same diagnosis, from the C++ source and from the PTX nvcc emitted.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn each_broken_selftest_kernel_is_caught_by_both_executors() {
    for (first, executor) in [(0, "simt"), (6, "ptx")] {
        let gpu = |i: usize| standin_gpu(first + i, executor, false);
        let Some(dev) = gpu(0) else { return };
        let mut f = dev.alloc_zeros::<f32>(64).unwrap();
        // SAFETY (each launch): one output element per thread; the bugs are the point.
        let e = caught(
            &format!("{executor}: broken_divergent_barrier"),
            unsafe { selftest::broken_divergent_barrier(&dev, block(64), &mut f) },
            &dev,
        );
        assert!(
            e.contains("broken_divergent_barrier") && e.contains("barrier"),
            "{executor}: {e}"
        );

        let dev = gpu(1).unwrap();
        let mut f = dev.alloc_zeros::<f32>(96).unwrap();
        let cfg = LaunchConfig {
            grid: (3, 1, 1),
            ..block(32)
        };
        let e = caught(
            &format!("{executor}: broken_early_exit"),
            unsafe { selftest::broken_early_exit(&dev, cfg, &mut f) },
            &dev,
        );
        assert!(
            e.contains("broken_early_exit") && e.contains("exited"),
            "{executor}: {e}"
        );

        // 1024 floats end on a page boundary, where the SIMT executor's page-granular MMU
        // check sees the write one past the end; the PTX executor checks bytes, and sees it
        // inside the last page too (below).
        let dev = gpu(2).unwrap();
        let mut f = dev.alloc_zeros::<f32>(1024).unwrap();
        let e = caught(
            &format!("{executor}: broken_off_by_one"),
            unsafe { selftest::broken_off_by_one(&dev, block(256), &mut f, 1024) },
            &dev,
        );
        assert!(e.contains("broken_off_by_one"), "{executor}: {e}");

        let dev = gpu(3).unwrap();
        let mut i = dev.alloc_zeros::<i32>(32).unwrap();
        let e = caught(
            &format!("{executor}: broken_exited_lane"),
            unsafe { selftest::broken_exited_lane(&dev, block(32), &mut i) },
            &dev,
        );
        assert!(
            e.contains("broken_exited_lane") && e.contains("exited"),
            "{executor}: {e}"
        );

        let dev = gpu(4).unwrap();
        let mut i = dev.alloc_zeros::<i32>(32).unwrap();
        let e = caught(
            &format!("{executor}: broken_mask_mismatch"),
            unsafe { selftest::broken_mask_mismatch(&dev, block(32), &mut i) },
            &dev,
        );
        assert!(
            e.contains("broken_mask_mismatch") && e.contains("disagree"),
            "{executor}: {e}"
        );

        let dev = gpu(5).unwrap();
        let mut i = dev.alloc_zeros::<i32>(32).unwrap();
        let e = caught(
            &format!("{executor}: broken_deadlock"),
            unsafe { selftest::broken_deadlock(&dev, block(32), &mut i) },
            &dev,
        );
        assert!(
            e.contains("broken_deadlock") && e.contains("deadlock"),
            "{executor}: {e}"
        );
    }
}

/// The missing barrier: the PTX executor run forwards and backwards gives different results
/// (and reads of the shared slot not yet written see the 0xff poison: NaN).
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_missing_barrier_shows_as_lane_order_dependence_in_the_ptx_executor() {
    let run = |gpu: usize, reverse: bool| {
        let dev = standin_gpu(gpu, "ptx", reverse)?;
        let mut out = dev.alloc_zeros::<f32>(256).unwrap();
        let cfg = LaunchConfig {
            grid: (2, 1, 1),
            ..block(128)
        };
        // SAFETY: one output per thread.
        unsafe { selftest::broken_missing_barrier(&dev, cfg, &mut out) }.unwrap();
        Some(dev.download(&out).unwrap())
    };
    let (Some(forward), Some(reverse)) = (run(12, false), run(13, true)) else {
        return;
    };
    let differ = forward
        .iter()
        .zip(&reverse)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert!(differ > 0, "the lane orders agree: the race went unseen");
    assert!(
        forward[0].is_nan() && forward[128].is_nan(),
        "thread 0 read its neighbour's slot before it was written: poison, in every block"
    );
}

/// The planted bug only the compiled code shows: `broken_class_of_label` casts a NaN label to
/// int, undefined in C++. g++ for x86 gives INT_MIN, so the SIMT executor sees the label
/// rejected (-1) and the kernel looks right; nvcc's cvt.rzi.s32.f32 gives 0, as a GPU would,
/// and the PTX executor shows the NaN label silently becoming class 0.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_bug_only_the_compiled_code_has_is_caught_by_the_ptx_executor_alone() {
    let labels = [3.0f32, f32::NAN, -1.0, 12.0, 9.0, f32::NAN, 1e10, 0.0];
    let want = [3, -1, -1, -1, 9, -1, -1, 0];
    let run = |gpu: usize, executor: &str| {
        let dev = standin_gpu(gpu, executor, false)?;
        let x = dev.upload(&labels).unwrap();
        let mut out = dev.upload(&[i32::MIN + 1; 8]).unwrap();
        // SAFETY: one output per label.
        unsafe { selftest::broken_class_of_label(&dev, block(32), &x, &mut out, 8, 10) }.unwrap();
        Some(dev.download(&out).unwrap())
    };
    let (Some(simt), Some(ptx)) = (run(14, "simt"), run(12, "ptx")) else {
        return;
    };
    assert_eq!(
        simt, want,
        "the SIMT executor runs the C++ source, where NaN casts to INT_MIN"
    );
    assert_eq!(
        ptx,
        [3, 0, -1, -1, 9, 0, -1, 0],
        "the PTX executor runs cvt.rzi.s32.f32: NaN is 0 on a GPU"
    );
}

/// One element past the end of 1000 floats lies inside the allocation's last 4 KiB page: the
/// SIMT executor's page-granular check cannot see it, the PTX executor's byte-exact one does.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_ptx_executor_sees_a_write_one_past_the_end_inside_the_last_page() {
    let Some(dev) = standin_gpu(15, "ptx", false) else {
        return;
    };
    let mut f = dev.alloc_zeros::<f32>(1000).unwrap();
    // SAFETY: deliberately not: the kernel writes f[1000]; the executor must refuse it.
    let e = caught(
        "ptx: broken_off_by_one",
        unsafe { selftest::broken_off_by_one(&dev, block(256), &mut f, 1000) },
        &dev,
    );
    assert!(e.contains("broken_off_by_one") && e.contains("4000"), "{e}");
}
