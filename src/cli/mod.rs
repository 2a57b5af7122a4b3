//! Subcommands of the `nanoddp` binary, one module each.

pub mod bench_allreduce;
pub mod bench_kernels;
pub mod info;
pub mod plot;
pub mod schedule;
pub mod train;
