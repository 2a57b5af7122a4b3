//! [`Collective`]: what a data-parallel trainer needs from its communication layer, one
//! rank's handle that sums a device buffer with every other rank's. An in-process
//! [`Rank`] is one; so is (feature `mpi`) a rank of a process group that reduces locally and
//! then across processes (`Hierarchical`, feature `mpi`).

use super::communicator::{CommError, Rank, ReduceOp};
use super::schedule::Algorithm;
use super::transport::CommDevice;
use crate::backend::{Backend, Memory};

/// How a rank sums buffers with all the others: an in-process [`Rank`], or (feature `mpi`)
/// a rank of a process group, reduced locally and then across processes.
pub trait Collective: Send {
    /// The device this rank computes on.
    type Device: CommDevice + Backend + Clone + 'static;
    /// This rank among all ranks (all processes).
    fn rank(&self) -> usize;
    /// All ranks.
    fn size(&self) -> usize;
    /// The device.
    fn device(&self) -> &Self::Device;
    /// Sums `buf` over all ranks, in place (`algorithm: None` picks by size).
    fn sum(
        &mut self,
        buf: &mut <Self::Device as Memory>::Buffer<f32>,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CommError>;
    /// Whether `flag` is true on any rank; every rank gets the same answer (the ranks agree
    /// on stopping). Exchanged between the ranks' threads, without device work.
    fn any(&mut self, flag: bool) -> Result<bool, CommError>;
}

impl<D: CommDevice + Backend + Clone + 'static> Collective for Rank<D> {
    type Device = D;
    fn rank(&self) -> usize {
        Rank::rank(self)
    }
    fn size(&self) -> usize {
        Rank::size(self)
    }
    fn device(&self) -> &D {
        Rank::device(self)
    }
    fn sum(
        &mut self,
        buf: &mut <D as Memory>::Buffer<f32>,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CommError> {
        self.all_reduce(buf, ReduceOp::Sum, algorithm)
    }
    fn any(&mut self, flag: bool) -> Result<bool, CommError> {
        Rank::any(self, flag)
    }
}
