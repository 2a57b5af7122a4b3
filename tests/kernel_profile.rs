//! The launch profile the CUDA stand-in's PTX executor counts (`nanoddp::backend::profile`,
//! docs/kernel-profile.md), checked against a kernel whose counts follow from its arguments,
//! and the bench that prints it. GPU 0 of the stand-in profiles under the PTX executor, GPU 1
//! runs the SIMT emulator.

mod common;

use nanoddp::backend::cuda::{self, CudaDevice};
use nanoddp::backend::{LaunchConfig, Memory};
use nanoddp::kernels::selftest;

/// GPU `ordinal` of the stand-in with its modules run by `executor`, or `None` (said) on a
/// real driver.
fn standin_gpu(ordinal: usize, executor: &str) -> Option<CudaDevice> {
    let driver = common::cuda_driver();
    if !cuda::is_standin() {
        eprintln!("not applicable on {driver}: the launch profile is the CPU stand-in's");
        return None;
    }
    common::standin_use_executor(ordinal, executor, false);
    Some(common::cuda_device(ordinal))
}

/// The launch profile counts what Nsight Compute would for `profile_probe`, whose counts
/// follow from its arguments: per warp one global load whose lanes lie `stride` words apart
/// (4 sectors when adjacent, one sector a lane from 8 apart), one FMA, a shared store and load
/// `bank_stride` words apart (2 lanes a bank when it is 2, all 32 in bank 0 when it is 32),
/// a barrier, a coalesced store; and the distinct sectors read and written.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_launch_profile_counts_requests_sectors_and_bank_conflicts() {
    let Some(dev) = standin_gpu(0, "ptx") else {
        return;
    };
    cuda::standin_profile(0, true).expect("GPU 0 runs the PTX executor");
    let blocks = 3u64;
    let input = dev
        .upload(&vec![1.5f32; 32 * 32 * blocks as usize])
        .unwrap();
    let mut out = dev.upload(&vec![f32::NAN; 32 * blocks as usize]).unwrap();
    let config = LaunchConfig {
        grid: (blocks as u32, 1, 1),
        block: (32, 1, 1),
        shared_bytes: 0,
    };
    // (stride, bank_stride, load sectors a warp, shared wavefronts a request)
    for (stride, bank_stride, sectors, wavefronts) in [
        (1, 1, 4, 1),
        (2, 3, 8, 1),
        (8, 1, 32, 1),
        (1, 2, 4, 2),
        (32, 32, 32, 32),
    ] {
        // SAFETY: blocks of 32 threads; `input` holds 32 · 32 floats a block, `out` 32.
        unsafe { selftest::profile_probe(&dev, config, &input, &mut out, stride, bank_stride) }
            .unwrap();
        dev.synchronize().unwrap();
        assert_eq!(dev.download(&out).unwrap(), vec![4.0; 32 * blocks as usize]);
        let launches = cuda::standin_profile_take().unwrap();
        assert_eq!(launches.len(), 1, "one launch, one profile");
        let p = &launches[0];
        let c = p.counts;
        let what = format!("stride {stride}, bank stride {bank_stride}: {c:?}");
        assert_eq!(p.kernel, "profile_probe", "{what}");
        assert_eq!((p.grid, p.block), ([blocks as u32, 1, 1], [32, 1, 1]));
        assert_eq!(
            (c.global_load_requests, c.global_load_sectors),
            (blocks, blocks * sectors),
            "{what}"
        );
        assert_eq!(
            (c.global_store_requests, c.global_store_sectors),
            (blocks, blocks * 4),
            "{what}"
        );
        assert_eq!((c.flops_f32, c.ffma_warp), (blocks * 64, blocks), "{what}");
        for (requests, got, ideal) in [
            (
                c.shared_store_requests,
                c.shared_store_wavefronts,
                c.shared_store_ideal,
            ),
            (
                c.shared_load_requests,
                c.shared_load_wavefronts,
                c.shared_load_ideal,
            ),
        ] {
            assert_eq!(
                (requests, got, ideal),
                (blocks, blocks * wavefronts, blocks),
                "{what}"
            );
        }
        assert_eq!(c.bank_conflicts(), 2 * blocks * (wavefronts - 1), "{what}");
        assert_eq!((c.barriers, c.divergent_branches), (blocks, 0), "{what}");
        assert_eq!(
            (c.read_footprint_sectors, c.write_footprint_sectors),
            (blocks * sectors, blocks * 4),
            "{what}"
        );
        assert_eq!(c.thread_instructions, 32 * c.warp_instructions, "{what}");
        assert_eq!(
            c.local_requests + c.flops_tensor + c.global_atomic_requests,
            0
        );
    }
    cuda::standin_profile(0, false).unwrap();
    // SAFETY: as above.
    unsafe { selftest::profile_probe(&dev, config, &input, &mut out, 1, 1) }.unwrap();
    dev.synchronize().unwrap();
    assert!(
        cuda::standin_profile_take().unwrap().is_empty(),
        "profile off: nothing counted"
    );
}

/// Only the PTX executor counts: a GPU whose modules already run under the SIMT emulator is
/// refused with the way out in the message.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_launch_profile_is_refused_under_the_simt_executor() {
    let Some(dev) = standin_gpu(1, "simt") else {
        return;
    };
    let mut out = dev.alloc_zeros::<u32>(64).unwrap();
    // SAFETY: 64 threads, 64 outputs.
    unsafe {
        selftest::bounded_iota(
            &dev,
            LaunchConfig {
                grid: (1, 1, 1),
                block: (64, 1, 1),
                shared_bytes: 0,
            },
            &mut out,
            64,
        )
    }
    .unwrap();
    dev.synchronize().unwrap();
    let e = cuda::standin_profile(1, true).unwrap_err().to_string();
    assert!(
        e.contains("SIMT") && e.contains("NANODDP_STANDIN_EXEC=ptx"),
        "{e}"
    );
}
