//! Running the `nanoddp` binary, for the tests of the command line (feature `cli`, which
//! builds it).

use std::path::PathBuf;
use std::process::{Command, Output};

/// The small Fashion-MNIST subset shipped in tests/data.
pub const SUBSET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/fashion-mnist-subset"
);

/// The `nanoddp` binary of this build, to be given arguments.
pub fn nanoddp() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nanoddp"))
}

/// Runs `cmd`, asserts that it succeeded (showing its stderr if not), and returns its output.
pub fn succeeds(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fresh, empty folder for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nanoddp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary folder");
    dir
}
