//! Reduction across MPI processes (feature `mpi`), hierarchically as NCCL does across nodes:
//! each process drives `k` local devices (one in-process rank each); a sum first runs over
//! the local ranks with the in-process transport, then the process's leader (local rank 0)
//! sums across processes over MPI, then the leader's result is broadcast locally. Global
//! rank = process · k + local rank, so the data shards are exactly those of one process
//! with `processes · k` devices.

use std::sync::{Arc, Mutex};

use super::collective::Collective;
use super::communicator::{communicator, CommConfig, CommError, Rank, ReduceOp};
use super::mpi::{MpiAlgorithm, MpiComm};
use super::schedule::Algorithm;
use super::transport::CommDevice;
use crate::backend::{Backend, Memory};

/// One local rank of one MPI process.
pub struct Hierarchical<D: CommDevice> {
    local: Rank<D>,
    global: Arc<Mutex<MpiComm>>,
    /// How the leaders reduce across processes (`None`: as the local algorithm, by size).
    across: Option<MpiAlgorithm>,
}

impl<D: CommDevice + Backend + Clone + 'static> Hierarchical<D> {
    /// Connects `devices` (this process's) to each other and, through `mpi`, to the other
    /// processes' ranks. Every process must pass the same number of devices.
    pub fn connect(
        devices: Vec<D>,
        mpi: MpiComm,
        across: Option<MpiAlgorithm>,
    ) -> Result<Vec<Hierarchical<D>>, CommError> {
        let mut mpi = mpi;
        let k = devices.len();
        let mut counts = vec![k as f32];
        mpi.all_reduce(&mut counts, ReduceOp::Sum, Some(MpiAlgorithm::Native))?;
        if counts[0] != (k * mpi.size()) as f32 {
            return Err(CommError::Invalid {
                me: mpi.rank(),
                detail: format!(
                    "every process must drive the same number of devices: this one has {k}, \
                     the {} processes {} in all",
                    mpi.size(),
                    counts[0]
                ),
            });
        }
        let global = Arc::new(Mutex::new(mpi));
        Ok(communicator(devices, CommConfig::default())?
            .into_iter()
            .map(|local| Hierarchical {
                local,
                global: global.clone(),
                across,
            })
            .collect())
    }

    fn processes(&self) -> (usize, usize) {
        let g = self.global.lock().unwrap_or_else(|p| p.into_inner());
        (g.rank(), g.size())
    }
}

impl<D: CommDevice + Backend + Clone + 'static> Collective for Hierarchical<D> {
    type Device = D;

    fn rank(&self) -> usize {
        let (process, _) = self.processes();
        process * self.local.size() + self.local.rank()
    }

    fn size(&self) -> usize {
        let (_, processes) = self.processes();
        processes * self.local.size()
    }

    fn device(&self) -> &D {
        self.local.device()
    }

    fn sum(
        &mut self,
        buf: &mut <D as Memory>::Buffer<f32>,
        algorithm: Option<Algorithm>,
    ) -> Result<(), CommError> {
        if self.local.size() > 1 {
            self.local.all_reduce(buf, ReduceOp::Sum, algorithm)?;
        }
        if self.local.rank() == 0 {
            let me = Collective::rank(self);
            let device = |source| CommError::Device { me, source };
            let dev = self.local.device().clone();
            let mut host = dev.download(buf).map_err(device)?;
            let across = self.across.or(algorithm.map(MpiAlgorithm::Schedule));
            self.global
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .all_reduce(&mut host, ReduceOp::Sum, across)?;
            dev.write(&host, buf).map_err(device)?;
            // A collective returns with its result in place: the replica's queue reads it next.
            dev.synchronize().map_err(device)?;
        }
        if self.local.size() > 1 {
            self.local.broadcast(buf, 0)?;
        }
        Ok(())
    }

    fn any(&mut self, flag: bool) -> Result<bool, CommError> {
        // Over the local ranks, then the leaders across processes, then the leader's
        // answer over the local ranks again.
        let here = self.local.any(flag)?;
        let everywhere = if self.local.rank() == 0 {
            let mut votes = [f32::from(u8::from(here))];
            self.global
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .all_reduce(&mut votes, ReduceOp::Sum, Some(MpiAlgorithm::Native))?;
            votes[0] > 0.0
        } else {
            false
        };
        self.local.any(everywhere)
    }
}
