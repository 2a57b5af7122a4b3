//! `collective.cu`'s reduce kernel, launched directly through `CommDevice::reduce` on the
//! SIMT emulator and the CUDA backend with the flat-launch cap lowered
//! (`common::small_flat_grids`), so that its grid-stride loop (four elements per thread per
//! pass) wraps many times. tests/collectives.rs runs the same kernel through the
//! communicator under the GPU's cap, where no test buffer needs a second pass. Inputs are
//! small integers times powers of two, so every sum is exact and the result is compared
//! with float64 at 0 ulp; outputs are poisoned first, and sources must come back untouched
//! unless they are also a destination.

mod common;

use half::{bf16, f16};
use nanoddp::backend::cpu::CpuDevice;
use nanoddp::backend::simt::{same_under_lane_orders, LaneOrder};
use nanoddp::backend::{BackendError, DeviceBuffer, Precision};
use nanoddp::comm::transport::{CommDevice, Reduction};
use nanoddp::dtype::DType;

/// Around one pass of the capped grid (3 blocks · 256 threads · 4 elements = 3072), lengths
/// that are not a multiple of 4, and enough for many passes.
const LENS: [usize; 9] = [1, 3, 5, 3071, 3072, 3073, 2 * 3072 + 4, 18_439, 100_003];

/// Source `k`'s element `i`: ((i mod 13) + 1) · 2^k (at most 13 · 7 = 91 summed: exact in
/// f32 and in half, and so is a quarter of it).
fn input(k: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i % 13) + 1) as f32 * (1u32 << k) as f32)
        .collect()
}

/// Every combination of 1..=3 sources, 1..=2 destinations, in and out of place, for one
/// element type; returns the bytes of every result.
fn reduce_all<D: CommDevice, T: Precision>(dev: &D, dtype: DType) -> Result<Vec<u8>, BackendError> {
    let mut state = dev.comm_state(std::slice::from_ref(dev))?;
    let mut out = Vec::new();
    for len in LENS {
        for nsrc in 1..=3 {
            for ndst in 1..=2 {
                for in_place in [false, true] {
                    let scale = if ndst == 2 { 0.25 } else { 1.0 };
                    let inputs: Vec<Vec<T>> = (0..nsrc)
                        .map(|k| input(k, len).into_iter().map(T::from_f32).collect())
                        .collect();
                    let mut srcs = inputs
                        .iter()
                        .map(|v| dev.upload(v))
                        .collect::<Result<Vec<_>, _>>()?;
                    let mut dsts = (0..ndst)
                        .map(|_| dev.upload(&vec![T::from_f32(f32::NAN); len]))
                        .collect::<Result<Vec<_>, _>>()?;
                    let src_addrs: Vec<u64> = srcs.iter().map(|b| b.device_addr()).collect();
                    let mut dst_addrs: Vec<u64> = dsts.iter().map(|b| b.device_addr()).collect();
                    if in_place {
                        dst_addrs[0] = src_addrs[0];
                    }
                    // SAFETY: every address is a live buffer of `len` elements of T on `dev`,
                    // and nothing else touches them during the call.
                    let step = Reduction {
                        dtype,
                        dsts: &dst_addrs,
                        sources: &src_addrs,
                        len,
                        scale,
                    };
                    unsafe { dev.reduce(&mut state, step)? };

                    let want: Vec<f64> = (0..len)
                        .map(|i| inputs.iter().map(|v| v[i].to_f32() as f64).sum::<f64>())
                        .map(|sum| sum * scale as f64)
                        .collect();
                    let what = format!(
                        "len {len}, {nsrc} source(s), {ndst} destination(s), in place {in_place}"
                    );
                    let mut results = Vec::new();
                    if in_place {
                        results.push(dev.download(&srcs.remove(0))?);
                        dsts.remove(0);
                    }
                    for d in &dsts {
                        results.push(dev.download(d)?);
                    }
                    for got in &results {
                        if let Some(i) = (0..len).find(|&i| got[i].to_f32() as f64 != want[i]) {
                            panic!("{what}: element {i} is {} not {}", got[i].to_f32(), want[i]);
                        }
                        out.extend(common::bytes(got));
                    }
                    for (k, s) in srcs.iter().enumerate() {
                        let k = k + usize::from(in_place);
                        let back = dev.download(s)?;
                        assert!(
                            back.iter()
                                .zip(&inputs[k])
                                .all(|(a, b)| a.to_f32() == b.to_f32()),
                            "{what}: source {k} changed"
                        );
                    }
                }
            }
        }
    }
    Ok(out)
}

fn reduce_both<D: CommDevice>(dev: &D) -> Result<Vec<u8>, BackendError> {
    let mut out = reduce_all::<D, f32>(dev, DType::F32)?;
    out.extend(reduce_all::<D, f16>(dev, DType::F16)?);
    out.extend(reduce_all::<D, bf16>(dev, DType::BF16)?);
    Ok(out)
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn simt_reduce_kernel_wraps_its_grid_stride_loop() {
    common::small_flat_grids();
    same_under_lane_orders(&[LaneOrder::Forward, LaneOrder::Reverse], reduce_both)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn cuda_reduce_kernel_wraps_its_grid_stride_loop() {
    // On a GPU, or on the CPU stand-in for the driver (never skipped).
    common::small_flat_grids();
    reduce_both(&common::cuda_device(0)).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cpu_reduce_agrees() {
    reduce_both(&CpuDevice::new()).unwrap_or_else(|e| panic!("{e}"));
}
