//! A training step as CUDA graphs. At one rank the whole step is one graph. At several, the
//! compute between the step's collectives is: the stretch before the first bucket's
//! reduction, between each two, before the statistics' sum, and after it (the update and
//! the step's end); the collectives run from the stream between the stretches. A collective
//! decides on the host, from its peers' announces, which of their events its queue waits
//! for, and a rank's graph cannot wait for events its peers record in graphs of their own
//! (that takes external event nodes, which the stand-in does not model): so the stretches
//! are graphs and the collectives are not.

use crate::backend::{BackendError, Graph, Memory};

/// How a step's compute between its collectives is queued.
pub(super) enum Between<'g> {
    /// From the stream.
    Stream,
    /// Recorded: each stretch is captured, launched at once, and kept, in order.
    Capture(&'g mut Vec<Graph>),
}

impl Between<'_> {
    /// Starts a stretch on `dev`.
    pub(super) fn begin<D: Memory>(&mut self, dev: &D) -> Result<(), BackendError> {
        match self {
            Between::Stream => Ok(()),
            Between::Capture(_) => dev.begin_capture(),
        }
    }

    /// Ends a stretch on `dev`: recorded, it is launched now (the collective that follows
    /// reads what it computes) and kept for the step's replays.
    pub(super) fn cut<D: Memory>(&mut self, dev: &D) -> Result<(), BackendError> {
        match self {
            Between::Stream => Ok(()),
            Between::Capture(graphs) => {
                let graph = dev.end_capture()?;
                graph.launch()?;
                graphs.push(graph);
                Ok(())
            }
        }
    }
}
