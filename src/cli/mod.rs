//! Subcommands of the `nanoddp` binary, one module each.

pub mod bench_allreduce;
pub mod bench_kernels;
pub mod info;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod plot;
pub mod schedule;
pub mod train;

/// What `--comm mpi` says in a build without MPI.
#[cfg_attr(feature = "mpi", allow(dead_code))]
pub const NO_MPI: &str = "this nanoddp was built without MPI: rebuild with `cargo build --release --features mpi` (Debian: apt-get install openmpi-bin libopenmpi-dev libclang-dev)";
