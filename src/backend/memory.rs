//! Device memory, as every backend has it: typed buffers ([`DeviceBuffer`]) of the element
//! types kernels take ([`DeviceScalar`]), allocation and copies ([`Memory`]), and the
//! [`Fence`] that orders one queue's work after another's.

use super::BackendError;
use crate::kernels::Scalar;

/// Element types device buffers may hold.
pub trait DeviceScalar:
    bytemuck::Pod + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Send + Sync + 'static
{
    /// The kernel-side type.
    const SCALAR: Scalar;
}

macro_rules! device_scalar {
    ($($t:ty => $s:ident),* $(,)?) => {
        $(impl DeviceScalar for $t { const SCALAR: Scalar = Scalar::$s; })*
    };
}
device_scalar!(f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16, i32 => I32, u32 => U32, i64 => I64, u64 => U64, u8 => U8);

/// A typed allocation in some backend's device memory.
pub trait DeviceBuffer<T: DeviceScalar> {
    /// Number of elements.
    fn len(&self) -> usize;
    /// True when it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The address kernels see for element 0.
    fn device_addr(&self) -> u64;
}

/// Typed buffers in some memory: a GPU's, an emulated device's, or the host's.
pub trait Memory {
    /// This backend's device buffer (movable to the thread that drives the device).
    type Buffer<T: DeviceScalar>: DeviceBuffer<T> + Send;

    /// Allocates `len` zeroed elements.
    fn alloc_zeros<T: DeviceScalar>(&self, len: usize) -> Result<Self::Buffer<T>, BackendError>;

    /// Copies `host` into a new buffer.
    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<Self::Buffer<T>, BackendError>;

    /// Copies `host` into `buf`, which must have the same length
    /// ([`BackendError::LengthMismatch`] otherwise, on every backend).
    fn write<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut Self::Buffer<T>,
    ) -> Result<(), BackendError> {
        super::check::same_len("host-to-device copy", host.len(), buf.len())?;
        self.copy_in(host, buf)
    }

    /// [`Memory::write`]'s copy, called with equal lengths.
    fn copy_in<T: DeviceScalar>(
        &self,
        host: &[T],
        buf: &mut Self::Buffer<T>,
    ) -> Result<(), BackendError>;

    /// Copies `buf` back to the host, after the device's queued work.
    fn download<T: DeviceScalar>(&self, buf: &Self::Buffer<T>) -> Result<Vec<T>, BackendError>;

    /// Waits until the device's queued work has finished.
    fn synchronize(&self) -> Result<(), BackendError>;

    /// Marks the work queued on this handle so far, for another thread (or another handle's
    /// queue) to wait for with [`Fence::wait`]. Backends whose operations complete before
    /// they return (the CPU, the SIMT emulator) keep this default: nothing to wait for.
    fn fence(&self) -> Result<Fence, BackendError> {
        Ok(Fence::done())
    }

    /// Another handle on the same device with its own queue of work: what it does is not
    /// ordered with this handle's work except through [`Memory::synchronize`] or a
    /// [`Fence`]. (The trainer computes on one queue and reduces gradients on another, so
    /// that the two overlap on a GPU.) Backends without queues hand out a plain clone.
    fn fork(&self) -> Result<Self, BackendError>
    where
        Self: Sized + Clone,
    {
        Ok(self.clone())
    }
}

/// A point in one device handle's queue: [`Fence::wait`] returns once everything queued on
/// that handle before [`Memory::fence`] was called has finished.
#[must_use = "a fence does nothing until it is waited for"]
pub struct Fence(Option<Box<dyn FnOnce() -> Result<(), BackendError> + Send>>);

impl Fence {
    /// A fence with nothing to wait for.
    pub fn done() -> Self {
        Fence(None)
    }

    /// A fence that waits by calling `wait`.
    pub fn new(wait: impl FnOnce() -> Result<(), BackendError> + Send + 'static) -> Self {
        Fence(Some(Box::new(wait)))
    }

    /// Blocks until the marked work has finished.
    pub fn wait(self) -> Result<(), BackendError> {
        self.0.map_or(Ok(()), |wait| wait())
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Fence(pending)"
        } else {
            "Fence(done)"
        })
    }
}
