//! The MPI transport under mpirun (feature `mpi`; `.ci/run` builds and runs it): every
//! algorithm exact and bitwise identical across 2 to 5 processes, disagreements and late
//! ranks reported as errors, and training across processes equal to training in one.
#![cfg(feature = "mpi")]

use std::process::Command;
use std::time::Instant;

fn mpirun(n: usize) -> Command {
    mpirun_with(n, &[])
}

/// mpirun with extra options of its own (they go before the program).
fn mpirun_with(n: usize, options: &[&str]) -> Command {
    let mut c = Command::new("mpirun");
    c.args(options);
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
    // The late rank's 10 s, and mpirun's start and end on a loaded machine: not a hang.
    assert!(start.elapsed().as_secs() < 60, "took {:?}", start.elapsed());
}

/// Trains on the shipped subset with `extra` and `settings`, saves to `path`, returns the weights.
fn checkpoint_with(
    mut cmd: Command,
    extra: &[&str],
    settings: &[&str],
    path: &std::path::Path,
) -> Vec<Vec<f32>> {
    let subset = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fashion-mnist-subset"
    );
    let out = cmd
        .arg("train")
        .args(extra)
        .args(settings)
        .args(["--data", subset, "--save"])
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

fn checkpoint_after(cmd: Command, extra: &[&str], path: &std::path::Path) -> Vec<Vec<f32>> {
    let settings = ["--epochs", "1", "--max-steps", "6", "--batch", "96"];
    checkpoint_with(cmd, extra, &settings, path)
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

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn cuda_ranks_as_processes_each_seeing_only_its_own_gpu() {
    // `--comm mpi --backend cuda` on the CPU stand-in for the driver, with every process
    // shown only "its" GPU (CUDA_VISIBLE_DEVICES=0, as under Slurm's GPU binding): 2
    // processes x 1 GPU must train like 2 CPU devices in one process.
    let dir = std::env::temp_dir().join(format!("nanoddp-mpi-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let settings = ["--epochs", "1", "--max-steps", "2", "--batch", "32"];
    let run = |cmd: Command, extra: &[&str], name: &str| {
        checkpoint_with(cmd, extra, &settings, &dir.join(name))
    };
    let cpu = run(
        Command::new(env!("CARGO_BIN_EXE_nanoddp")),
        &["--devices", "2"],
        "cpu.safetensors",
    );
    let standin = format!("LD_LIBRARY_PATH={}", nanoddp::backend::cuda::STANDIN_DIR);
    let cmd = mpirun_with(2, &["-x", &standin, "-x", "CUDA_VISIBLE_DEVICES=0"]);
    let cuda = run(
        cmd,
        &["--comm", "mpi", "--backend", "cuda", "--devices", "1"],
        "cuda.safetensors",
    );
    for (a, b) in cpu.iter().flatten().zip(cuda.iter().flatten()) {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
            "cpu {a} vs cuda {b}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
