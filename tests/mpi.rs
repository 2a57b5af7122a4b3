//! The MPI transport under mpirun (feature `mpi`; `.ci/run` builds and runs it): every
//! algorithm exact and bitwise identical across 2 to 5 processes, disagreements and late
//! ranks reported as errors, and training across processes equal to training in one.
#![cfg(feature = "mpi")]

use std::process::Command;
use std::time::Instant;

fn mpirun(n: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--mca",
        "btl",
        "self,vader",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        "-n",
    ])
    .arg(n.to_string())
    .arg(env!("CARGO_BIN_EXE_nanoddp"));
    c
}

#[test]
fn every_algorithm_is_exact_and_identical_on_2_to_5_processes() {
    for n in 2..=5 {
        let out = mpirun(n).arg("check-mpi").output().expect("mpirun runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "n={n}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // 5 algorithms x 5 counts, each exact and identical, then the mismatch on every rank.
        assert_eq!(
            stdout
                .matches("0 wrong elements over all ranks, results bitwise identical")
                .count(),
            25,
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("an error on all {n} ranks")),
            "{stdout}"
        );
    }
}

#[test]
fn a_late_rank_is_a_timeout_error_not_a_hang() {
    let start = Instant::now();
    let out = mpirun(3)
        .args(["check-mpi", "--late-rank"])
        .output()
        .expect("mpirun runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("timed out after 1.0 s waiting for every rank to start collective #1"),
        "{stderr}"
    );
    assert!(start.elapsed().as_secs() < 30, "took {:?}", start.elapsed());
}
