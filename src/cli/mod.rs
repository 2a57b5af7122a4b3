//! Subcommands of the `nanoddp` binary, one module each.

pub mod info;
