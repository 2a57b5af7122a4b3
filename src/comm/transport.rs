//! How each backend executes a schedule step: `dst = scale · Σ sources`, where the sources
//! may be other ranks' memory. On the CPU a rank's thread reads its peers' buffers directly;
//! on a kernel device (SIMT, CUDA) the `collective.cu` kernel dereferences the peers'
//! addresses (the emulator's devices share the host address space; GPUs need peer access).

use std::collections::HashMap;

use half::{bf16, f16};

use crate::backend::cpu::CpuDevice;
use crate::backend::{
    BackendError, DeviceBuffer, KernelArg, KernelDevice, LaunchConfig, Memory, Precision,
    PrecisionOp,
};
use crate::dtype::DType;
use crate::kernels::collective;

/// A backend whose devices can take part in collectives.
pub trait CommDevice: Memory + Send {
    /// Per-rank state the transport keeps between steps (e.g. a device array of addresses).
    type State: Send;

    /// Prepares this rank's transport state (allocated once, on this device), given every
    /// device of the communicator (a GPU enables peer access to each of them here).
    fn comm_state(&self, all: &[Self]) -> Result<Self::State, BackendError>
    where
        Self: Sized;

    /// How many times slower than the hardware it stands for this device runs (1 for real
    /// devices; an emulator's kernels run far slower than a GPU's). A communicator scales its
    /// timeout by the largest factor among its devices, so waiting for a slow peer's backward
    /// pass is not mistaken for a dead peer, while a truly stuck one still ends in an error.
    fn slowdown(&self) -> u32 {
        1
    }

    /// Runs `r` ([`Reduction`]), or queues it on this device handle's queue: work queued
    /// on the handle afterwards, and any queue that waits for a mark recorded on it
    /// afterwards ([`Memory::record`]), sees its result.
    ///
    /// # Safety
    /// Every address must point at `r.len` live elements of `r.dtype`; no one else may write
    /// the sources or touch the destinations during the call (a destination may be a source).
    /// The schedule's waits ensure it.
    unsafe fn reduce(&self, state: &mut Self::State, r: Reduction<'_>) -> Result<(), BackendError>;
}

/// One reduction step over raw device addresses: `d[0..len] = scale · (src[0] + src[1] +
/// ...)[0..len]` for every `d` in `dsts`, summed in f32, left to right; per element all
/// sources are read before any destination is written.
#[derive(Debug, Clone, Copy)]
pub struct Reduction<'a> {
    /// The element type at every address.
    pub dtype: DType,
    /// Where the result goes.
    pub dsts: &'a [u64],
    /// What is summed, in this order.
    pub sources: &'a [u64],
    /// Elements at each address.
    pub len: usize,
    /// The factor applied to the sum (1 for a sum, 1/n for an average's last step).
    pub scale: f32,
}

/// Elements per block of the CPU loop: the running sum stays in L1.
const BLOCK: usize = 1024;

/// The CPU's reduce over raw addresses, a block of elements at a time (the running sums
/// stay in L1 while each source streams through once).
///
/// `T` is `r.dtype`'s element type, summed in f32 and rounded once per store.
///
/// # Safety
/// As [`CommDevice::reduce`].
unsafe fn cpu_reduce<T: Precision>(r: &Reduction<'_>) {
    let Reduction {
        dsts,
        sources,
        len,
        scale,
        ..
    } = *r;
    let mut acc = [0.0f32; BLOCK];
    let mut start = 0;
    while start < len {
        let m = BLOCK.min(len - start);
        for (k, &src) in sources.iter().enumerate() {
            // SAFETY: the caller guarantees `len` readable elements at every source.
            let s = unsafe { std::slice::from_raw_parts((src as *const T).add(start), m) };
            if k == 0 {
                acc[..m]
                    .iter_mut()
                    .zip(s)
                    .for_each(|(a, v)| *a = v.to_f32());
            } else {
                acc[..m]
                    .iter_mut()
                    .zip(s)
                    .for_each(|(a, v)| *a += v.to_f32());
            }
        }
        for &dst in dsts {
            // SAFETY: `len` writable elements at every destination, touched by no one else
            // during the call; this block of the sources has been read already.
            let d = unsafe { std::slice::from_raw_parts_mut((dst as *mut T).add(start), m) };
            d.iter_mut()
                .zip(&acc[..m])
                .for_each(|(d, a)| *d = T::from_f32(a * scale));
        }
        start += m;
    }
}

impl CommDevice for CpuDevice {
    type State = ();

    fn comm_state(&self, _: &[CpuDevice]) -> Result<(), BackendError> {
        Ok(())
    }

    unsafe fn reduce(&self, _: &mut (), r: Reduction<'_>) -> Result<(), BackendError> {
        // SAFETY: forwarded from the caller.
        unsafe {
            match r.dtype {
                DType::F32 => cpu_reduce::<f32>(&r),
                DType::F16 => cpu_reduce::<f16>(&r),
                DType::BF16 => cpu_reduce::<bf16>(&r),
            }
        }
        Ok(())
    }
}

/// Most ranks a communicator holds (a step sums at most one source per rank).
pub const MAX_RANKS: usize = 64;

/// Most address lists a kernel device keeps on the device ([`KernelState`]); past it they
/// are all dropped and uploaded again as steps need them.
const MAX_TABLES: usize = 4096;

/// A kernel device's state: the device arrays the kernel reads its addresses from, one per
/// list of addresses a step has used (sources, then destinations). A training run reduces
/// the same buffers every step, so after its first step no table is uploaded and a step is
/// one launch, with nothing for the host to wait for.
pub struct KernelState<D: KernelDevice> {
    tables: HashMap<Vec<u64>, D::Buffer<u64>>,
}

impl<D: KernelDevice + Send> CommDevice for D {
    type State = KernelState<D>;

    fn slowdown(&self) -> u32 {
        KernelDevice::slowdown(self)
    }

    fn comm_state(&self, all: &[D]) -> Result<KernelState<D>, BackendError> {
        for peer in all {
            self.enable_peer_access(peer)?;
        }
        // Loaded now, not at the first collective: a GPU may JIT a module for seconds, and a
        // collective's waits time out.
        if let Some(module) = crate::kernels::KernelModule::find(collective::REDUCE_SUM_F32.module)
        {
            self.preload(module)?;
        }
        Ok(KernelState {
            tables: HashMap::new(),
        })
    }

    unsafe fn reduce(
        &self,
        state: &mut KernelState<D>,
        r: Reduction<'_>,
    ) -> Result<(), BackendError> {
        if r.len == 0 {
            return Ok(());
        }
        let (sources, dsts) = (r.sources, r.dsts);
        let mut key = Vec::with_capacity(sources.len() + dsts.len());
        key.extend_from_slice(sources);
        key.extend_from_slice(dsts);
        if !state.tables.contains_key(&key) {
            if state.tables.len() >= MAX_TABLES {
                // Queued steps may still read the tables: let them finish first.
                self.synchronize()?;
                state.tables.clear();
            }
            // Uploaded on this queue, so the launch below reads it in place.
            let table = self.upload(&key)?;
            state.tables.insert(key.clone(), table);
        }
        let table = &state.tables[&key];
        let kernel = PrecisionOp::ReduceSum.kernel(r.dtype);
        let args = [
            KernelArg::buffer(table),
            KernelArg::I32(sources.len() as i32),
            KernelArg::I32(dsts.len() as i32),
            KernelArg::U64(r.len as u64),
            KernelArg::F32(r.scale),
        ];
        // SAFETY: the addresses are live buffers of `len` elements (the caller's contract);
        // the kernel touches exactly [0, len) of each. Queued, not waited for: the
        // communicator orders peers' queues after it by marks.
        unsafe { self.launch(kernel, LaunchConfig::flat(r.len.div_ceil(4)), &args) }
    }
}

/// Scratch memory of a rank (8-byte aligned), grown on demand; returns its address.
pub(crate) fn ensure_scratch<D: Memory>(
    dev: &D,
    scratch: &mut Option<D::Buffer<u64>>,
    bytes: usize,
) -> Result<u64, BackendError> {
    let words = bytes.div_ceil(8).max(8);
    if scratch.as_ref().is_none_or(|s| s.len() < words) {
        *scratch = Some(dev.alloc_zeros::<u64>(words)?);
    }
    Ok(scratch.as_ref().map_or(0, |s| s.device_addr()))
}
