//! The command line: `nanoddp info` tells the truth about this build and this machine and
//! never fails because CUDA is missing; `train` refuses bad settings and output paths before
//! its first step, and stops a diverging run keeping the last checkpoint; a pause does not
//! kill a run; `--resume` continues only its own run and keeps its metrics; no subcommand
//! panics on bad input, and all share one exit-code convention.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::process::Command;

use common::cli::{nanoddp, scratch, SUBSET};
use nanoddp::backend::cuda;
use nanoddp::kernels::{MODULES, PREBUILT};

#[test]
fn info_describes_the_build_the_driver_and_the_cpu() {
    let out = nanoddp().arg("info").output().expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{text}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(concat!("nanoddp ", env!("CARGO_PKG_VERSION"))));
    match PREBUILT {
        Some(pre) => {
            assert!(text.contains(pre.nvcc_version), "names the nvcc release");
            // One resource row per kernel and architecture.
            for m in MODULES {
                for k in m.kernels {
                    for arch in pre.sass_archs {
                        let row = text.lines().find(|l| {
                            let cols: Vec<&str> = l.split_whitespace().collect();
                            cols.len() >= 3
                                && cols[0] == m.name
                                && cols[1] == k.name
                                && cols[2] == *arch
                        });
                        assert!(
                            row.is_some(),
                            "no resource row for {} on {arch}:\n{text}",
                            k.name
                        );
                    }
                }
            }
        }
        None => assert!(
            text.contains("compiled at run time"),
            "says kernels compile at run time:\n{text}"
        ),
    }
    if !cuda::driver_present() {
        assert!(
            text.contains("no CUDA driver found"),
            "explains the missing driver:\n{text}"
        );
    }
    assert!(text.contains("CPU:") && text.contains("threads available"));
}

#[test]
fn unknown_subcommands_fail_with_usage() {
    let out = nanoddp().arg("frobnicate").output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

#[test]
fn bench_kernels_prints_one_row_per_operation_with_a_rate() {
    let out = nanoddp()
        .args(["bench", "kernels", "--batch", "3", "--repeats", "1"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("measured peak f32"), "{text}");
    let ops = [
        "gemm 1024x1024x1024",
        // The model `nanoddp train` trains: conv 1->20 3x3, 20->50 5x5, fc 800->128->10.
        "conv1 forward 3 1x28x28 k3",
        "conv1 backward input",
        "conv1 backward filter",
        "conv2 forward 3 20x13x13 k5",
        "fc1 forward 3x128x800",
        "fc2 weight grad 10x128x3",
    ];
    for op in ops {
        let line = text
            .lines()
            .find(|l| l.starts_with(op))
            .unwrap_or_else(|| panic!("no row for {op}:\n{text}"));
        let gflops: f64 = line
            .split_whitespace()
            .rev()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0);
        assert!(gflops > 0.0, "{line}");
    }
}

#[test]
fn bench_rejects_a_zero_batch() {
    let out = nanoddp()
        .args(["bench", "kernels", "--batch", "0"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batch"));
}

/// `nanoddp train` on the shipped subset, with `args`.
fn train_command(args: &[&str]) -> Command {
    let mut cmd = nanoddp();
    cmd.arg("train").args(["--data", SUBSET]).args(args);
    cmd
}

/// `train` with `args` on the shipped subset, one epoch; returns (exit code, stderr).
fn train_with(args: &[&str]) -> (Option<i32>, String) {
    let out = train_command(&[&["--epochs", "1"], args].concat())
        .output()
        .expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_settings_and_output_paths_are_refused_before_the_first_step() {
    let dir = scratch("cli");
    let link = dir.join("link.safetensors");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/dev/null", &link).unwrap();
    let folder = dir.to_string_lossy().into_owned();
    let link_text = link.to_string_lossy().into_owned();
    // (arguments, what the one-line error must mention)
    let table: &[(&[&str], &str)] = &[
        (&["--batch", "0"], "--batch"),
        (&["--lr", "nan"], "--lr"),
        (&["--lr=-1"], "--lr"),
        (&["--lr=1e30"], "--lr"),
        (&["--lr", "0"], "--lr"),
        (&["--momentum", "5"], "--momentum"),
        (&["--momentum", "1"], "--momentum"),
        (&["--weight-decay=-3"], "--weight-decay"),
        (&["--save", "/dev/full"], "not a regular file"),
        (&["--save", &link_text], "not a regular file"),
        (&["--save", &folder], "not a regular file"),
        (&["--save", "/nonexistent/x.safetensors"], "does not exist"),
        (&["--plot", "/nonexistent/p.png"], "does not exist"),
        (&["--metrics", "/dev/full"], "not a regular file"),
    ];
    for (args, mention) in table {
        assert_refused(&[&["train", "--data", SUBSET][..], args].concat(), mention);
    }
    // Nothing was replaced.
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::metadata("/dev/full")
        .unwrap()
        .file_type()
        .is_char_device());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_diverging_run_stops_with_an_error_and_keeps_the_last_checkpoint() {
    let dir = scratch("diverge");
    let ckpt = dir.join("run.safetensors");
    std::fs::write(&ckpt, b"the previous checkpoint").unwrap();
    // Weights with a NaN: the loss is NaN from the first step, as after a divergence.
    let init = dir.join("nan.safetensors");
    let mut weights = nanoddp::train::initial_weights(nanoddp::train::Recipe::Default, 1);
    weights[6][0] = f32::NAN;
    nanoddp::train::checkpoint::save(&init, &nanoddp::train::from_weights(weights)).unwrap();
    let (code, err) = train_with(&[
        "--init",
        &init.to_string_lossy(),
        "--save",
        &ckpt.to_string_lossy(),
    ]);
    // Found while running: exit code 1.
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("diverged") && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(std::fs::read(&ckpt).unwrap(), b"the previous checkpoint");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `cmd`, reads the first bytes of its output and closes the pipe, as `| head -1`
/// does; returns how it ended.
fn read_then_hang_up(cmd: &mut Command) -> std::process::Output {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let mut stdout = child.stdout.take().expect("piped");
    let mut first = [0u8; 8];
    stdout.read_exact(&mut first).expect("some output");
    drop(stdout);
    child.wait_with_output().expect("ends")
}

#[test]
fn a_closed_pipe_ends_the_printing_not_the_run() {
    let dir = scratch("pipe");
    let ckpt = dir.join("run.safetensors");
    let ckpt_text = ckpt.to_string_lossy().into_owned();
    // Read the header line, then go away, as `| head -1` does.
    let out = read_then_hang_up(&mut train_command(&[
        "--epochs",
        "2",
        "--max-steps",
        "14",
        "--save",
        &ckpt_text,
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // 14 steps: epoch 1 whole, epoch 2 cut short at step 14.
    let saved = nanoddp::train::checkpoint::load(&ckpt).unwrap();
    assert_eq!((saved.epoch, saved.step), (1, 14));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `nanoddp` with `args`; returns (exit code, stdout, stderr).
fn nanoddp_with(args: &[&str]) -> (Option<i32>, String, String) {
    let out = nanoddp().args(args).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes an uncompressed IDX image file of `count` images of `side` x `side` pixels.
fn write_idx_images(path: &std::path::Path, count: u32, side: u32) {
    let mut bytes = Vec::new();
    for word in [0x0803, count, side, side] {
        bytes.extend_from_slice(&u32::to_be_bytes(word));
    }
    bytes.resize(bytes.len() + (count * side * side) as usize, 7);
    std::fs::write(path, bytes).unwrap();
}

/// Asserts that `nanoddp args` is refused before any work: exit code 2, no panic, an error
/// that mentions `mention`, one line of it unless clap adds its usage.
fn assert_refused(args: &[&str], mention: &str) {
    let (code, out, err) = nanoddp_with(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(
        err.contains(mention),
        "{args:?}: expected `{mention}` in: {err}"
    );
    assert!(
        !out.contains("epoch "),
        "{args:?} must fail before training: {out}"
    );
    if !err.contains("try '--help'") {
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn no_bad_input_panics_every_one_is_refused_with_exit_code_2_and_one_line() {
    let dir = scratch("table");
    // A data folder with one file missing, and one whose test images are 32x32.
    let partial = dir.join("partial");
    let wrong_size = dir.join("wrong-size");
    for d in [&partial, &wrong_size] {
        std::fs::create_dir_all(d).unwrap();
        for f in std::fs::read_dir(SUBSET).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, d.join(f.file_name().unwrap())).unwrap();
        }
    }
    std::fs::remove_file(partial.join("t10k-labels-idx1-ubyte.gz")).unwrap();
    std::fs::remove_file(wrong_size.join("t10k-images-idx3-ubyte.gz")).unwrap();
    write_idx_images(&wrong_size.join("t10k-images-idx3-ubyte"), 1000, 32);
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"not a checkpoint").unwrap();
    let (partial, wrong_size, garbage) = (
        partial.to_string_lossy().into_owned(),
        wrong_size.to_string_lossy().into_owned(),
        garbage.to_string_lossy().into_owned(),
    );
    // (arguments, what the error must mention)
    let table: &[(&[&str], &str)] = &[
        (&["train", "--data", SUBSET, "--batch", "0"], "--batch"),
        (
            &["train", "--data", SUBSET, "--batch", "3001"],
            "--batch 3001",
        ),
        (
            &["train", "--data", SUBSET, "--devices", "4", "--batch", "3"],
            "--batch 3",
        ),
        (&["train", "--data", SUBSET, "--devices", "0"], "--devices"),
        (&["train", "--data", SUBSET, "--devices", "65"], "--devices"),
        (&["train", "--data", SUBSET, "--epochs", "0"], "--epochs 0"),
        (
            &["train", "--data", SUBSET, "--max-steps", "0"],
            "--max-steps 0",
        ),
        (
            &["train", "--data", SUBSET, "--test-images", "0"],
            "--test-images 0",
        ),
        (
            &["train", "--data", SUBSET, "--test-images", "1001"],
            "holds 1000 test images",
        ),
        (&["train", "--data", SUBSET, "--timeout", "0"], "--timeout"),
        (
            &["train", "--data", SUBSET, "--timeout", "nan"],
            "--timeout",
        ),
        (&["train", "--data", SUBSET, "--timeout=-1"], "--timeout"),
        (
            &["train", "--data", SUBSET, "--timeout", "1e300"],
            "--timeout",
        ),
        (&["train", "--data", SUBSET, "--lr", "inf"], "--lr"),
        (
            &["train", "--data", SUBSET, "--momentum=-0.5"],
            "--momentum",
        ),
        (
            &["train", "--data", SUBSET, "--resume", &garbage],
            "garbage.safetensors",
        ),
        (
            &["train", "--data", SUBSET, "--init", "/nonexistent.st"],
            "/nonexistent.st",
        ),
        (&["train", "--data", SUBSET, "--algo", "mpi"], "--comm mpi"),
        (
            &["train", "--data", "/nonexistent/folder"],
            "/nonexistent/folder",
        ),
        (&["train", "--data", &partial], "t10k-labels-idx1-ubyte"),
        (&["train", "--data", &wrong_size], "test images are 32x32"),
        (
            &["eval", "--checkpoint", &garbage, "--data", SUBSET],
            "garbage",
        ),
        (
            &["eval", "--checkpoint", &garbage, "--batch", "0"],
            "--batch",
        ),
        (
            &["eval", "--checkpoint", &garbage, "--devices", "0"],
            "--devices",
        ),
        (&["schedule", "-n", "0"], "-n"),
        (&["schedule", "-n", "65"], "-n"),
        (
            &["schedule", "--count", "1000000000", "--slice", "1"],
            "--slice",
        ),
        (
            &["schedule", "--algo", "auto"],
            "possible values: ring, tree, direct, oneshot",
        ),
        (
            &["schedule", "--svg", "/nonexistent/s.svg"],
            "/nonexistent/s.svg",
        ),
        (&["bench", "kernels", "--batch", "0"], "--batch"),
        (&["bench", "kernels", "--batch", "100000"], "--batch"),
        (&["bench", "kernels", "--repeats", "0"], "--repeats"),
        (&["bench", "allreduce", "-n", "0"], "--ranks"),
        (&["bench", "allreduce", "-b", "64", "-e", "4"], "-e >= -b"),
        (
            &["bench", "allreduce", "-b", "8G", "-e", "8G", "-n", "64"],
            "lower -e or -n",
        ),
        (&["bench", "allreduce", "-b", "1X"], "unknown unit"),
        (&["bench", "allreduce", "--algo", "mpi"], "--comm mpi"),
    ];
    for (args, mention) in table {
        assert_refused(args, mention);
    }
    // The help names the convention.
    let (code, out, _) = nanoddp_with(&["--help"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("Exit codes: 0") && out.contains("2 bad input"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    // schedule: far more output than a pipe holds; info: a little.
    for args in [
        &["schedule", "-n", "16", "--count", "65536", "--slice", "4"][..],
        &["info"][..],
    ] {
        let out = read_then_hang_up(nanoddp().args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

#[test]
fn a_pause_longer_than_the_timeout_does_not_kill_the_run() {
    use std::io::Read;
    // Two devices, a 5 s timeout, and the whole process stopped for 8 s mid-training (as
    // Ctrl-Z and fg, or kill -STOP and -CONT): the waits leave the pause out. The timeout is
    // hundreds of times a step's wait for its peer even on a machine loaded by other work, so
    // only a pause that was counted could end the run.
    let mut child = train_command(&[
        "--devices",
        "2",
        "--epochs",
        "1",
        "--batch",
        "64",
        "--max-steps",
        "12",
        "--timeout",
        "5",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("runs");
    let mut stdout = child.stdout.take().unwrap();
    let mut header = [0u8; 8];
    stdout.read_exact(&mut header).unwrap(); // training has begun
    std::thread::sleep(std::time::Duration::from_millis(300));
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    std::thread::sleep(std::time::Duration::from_secs(8));
    signal("-CONT");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(rest.contains("epoch   1"), "{rest}");
}

#[test]
fn a_timeout_is_an_error_that_says_what_to_do() {
    // A timeout no real run could meet: the ranks give up at once on each other.
    let (code, err) = train_with(&[
        "--devices",
        "4",
        "--batch",
        "64",
        "--max-steps",
        "2",
        "--timeout",
        "0.000001",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("timed out"), "{err}");
    assert!(err.contains("raise --timeout"), "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert!(
        !err.contains("create a new one"),
        "advice for library users: {err}"
    );
}

#[test]
fn resume_continues_only_its_own_run_and_keeps_its_metrics() {
    use nanoddp::train::checkpoint;
    let dir = scratch("resume");
    let (ckpt, metrics) = (dir.join("run.safetensors"), dir.join("m.jsonl"));
    let (ckpt_t, metrics_t) = (
        ckpt.to_string_lossy().into_owned(),
        metrics.to_string_lossy().into_owned(),
    );
    // 3000 images in batches of 1000: 3 steps an epoch, 6 in the run.
    let run = [
        "--epochs",
        "2",
        "--batch",
        "1000",
        "--devices",
        "2",
        "--save",
        &ckpt_t,
    ];
    let new_run = || {
        nanoddp_with(
            &[
                &["train", "--data", SUBSET],
                &run[..],
                &["--metrics", &metrics_t],
            ]
            .concat(),
        )
    };
    let (code, _, err) = new_run();
    assert_eq!(code, Some(0), "{err}");
    let full = std::fs::read_to_string(&metrics).unwrap();
    assert_eq!(full.lines().count(), 8, "6 steps and 2 epochs:\n{full}");

    // A new run refuses to overwrite the metrics (`--overwrite` tells it to: the plot
    // test in tests/train.rs runs twice over one file with it).
    let (code, _, err) = new_run();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--overwrite") && err.contains("--resume"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&metrics).unwrap(), full);

    // The finished run: nothing to do, said so.
    let (code, out, err) = nanoddp_with(
        &[
            &["train", "--data", SUBSET],
            &run[..],
            &["--resume", &ckpt_t],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("nothing to do"), "{out}");

    // Settings that differ are refused, each named with both values.
    let other = [
        "--epochs",
        "3",
        "--batch",
        "500",
        "--devices",
        "2",
        "--resume",
        &ckpt_t,
    ];
    let (code, _, err) = nanoddp_with(&[&["train", "--data", SUBSET], &other[..]].concat());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("batch 1000 there, 500 here"), "{err}");
    assert!(err.contains("epochs 2 there, 3 here"), "{err}");
    assert!(!err.contains("devices"), "devices agree: {err}");

    // A crash after epoch 1: its checkpoint, and metrics that go on past it and end in a
    // torn line. Resuming keeps epoch 1's records, trains epoch 2 again, and appends.
    let mut at_epoch_1 = checkpoint::load(&ckpt).unwrap();
    at_epoch_1.epoch = 1;
    at_epoch_1.step = 3;
    checkpoint::save(&ckpt, &at_epoch_1).unwrap();
    std::fs::write(&metrics, format!("{full}{{\"step\":7,\"epo")).unwrap();
    let (code, out, err) = nanoddp_with(
        &[
            &["train", "--data", SUBSET],
            &run[..],
            &["--metrics", &metrics_t, "--resume", &ckpt_t],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("resuming") && out.contains("epoch   2"),
        "{out}"
    );
    let resumed = std::fs::read_to_string(&metrics).unwrap();
    let records: Vec<serde_json::Value> = resumed
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line a record"))
        .collect();
    let steps: Vec<u64> = records
        .iter()
        .filter(|r| r.get("loss").is_some())
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    let epochs: Vec<u64> = records
        .iter()
        .filter(|r| r.get("test_acc").is_some())
        .map(|r| r["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6], "{resumed}");
    assert_eq!(epochs, [1, 2], "{resumed}");
    assert_eq!(
        resumed.lines().take(4).collect::<Vec<_>>(),
        full.lines().take(4).collect::<Vec<_>>(),
        "epoch 1's records are kept as they were"
    );
    assert_eq!(checkpoint::load(&ckpt).unwrap().step, 6);
    std::fs::remove_dir_all(&dir).unwrap();
}
