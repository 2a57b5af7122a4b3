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

/// The [`Memory::Mark`] part of a [`Memory`] impl for a backend whose work is done when it
/// is queued (the CPU, the SIMT emulator): nothing to mark, nothing to wait for.
#[macro_export]
macro_rules! no_marks {
    () => {
        type Mark = ();

        fn new_mark(&self) -> Result<(), $crate::backend::BackendError> {
            Ok(())
        }

        fn record(&self, _: &()) -> Result<(), $crate::backend::BackendError> {
            Ok(())
        }

        fn wait_mark(&self, _: &()) -> Result<(), $crate::backend::BackendError> {
            Ok(())
        }
    };
}

/// Typed buffers in some memory: a GPU's, an emulated device's, or the host's.
pub trait Memory {
    /// This backend's device buffer (movable to the thread that drives the device).
    type Buffer<T: DeviceScalar>: DeviceBuffer<T> + Send;

    /// A point in a queue that other queues wait for on the device, not on the host: a CUDA
    /// event, made once ([`Memory::new_mark`]) and set again at every
    /// [`Memory::record`]. Backends whose work is done when queued have nothing to mark
    /// (`()`). Unlike a [`Fence`], a mark orders queues without any thread waiting.
    type Mark: Send + Sync;

    /// A mark that stands at nothing yet (waiting for it waits for nothing).
    fn new_mark(&self) -> Result<Self::Mark, BackendError>;

    /// Sets `mark` after the work queued on this handle so far, replacing where it stood.
    fn record(&self, mark: &Self::Mark) -> Result<(), BackendError>;

    /// The work queued on this handle from now on runs after the work `mark` stood after
    /// when this is called (later [`Memory::record`]s of it do not matter), whichever handle
    /// or device of this backend recorded it. The host does not wait: a GPU does.
    fn wait_mark(&self, mark: &Self::Mark) -> Result<(), BackendError>;

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

    /// Host memory this device's kernels write and the host reads ([`Staging`]): on a GPU
    /// page-locked and mapped into the device's address space. Backends whose kernels run on
    /// the host keep this default (ordinary memory).
    fn alloc_staging<T: DeviceScalar>(&self, len: usize) -> Result<Staging<T>, BackendError> {
        Ok(Staging::host(len))
    }

    /// Whether [`Memory::begin_capture`] can record this handle's work as a [`Graph`].
    fn can_capture(&self) -> bool {
        false
    }

    /// From now on the work queued on this handle is recorded, not run, until
    /// [`Memory::end_capture`] makes a [`Graph`] of it: what a CUDA graph captures, whose
    /// kernel arguments are frozen at capture (device memory is read when the graph runs).
    /// Nothing queued while recording may wait for the device or allocate. Backends whose
    /// work is done when queued cannot record it: [`BackendError::Unsupported`].
    fn begin_capture(&self) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            op: "graph capture",
            what: "a backend whose work runs as it is queued".into(),
        })
    }

    /// Ends the recording [`Memory::begin_capture`] started and makes it a [`Graph`] ready
    /// to launch (one that does nothing when nothing was queued).
    fn end_capture(&self) -> Result<Graph, BackendError> {
        Err(BackendError::Unsupported {
            op: "graph capture",
            what: "a backend whose work runs as it is queued".into(),
        })
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

/// Work recorded from a queue ([`Memory::begin_capture`]) that [`Graph::launch`] queues
/// again, as one launch, on the queue it was recorded from: a CUDA graph. It stays on the
/// thread that captured it (a CUDA graph is not safe to share between threads).
pub struct Graph(Box<dyn Fn() -> Result<(), BackendError>>);

impl Graph {
    /// A graph that queues its work by calling `launch`.
    pub fn new(launch: impl Fn() -> Result<(), BackendError> + 'static) -> Self {
        Graph(Box::new(launch))
    }

    /// Queues the recorded work once more.
    pub fn launch(&self) -> Result<(), BackendError> {
        (self.0)()
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Graph")
    }
}

/// Host memory a device's kernels write while the host goes on ([`Memory::alloc_staging`]):
/// on a GPU page-locked and mapped, so that a kernel stores into it across the bus and
/// neither a copy nor a wait is needed; plain host memory on the backends whose kernels run
/// on the host. An element holds what a kernel wrote once a [`Fence`] marked after that
/// kernel is done. No copy ever targets it as a whole, so the elements other kernels do not
/// write keep their values while the device works (a copy's destination is undefined until
/// the copy completes).
pub struct Staging<T: DeviceScalar> {
    ptr: *mut T,
    len: usize,
    /// Where the device's kernels see element 0.
    device_addr: u64,
    /// Frees memory a backend allocated (None: `_owned` holds it).
    release: Option<Box<dyn FnOnce() + Send>>,
    /// The ordinary host memory `ptr` points into, kept alive (empty for a backend's).
    _owned: Vec<T>,
}

// SAFETY: the memory is owned by the value (a Vec, or a backend allocation freed by its
// `release`), and only read through `&self` / written by the device queue.
unsafe impl<T: DeviceScalar> Send for Staging<T> {}

impl<T: DeviceScalar> Staging<T> {
    /// `len` zeroed elements of ordinary host memory.
    pub fn host(len: usize) -> Self {
        let mut owned = vec![T::zeroed(); len];
        Staging {
            ptr: owned.as_mut_ptr(),
            len,
            device_addr: owned.as_mut_ptr() as u64,
            release: None,
            _owned: owned,
        }
    }

    /// Memory a backend allocated, seen by its kernels at `device_addr`, freed by `release`
    /// when the value is dropped.
    ///
    /// # Safety
    /// `ptr` must point to `len` initialized, aligned elements that stay valid (and are not
    /// used elsewhere) until `release` runs, and `device_addr` must be where the device's
    /// kernels see the same memory.
    pub unsafe fn from_raw(
        ptr: *mut T,
        len: usize,
        device_addr: u64,
        release: Box<dyn FnOnce() + Send>,
    ) -> Self {
        Staging {
            ptr,
            len,
            device_addr,
            release: Some(release),
            _owned: Vec::new(),
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the device's kernels see element 0 (for a kernel argument).
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// The elements as they are now. Each is read once, volatile: a device may be writing
    /// the memory (a kernel queued later than the [`Fence`] the caller waited for), and the
    /// compiler must not assume otherwise.
    pub fn read(&self) -> Vec<T> {
        (0..self.len)
            // SAFETY: `ptr` points to `len` initialized elements (see the constructors).
            .map(|i| unsafe { self.ptr.add(i).read_volatile() })
            .collect()
    }

    /// Overwrites element `i` (< `len`) with `value`, as a kernel would: for backends whose
    /// kernels run on the host.
    pub fn set(&mut self, i: usize, value: T) {
        assert!(i < self.len, "element {i} of {}", self.len);
        // SAFETY: `ptr` points to `len` elements, `i < len`; `&mut self` is exclusive.
        unsafe { self.ptr.add(i).write_volatile(value) };
    }
}

impl<T: DeviceScalar> Drop for Staging<T> {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// A point in one device handle's queue: [`Fence::wait`] returns once everything queued on
/// that handle before [`Memory::fence`] was called has finished; [`Fence::is_done`] says
/// whether it has, without waiting.
#[must_use = "a fence does nothing until it is waited for or asked"]
pub struct Fence {
    wait: Option<Box<dyn Fn() -> Result<(), BackendError> + Send>>,
    query: Option<Box<dyn Fn() -> Result<bool, BackendError> + Send>>,
}

impl Fence {
    /// A fence with nothing to wait for.
    pub fn done() -> Self {
        Fence {
            wait: None,
            query: None,
        }
    }

    /// A fence that waits by calling `wait` and asks by calling `query` (true once done).
    pub fn new(
        wait: impl Fn() -> Result<(), BackendError> + Send + 'static,
        query: impl Fn() -> Result<bool, BackendError> + Send + 'static,
    ) -> Self {
        Fence {
            wait: Some(Box::new(wait)),
            query: Some(Box::new(query)),
        }
    }

    /// Blocks until the marked work has finished.
    pub fn wait(&self) -> Result<(), BackendError> {
        self.wait.as_ref().map_or(Ok(()), |wait| wait())
    }

    /// Whether the marked work has finished, without waiting (an error the device reported
    /// meanwhile is returned).
    pub fn is_done(&self) -> Result<bool, BackendError> {
        self.query.as_ref().map_or(Ok(true), |query| query())
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.wait.is_some() {
            "Fence(pending)"
        } else {
            "Fence(done)"
        })
    }
}
