//! Subcommands of the `nanoddp` binary, one module each, and the exit-code convention they
//! share ([`Failure`]).

pub mod args;
pub mod bench_allreduce;
pub mod bench_kernels;
pub mod info;
pub mod metrics;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod nccl_table;
pub mod plot;
pub mod schedule;
pub mod train;

use std::error::Error;

/// The exit codes, as `nanoddp --help` states them.
pub const EXIT_CODES: &str = "Exit codes: 0 done (also when a reader of the output went away, \
as with `| head`); 2 bad input or settings, refused before any work (flags, data files, \
checkpoints, output paths, a device that is not there); 1 a failure while running (a device \
or collective error, a timeout, a diverging run, a write that failed).";

/// Why a subcommand stopped, which decides its exit code ([`EXIT_CODES`]).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Bad input or settings, found before any work: exit code 2.
    #[error("{0}")]
    Input(Box<dyn Error>),
    /// A failure while running: exit code 1.
    #[error("{0}")]
    Running(Box<dyn Error>),
}

impl Failure {
    /// The process's exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Input(_) => 2,
            Failure::Running(_) => 1,
        }
    }

    /// Whether this is a write to a reader that went away (`| head`): the output ends
    /// there, quietly, and the command counts as done.
    pub fn is_broken_pipe(&self) -> bool {
        let (Failure::Input(e) | Failure::Running(e)) = self;
        let mut cause: Option<&(dyn Error + 'static)> = Some(e.as_ref());
        while let Some(c) = cause {
            if c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return true;
            }
            cause = c.source();
        }
        false
    }
}

/// What a subcommand returns.
pub type Outcome = Result<(), Failure>;

/// Sorts a result's error into a [`Failure`]: `.input()?` for what the user must fix,
/// `.running()?` for what went wrong while working.
pub trait Classify<T> {
    /// The error is bad input or settings (exit code 2).
    fn input(self) -> Result<T, Failure>;
    /// The error happened while running (exit code 1).
    fn running(self) -> Result<T, Failure>;
}

impl<T, E: Into<Box<dyn Error>>> Classify<T> for Result<T, E> {
    fn input(self) -> Result<T, Failure> {
        self.map_err(|e| Failure::Input(e.into()))
    }
    fn running(self) -> Result<T, Failure> {
        self.map_err(|e| Failure::Running(e.into()))
    }
}
