//! How each backend executes a schedule step: `dst = scale · Σ sources`, where the sources
//! may be other ranks' memory. On the CPU a rank's thread reads its peers' buffers directly;
//! on a kernel device (SIMT, CUDA) the `collective.cu` kernel dereferences the peers'
//! addresses (the emulator's devices share the host address space; GPUs need peer access).

use half::f16;

use crate::backend::cpu::CpuDevice;
use crate::backend::{BackendError, Device, DeviceBuffer, KernelArg, LaunchConfig, Memory};
use crate::kernels::{collective, Scalar};

/// Element types the collectives move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// f32
    F32,
    /// IEEE half, summed in f32.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }

    fn scalar(self) -> Scalar {
        match self {
            DType::F32 => Scalar::F32,
            DType::F16 => Scalar::F16,
        }
    }
}

/// A backend whose devices can take part in collectives.
pub trait CommDevice: Memory + Send {
    /// Per-rank state the transport keeps between steps (e.g. a device array of addresses).
    type State: Send;

    /// Prepares this rank's transport state (allocated once, on this device).
    fn comm_state(&self) -> Result<Self::State, BackendError>;

    /// `dst[0..len] = scale · (src[0] + src[1] + ...)[0..len]`, in f32, left to right.
    ///
    /// # Safety
    /// Every address must point at `len` live elements of `dtype` that no one writes during
    /// the call (but `dst`, which may equal `sources[0]`); the schedule's waits ensure it.
    unsafe fn reduce(
        &self,
        state: &mut Self::State,
        dtype: DType,
        dst: u64,
        sources: &[u64],
        len: usize,
        scale: f32,
    ) -> Result<(), BackendError>;
}

/// Elements per block of the CPU loop: the running sum stays in L1.
const BLOCK: usize = 1024;

/// The CPU's reduce over raw addresses.
///
/// # Safety
/// As [`CommDevice::reduce`].
unsafe fn cpu_reduce<T: Copy>(
    dst: u64,
    sources: &[u64],
    len: usize,
    scale: f32,
    widen: impl Fn(T) -> f32,
    narrow: impl Fn(f32) -> T,
) {
    let mut acc = [0.0f32; BLOCK];
    let mut start = 0;
    while start < len {
        let m = BLOCK.min(len - start);
        for (k, &src) in sources.iter().enumerate() {
            // SAFETY: the caller guarantees `len` readable elements at every source.
            let s = unsafe { std::slice::from_raw_parts((src as *const T).add(start), m) };
            if k == 0 {
                acc[..m].iter_mut().zip(s).for_each(|(a, v)| *a = widen(*v));
            } else {
                acc[..m]
                    .iter_mut()
                    .zip(s)
                    .for_each(|(a, v)| *a += widen(*v));
            }
        }
        // SAFETY: the caller guarantees `len` writable elements at dst, which no one else
        // touches during the call; it may alias sources[0], which we have finished reading.
        let d = unsafe { std::slice::from_raw_parts_mut((dst as *mut T).add(start), m) };
        d.iter_mut()
            .zip(&acc[..m])
            .for_each(|(d, a)| *d = narrow(a * scale));
        start += m;
    }
}

impl CommDevice for CpuDevice {
    type State = ();

    fn comm_state(&self) -> Result<(), BackendError> {
        Ok(())
    }

    unsafe fn reduce(
        &self,
        _: &mut (),
        dtype: DType,
        dst: u64,
        sources: &[u64],
        len: usize,
        scale: f32,
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded from the caller.
        unsafe {
            match dtype {
                DType::F32 => cpu_reduce::<f32>(dst, sources, len, scale, |v| v, |v| v),
                DType::F16 => {
                    cpu_reduce::<f16>(dst, sources, len, scale, f16::to_f32, f16::from_f32)
                }
            }
        }
        Ok(())
    }
}

/// Most sources one step sums (every rank's input, for one-shot and direct).
pub const MAX_RANKS: usize = 64;

/// A kernel device's state: the device array the kernel reads source addresses from.
pub struct KernelState<D: Device> {
    addresses: D::Buffer<u64>,
}

impl<D: Device + Send> CommDevice for D {
    type State = KernelState<D>;

    fn comm_state(&self) -> Result<KernelState<D>, BackendError> {
        Ok(KernelState {
            addresses: self.alloc_zeros::<u64>(MAX_RANKS)?,
        })
    }

    unsafe fn reduce(
        &self,
        state: &mut KernelState<D>,
        dtype: DType,
        dst: u64,
        sources: &[u64],
        len: usize,
        scale: f32,
    ) -> Result<(), BackendError> {
        if len == 0 {
            return Ok(());
        }
        let mut table = [0u64; MAX_RANKS];
        table[..sources.len()].copy_from_slice(sources);
        self.write(&table, &mut state.addresses)?;
        let kernel = match dtype {
            DType::F32 => &collective::REDUCE_SUM_F32,
            DType::F16 => &collective::REDUCE_SUM_F16,
        };
        let args = [
            KernelArg::Ptr {
                addr: dst,
                elem: dtype.scalar(),
                mutable: true,
            },
            KernelArg::buffer(&state.addresses),
            KernelArg::I32(sources.len() as i32),
            KernelArg::U64(len as u64),
            KernelArg::F32(scale),
        ];
        // SAFETY: the addresses are live buffers of `len` elements (the caller's contract);
        // the kernel touches exactly [0, len) of each.
        unsafe { self.launch(kernel, LaunchConfig::flat(len.div_ceil(4)), &args)? };
        // The flag that publishes this step lives in host memory: the data must be in place
        // before it is raised.
        self.synchronize()
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
