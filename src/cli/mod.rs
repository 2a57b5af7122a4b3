//! Subcommands of the `nanoddp` binary, one module each.

pub mod bench;
pub mod info;
