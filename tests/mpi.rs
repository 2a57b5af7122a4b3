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
                .matches("out of place exact; in place 0 wrong elements over all ranks, results bitwise identical")
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

fn checkpoint_after(mut cmd: Command, extra: &[&str], path: &std::path::Path) -> Vec<Vec<f32>> {
    let subset = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fashion-mnist-subset"
    );
    let out = cmd
        .arg("train")
        .args(extra)
        .args([
            "--epochs",
            "1",
            "--max-steps",
            "6",
            "--batch",
            "96",
            "--data",
            subset,
            "--save",
        ])
        .arg(path)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    nanoddp::train::checkpoint::load(path)
        .expect("checkpoint")
        .weights
}

#[test]
fn training_across_processes_equals_training_in_one() {
    let dir = std::env::temp_dir().join(format!("nanoddp-mpi-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let one = checkpoint_after(
        Command::new(env!("CARGO_BIN_EXE_nanoddp")),
        &["--devices", "4"],
        &dir.join("one.safetensors"),
    );
    // 4 processes x 1 device: the same schedules and arithmetic, so the same bits.
    let four = checkpoint_after(
        mpirun(4),
        &["--comm", "mpi", "--devices", "1"],
        &dir.join("four.safetensors"),
    );
    assert_eq!(
        four, one,
        "4 processes x 1 device vs 4 devices in one process"
    );
    // 2 processes x 2 devices (local sum, then across): other summation order, same update.
    let two = checkpoint_after(
        mpirun(2),
        &["--comm", "mpi", "--devices", "2"],
        &dir.join("two.safetensors"),
    );
    let mut max = 0.0f32;
    for (a, b) in one.iter().flatten().zip(two.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
        max = max.max((a - b).abs());
    }
    assert!(max > 0.0 || one == two);
    // --algo mpi: MPI's own allreduce across the processes.
    let native = checkpoint_after(
        mpirun(2),
        &["--comm", "mpi", "--devices", "2", "--algo", "mpi"],
        &dir.join("native.safetensors"),
    );
    for (a, b) in one.iter().flatten().zip(native.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
