//! The command line: `nanoddp info` tells the truth about this build and this machine and
//! never fails because CUDA is missing; `train` refuses bad settings and output paths before
//! its first step, and stops a diverging run keeping the last checkpoint; a pause does not
//! kill a run; `--resume` continues only its own run and keeps its metrics; no subcommand
//! panics on bad input, and all share one exit-code convention. Nothing a run writes is lost:
//! outputs are checked together before work, a failing side output never costs the
//! checkpoint, a diverged run stops at its step and never saves over a good checkpoint, every
//! write is whole. Memory checks read the process's limits; environment variables are
//! validated like flags.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::process::{Command, Output};

use common::cli::{nanoddp, scratch, succeeds, SUBSET};
use nanoddp::backend::cpu::isa::ISA_ENV;
use nanoddp::backend::cuda;
use nanoddp::backend::cuda::STANDIN_DIR;
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
            text.contains(
                "from the PTX shipped in kernels/ptx/ (compute_75, compute_80, compute_90)"
            ),
            "says the kernels are the shipped PTX:\n{text}"
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

/// On the CPU stand-in, `bench kernels --backend cuda` profiles one training step under the
/// PTX executor: a row per launch in both tables, the convolutions among them with FLOPs and
/// FMAs, and the step's total, whatever executor the environment chose.
#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn bench_kernels_on_the_standin_profiles_each_launch_of_a_step() {
    // The library path kept behind the stand-in's, as a user's would be.
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    for exec in ["simt", "ptx"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nanoddp"));
        cmd.args(["bench", "kernels", "--backend", "cuda", "--batch", "2"])
            .env("LD_LIBRARY_PATH", format!("{STANDIN_DIR}:{path}"))
            .env("NANODDP_STANDIN_EXEC", exec);
        for v in STANDIN_SETTINGS
            .iter()
            .filter(|v| **v != "NANODDP_STANDIN_EXEC")
        {
            cmd.env_remove(v);
        }
        let out = cmd.output().expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let launches: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("step: "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no step line:\n{text}"));
        assert!((10..40).contains(&launches), "{launches} launches:\n{text}");
        for kernel in [
            "conv2d_forward_64x64_f32",
            "conv2d_backward_input_planes_f32",
            "gemm_f32",
        ] {
            let rows: Vec<&str> = text.lines().filter(|l| l.contains(kernel)).collect();
            assert!(rows.len() >= 2, "{kernel} in both tables:\n{text}");
            // MFLOP and instructions per FFMA of the work table: positive.
            let f: Vec<&str> = rows[0].split_whitespace().collect();
            let mflop: f64 = f[8].parse().unwrap_or(0.0);
            let per_ffma: f64 = f[10].parse().unwrap_or(0.0);
            assert!(mflop > 0.0 && per_ffma >= 1.0, "{}", rows[0]);
        }
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
        (&["--lr", "-0.1"], "--lr -0.1 is out of range"),
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
    // Refused before any output, in words: no Rust value printed raw.
    assert!(out.is_empty(), "{args:?} printed before refusing: {out}");
    for raw in ["Error(", "Os {", "DriverError"] {
        assert!(!err.contains(raw), "{args:?}: raw `{raw}` in: {err}");
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
        (&["schedule", "-n", "0"], "-n/--ranks 0 is out of range"),
        (&["schedule", "--ranks", "65"], "-n/--ranks 65"),
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
        (&["bench", "kernels", "--batch", "0"], "--batch 0"),
        (&["bench", "kernels", "--batch", "100000"], "--batch 100000"),
        (&["bench", "kernels", "--repeats", "0"], "--repeats 0"),
        (&["bench", "allreduce", "-n", "0"], "-n/--ranks 0"),
        (&["bench", "allreduce", "-b", "0"], "-b/--minbytes 0"),
        (
            &["bench", "allreduce", "-b", "64", "-e", "4"],
            "-e/--maxbytes 4 is below -b/--minbytes 64",
        ),
        (&["bench", "allreduce", "-f", "1"], "-f/--stepfactor 1"),
        (
            &["bench", "allreduce", "-b", "8G", "-e", "8G", "-n", "64"],
            "lower -e or -n",
        ),
        (&["bench", "allreduce", "-b", "1X"], "unknown unit"),
        (&["bench", "allreduce", "--algo", "mpi"], "--comm mpi"),
        (
            &["bench", "allreduce", "-b", "5", "-e", "5"],
            "-b/--minbytes 5 is not a whole number of f32 elements (4 bytes each): give 4 or 8",
        ),
        (
            &["bench", "allreduce", "-b", "4", "-e", "1001"],
            "give 1000 or 1004",
        ),
        (&["schedule", "--slice", "0"], "--slice 0"),
        (&["schedule", "--count", "0"], "--count 0"),
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
    use std::io::{BufRead, Read};
    // Eight devices, a 3 s timeout, and the whole process stopped for 4 s (as Ctrl-Z and fg,
    // or kill -STOP and -CONT) as each of the first two epochs' lines is read: the waits
    // leave the pauses out. The timeout is hundreds of times a step's wait for its peer even
    // on a machine loaded by other work, so only a pause that was counted could end the run.
    // A pause counts only if it catches a rank waiting; eight ranks on a few cores, paused
    // twice, catch one almost always (counting the pauses failed this test 8 times in 10).
    let mut child = train_command(&[
        "--devices",
        "8",
        "--epochs",
        "3",
        "--batch",
        "64",
        "--test-images",
        "50",
        "--timeout",
        "3",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("runs");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig}");
    };
    // Each epoch line's seconds, and when the test read it.
    let mut lines = Vec::new();
    for epoch in ["epoch   1", "epoch   2", "epoch   3"] {
        let mut line = String::new();
        while !line.starts_with(epoch) {
            line.clear();
            let read = stdout.read_line(&mut line).unwrap();
            assert!(read > 0, "the run ended before the line {epoch:?}");
        }
        lines.push((epoch_seconds(&line), std::time::Instant::now()));
        if epoch != "epoch   3" {
            signal("-STOP");
            std::thread::sleep(std::time::Duration::from_secs(4));
            signal("-CONT");
        }
    }
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // An epoch's seconds leave the pause out too: epochs 2 and 3, each paused for 4 s after
    // the line before it, report less than the wall time between the two lines less the
    // pause. The 2 s of slack is for the line's way to this test, late on a loaded machine;
    // a pause counted would overshoot by 4 s.
    for pair in lines.windows(2) {
        let ((_, read_before), (seconds, read)) = (pair[0], pair[1]);
        let wall = read.duration_since(read_before).as_secs_f64();
        assert!(
            seconds < wall - 4.0 + 2.0,
            "a pause counted: {seconds} s reported, {wall} s between the lines"
        );
    }
}

/// The seconds an `epoch` line reports.
fn epoch_seconds(line: &str) -> f64 {
    line.split("  ")
        .find_map(|f| f.trim().strip_suffix(" s")?.parse().ok())
        .unwrap_or_else(|| panic!("no seconds in {line:?}"))
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

/// A small tmpfs mounted for one test, unmounted when dropped: a disk that fills. Mounting
/// needs root; CI runs as root, so there (and wherever `NANODDP_EXPECT_TMPFS=1`) a mount
/// that fails fails the test. Elsewhere the test says it skipped and returns early.
struct TmpFs(std::path::PathBuf);

impl TmpFs {
    fn mount(at: &std::path::Path, kib: usize) -> Option<TmpFs> {
        std::fs::create_dir_all(at).unwrap();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let required = root || std::env::var_os("NANODDP_EXPECT_TMPFS").is_some_and(|v| v == "1");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(at)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(TmpFs(at.to_path_buf())),
            other => {
                assert!(
                    !required,
                    "a tmpfs could not be mounted at {} (running as root, or NANODDP_EXPECT_TMPFS=1): {other:?}",
                    at.display()
                );
                eprintln!("skipped: mounting a tmpfs needs root");
                None
            }
        }
    }

    /// Fills the file system: a file as large as it takes.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        while f.write_all(&[0u8; 1024]).is_ok() {}
    }
}

impl Drop for TmpFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// LeNet's initial weights with `fc2.weight` at 1e38: finite, but every forward pass
/// overflows, so the loss is NaN from the first step (fp16/bf16 skip such steps and keep the
/// weights finite, as after a divergence).
fn overflowing_weights() -> nanoddp::train::checkpoint::Checkpoint {
    let mut weights = nanoddp::train::initial_weights(nanoddp::train::Recipe::Default, 1);
    let fc2 = nanoddp::model::PARAMS
        .iter()
        .position(|p| p.name == "fc2.weight")
        .unwrap();
    weights[fc2].iter_mut().for_each(|w| *w = 1e38);
    nanoddp::train::from_weights(weights)
}

/// Runs `train` with `args` on the shipped subset; returns (exit code, stdout, stderr).
fn train_output(args: &[&str]) -> (Option<i32>, String, String) {
    let out = train_command(args).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `epoch N` lines a run printed.
fn epoch_lines(stdout: &str) -> usize {
    stdout.lines().filter(|l| l.starts_with("epoch ")).count()
}

/// Every line of a metrics file is a whole JSON record, the last one ended by its newline.
fn assert_whole_records(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "torn: {text}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[test]
fn outputs_that_are_one_file_or_an_unwritten_format_are_refused_before_any_work() {
    let dir = scratch("outputs");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let at = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let (ckpt, metrics, notes, nan) = (
        at("x.safetensors"),
        at("m.jsonl"),
        at("notes.txt"),
        at("nan.safetensors"),
    );
    let dotted = logs.join("../x.safetensors").to_string_lossy().into_owned();
    std::fs::write(&metrics, "{}\n").unwrap();
    std::fs::write(&notes, "my notes\n").unwrap();
    let hard = at("hard.jsonl");
    std::fs::hard_link(&metrics, &hard).unwrap();
    let mut weights = nanoddp::train::initial_weights(nanoddp::train::Recipe::Default, 1);
    weights[2][5] = f32::NAN;
    nanoddp::train::checkpoint::save(
        std::path::Path::new(&nan),
        &nanoddp::train::from_weights(weights),
    )
    .unwrap();
    let table: &[(&[&str], &str)] = &[
        (
            &["train", "--plot", &at("p.txt")],
            "end the name in .png or .svg",
        ),
        (
            &["train", "--plot", &at("curves")],
            "end the name in .png or .svg",
        ),
        (
            &["train", "--save", &ckpt, "--metrics", &ckpt],
            "are the same file",
        ),
        (
            &["train", "--save", &dotted, "--metrics", &ckpt],
            "are the same file",
        ),
        (
            &["train", "--metrics", &at("p.png"), "--plot", &at("p.png")],
            "are the same file",
        ),
        (
            &["train", "--save", &hard, "--metrics", &metrics],
            "are the same file",
        ),
        (
            &["train", "--metrics", &nan, "--init", &nan],
            "are the same file",
        ),
        (&["train", "--save", &notes], "not a nanoddp checkpoint"),
        (
            &["train", "--save", &metrics, "--plot", &at("p.png")],
            "not a nanoddp checkpoint",
        ),
        (
            &["train", "--init", &nan],
            "`conv2.weight` holds a value that is not finite",
        ),
        (
            &["train", "--resume", &nan],
            "`conv2.weight` holds a value that is not finite",
        ),
        (
            &["eval", "--checkpoint", &nan],
            "`conv2.weight` holds a value that is not finite",
        ),
        (
            &["schedule", "--svg", &at("ring.png")],
            "end the name in .svg",
        ),
    ];
    for (args, mention) in table {
        let args: Vec<&str> = if args[0] == "train" {
            [&args[..1], &["--data", SUBSET], &args[1..]].concat()
        } else {
            args.to_vec()
        };
        assert_refused(&args, mention);
    }
    // Nothing was touched.
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
    assert_eq!(std::fs::read_to_string(&metrics).unwrap(), "{}\n");
    assert!(!std::path::Path::new(&ckpt).exists());
    // --overwrite says the unrelated file may go.
    let (code, _, err) = train_output(&[
        "--max-steps",
        "1",
        "--test-images",
        "10",
        "--save",
        &notes,
        "--overwrite",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let saved = nanoddp::train::checkpoint::load(std::path::Path::new(&notes)).unwrap();
    assert_eq!(saved.step, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failing_side_output_stops_the_run_at_once_and_never_costs_the_checkpoint() {
    let dir = scratch("side-output");
    let Some(disk) = TmpFs::mount(&dir.join("full"), 8) else {
        return;
    };
    let ckpt = dir.join("run.safetensors");
    let ckpt_text = ckpt.to_string_lossy().into_owned();
    // The plot's disk is full from the start: the first epoch's checkpoint is written, then
    // the plot fails and the run stops there.
    disk.fill();
    let plot = disk.0.join("curves.png").to_string_lossy().into_owned();
    let (code, out, err) = train_output(&[
        "--epochs",
        "3",
        "--test-images",
        "50",
        "--save",
        &ckpt_text,
        "--plot",
        &plot,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("writing the plot") && err.contains("No space left"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("holds the last good state: epoch 1"), "{err}");
    assert_eq!(epoch_lines(&out), 1, "stopped after the failure: {out}");
    assert_eq!(nanoddp::train::checkpoint::load(&ckpt).unwrap().epoch, 1);
    assert!(!disk.0.join("curves.png").exists());
    std::fs::remove_file(disk.0.join("filler")).unwrap();
    // The metrics' disk (8 KiB) fills in the fourth epoch or so: the run stops at the next
    // step, every record in the file is whole, and the checkpoint holds the last epoch
    // whose record was written before it.
    std::fs::remove_file(&ckpt).unwrap();
    let metrics = disk.0.join("m.jsonl");
    let (code, out, err) = train_output(&[
        "--epochs",
        "9",
        "--test-images",
        "50",
        "--save",
        &ckpt_text,
        "--metrics",
        &metrics.to_string_lossy(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("writing the metrics") && err.contains("No space left"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    let records = assert_whole_records(&metrics);
    let saved = nanoddp::train::checkpoint::load(&ckpt).unwrap();
    assert!((2..9).contains(&saved.epoch), "{saved:?}");
    assert_eq!(
        epoch_lines(&out),
        saved.epoch,
        "no epoch after the failure: {out}"
    );
    assert!(
        err.contains(&format!("epoch {}, step {}", saved.epoch, saved.step)),
        "{err}"
    );
    let last_step = records
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .max()
        .unwrap();
    assert!(
        last_step as usize >= saved.step,
        "{last_step} {}",
        saved.step
    );
    std::fs::remove_dir_all(dir.join("full")).ok();
    drop(disk);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_picture_written_over_a_good_one_on_a_full_disk_leaves_it_whole() {
    let dir = scratch("svg-full");
    let Some(disk) = TmpFs::mount(&dir.join("full"), 64) else {
        return;
    };
    let svg = disk.0.join("ring.svg");
    let svg_text = svg.to_string_lossy().into_owned();
    succeeds(nanoddp().args(["schedule", "--svg", &svg_text]));
    let good = std::fs::read(&svg).unwrap();
    disk.fill();
    let (code, _, err) = nanoddp_with(&["schedule", "-n", "16", "--svg", &svg_text]);
    assert_eq!(
        code,
        Some(1),
        "a failed write is a failure while running: {err}"
    );
    assert!(err.contains("No space left"), "{err}");
    assert_eq!(
        std::fs::read(&svg).unwrap(),
        good,
        "the old picture is intact"
    );
    let names: Vec<_> = std::fs::read_dir(&disk.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
    drop(disk);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn divergence_stops_the_run_at_the_step_it_shows_and_never_replaces_a_good_checkpoint() {
    let dir = scratch("diverge");
    let ckpt = dir.join("run.safetensors");
    let ckpt_text = ckpt.to_string_lossy().into_owned();
    let metrics = dir.join("m.jsonl");
    let metrics_text = metrics.to_string_lossy().into_owned();
    // Another run's checkpoint at the same place (epoch 1, step 12) as this run's first
    // save: the message must tell a replaced file from one left as it was.
    succeeds(&mut train_command(&[
        "--max-steps",
        "12",
        "--test-images",
        "10",
        "--save",
        &ckpt_text,
    ]));
    let before = std::fs::read(&ckpt).unwrap();
    // fp32 at lr 100 with momentum: the loss passes the rule's bound while still finite, at
    // step 2 (a check of NaN and infinity alone ran on through epochs of losses near 1e36).
    let (code, out, err) = train_output(&[
        "--lr",
        "100",
        "--epochs",
        "4",
        "--test-images",
        "50",
        "--save",
        &ckpt_text,
        "--metrics",
        &metrics_text,
    ]);
    assert_eq!(code, Some(1), "{err}");
    let step: usize = err
        .split("diverged at step ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("names the step: {err}"));
    // Stopped at that step: its record is the metrics' last, with its finite loss past the
    // rule's bound.
    let records = assert_whole_records(&metrics);
    let last = records.last().unwrap();
    assert_eq!(last["step"].as_u64(), Some(step as u64));
    assert!(
        last["loss"]
            .as_f64()
            .is_some_and(|l| l > nanoddp::train::diverged_loss()),
        "{last}"
    );
    let rule = format!("over {:.0}", nanoddp::train::diverged_loss());
    assert!(err.contains(&rule), "the finite loss past the bound: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // Stopped before the first epoch's end: the other run's checkpoint is as it was, byte for
    // byte, and the message says so.
    let spe = 3000usize.div_ceil(256);
    assert!(step <= spe, "stopped at step {step}");
    assert_eq!(epoch_lines(&out), 0, "{out}");
    assert_eq!(std::fs::read(&ckpt).unwrap(), before);
    assert!(err.contains("is as it was: epoch 1, step 12"), "{err}");
    // --help states the rule with the library's bound.
    let (_, help, _) = nanoddp_with(&["train", "--help"]);
    assert!(help.contains(&rule), "{help}");
    // In every precision, a NaN loss from the first step (16-bit formats skip such steps and
    // keep finite weights) stops the run there and leaves the existing checkpoint alone.
    let init = dir.join("overflowing.safetensors");
    nanoddp::train::checkpoint::save(&init, &overflowing_weights()).unwrap();
    succeeds(&mut train_command(&[
        "--max-steps",
        "2",
        "--test-images",
        "10",
        "--save",
        &ckpt_text,
    ]));
    let good = std::fs::read(&ckpt).unwrap();
    for precision in ["fp32", "fp16", "bf16"] {
        let (code, out, err) = train_output(&[
            "--precision",
            precision,
            "--epochs",
            "3",
            "--init",
            &init.to_string_lossy(),
            "--save",
            &ckpt_text,
            "--metrics",
            &metrics_text,
            "--overwrite",
        ]);
        assert_eq!(code, Some(1), "{precision}: {err}");
        assert!(
            err.contains("diverged at step 1 (epoch 1)"),
            "{precision}: {err}"
        );
        assert!(
            err.contains(&format!("{ckpt_text} is as it was: epoch 1 (part), step 2")),
            "{err}"
        );
        assert_eq!(epoch_lines(&out), 0, "{precision}: {out}");
        assert_eq!(
            assert_whole_records(&metrics).len(),
            1,
            "{precision}: one step"
        );
        assert_eq!(std::fs::read(&ckpt).unwrap(), good, "{precision}: kept");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_interrupted_run_keeps_its_save_whole_and_says_how_to_continue_which_goes_on_saving() {
    let dir = scratch("interrupted");
    let ckpt = dir.join("run.safetensors");
    let ckpt_text = ckpt.to_string_lossy().into_owned();
    let args = [
        "--epochs",
        "8",
        "--test-images",
        "10",
        "--batch",
        "1000",
        "--save",
        &ckpt_text,
    ];
    let child = train_command(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // After the first save, SIGINT at the first sight of the next one: mid-write where its
    // temporary file is caught, else just after it replaced the first.
    let started = std::time::Instant::now();
    let waited_too_long = || started.elapsed().as_secs() > 120;
    while !ckpt.exists() && !waited_too_long() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let first = std::fs::read(&ckpt).expect("the first epoch's save");
    loop {
        let saving = std::fs::read_dir(&dir).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp.")
        });
        if saving || std::fs::read(&ckpt).is_ok_and(|b| b != first) || waited_too_long() {
            break;
        }
    }
    let pid = child.id().to_string();
    succeeds(Command::new("kill").args(["-INT", &pid]));
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("interrupted by SIGINT (Ctrl-C)"), "{err}");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "run.safetensors")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let saved = nanoddp::train::checkpoint::load(&ckpt).expect("a whole checkpoint");
    assert!(
        err.contains(&format!(
            "{ckpt_text} holds the last good state: epoch {}, step {}",
            saved.epoch, saved.step
        )),
        "{err}"
    );
    // The command it prints continues the run; without --save it saves where it resumed.
    let command = err
        .split("continue with: ")
        .nth(1)
        .unwrap_or_else(|| panic!("a continue command: {err}"))
        .trim_end();
    assert!(!command.contains("--save"), "{command}");
    let words: Vec<&str> = command.split(' ').collect();
    assert_eq!(words[0], env!("CARGO_BIN_EXE_nanoddp"));
    let out = succeeds(Command::new(words[0]).args(&words[1..]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("saving to {ckpt_text} after every epoch")),
        "{stdout}"
    );
    let done = nanoddp::train::checkpoint::load(&ckpt).unwrap();
    assert_eq!((done.epoch, done.step), (8, 24), "the whole run, saved");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_save_removes_the_temporary_files_of_an_interrupted_one() {
    let dir = scratch("orphans");
    // A process that has ended: its pid names a save that was killed mid-write.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let live = std::process::id();
    let orphan = dir.join(format!(".tmp.{dead}.0.run.safetensors"));
    let kept = [
        dir.join(format!(".tmp.{live}.0.run.safetensors")), // a live process's save
        dir.join(format!(".tmp.{dead}.0.other.safetensors")), // another target's
        dir.join(".tmp.x.0.run.safetensors"),               // not one of ours
    ];
    for f in kept.iter().chain([&orphan]) {
        std::fs::write(f, vec![0u8; 1 << 20]).unwrap();
    }
    succeeds(&mut train_command(&[
        "--max-steps",
        "1",
        "--test-images",
        "10",
        "--save",
        &dir.join("run.safetensors").to_string_lossy(),
    ]));
    assert!(!orphan.exists(), "the killed save's file is removed");
    for f in &kept {
        assert!(f.exists(), "{} kept", f.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// Memory checks read the limits that apply to the process, not only the machine's free
// memory: a sweep past `ulimit -v` is refused before any work (exit code 2, one line naming
// the limit) instead of aborting on a failed allocation (exit 134).

/// The address-space limit the tests set, in KiB (`ulimit -v` counts KiB): about 1.9 GiB.
const LIMIT_KIB: u64 = 2_000_000;

/// Runs `nanoddp args...` under `ulimit -v LIMIT_KIB`.
fn under_ulimit(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_nanoddp"))
        .args(args)
        .output()
        .expect("runs sh")
}

#[test]
fn a_sweep_past_the_address_space_limit_is_refused_naming_the_limit() {
    // 2 ranks x 7 copies of 256 MiB: 3.5 GiB, far past the 1.9 GiB the limit allows.
    let out = under_ulimit(&["bench", "allreduce", "-n", "2", "-b", "256M", "-e", "256M"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(2),
        "refused as bad input, not aborted (134): {stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("lower -e or -n"), "{stderr}");
    assert!(stdout.is_empty(), "refused before any work: {stdout}");
    // Where another limit is tighter still (a small cgroup or machine), that one is named.
    let others = nanoddp::system::memory_bound().expect("Linux reports free memory");
    if others.bytes > LIMIT_KIB * 1024 {
        assert!(
            stderr.contains("address-space limit (ulimit -v) leaves 1.9 GiB"),
            "names the limit that binds: {stderr}"
        );
    } else {
        eprintln!("note: {others}, below the ulimit: that limit is the one named");
    }
}

#[test]
fn a_sweep_within_the_address_space_limit_still_runs() {
    // What the process maps already is counted, but not so generously that a small sweep
    // (and the 2 x 256 MiB copy-bandwidth probe before it) is refused under the limit.
    let out = under_ulimit(&["bench", "allreduce", "-n", "2", "-b", "4K", "-e", "4K"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l.trim_start().starts_with("4096")),
        "a row for 4 KiB: {stdout}"
    );
}

// Environment variables that set behaviour are validated like flags: a bad value is refused
// before any work (exit code 2) by an error naming the variable and the values it accepts,
// never silently replaced by a default. A data folder that is not one is reported as what
// it is (a file, a symbolic-link loop), not as "not found".

/// The stand-in's settings, removed from every child so that the CI's own (such as
/// `NANODDP_STANDIN_EXEC=ptx`) do not mix with the one a test sets.
const STANDIN_SETTINGS: [&str; 5] = [
    "NANODDP_STANDIN_GPUS",
    "NANODDP_STANDIN_EXEC",
    "NANODDP_STANDIN_JIT_MS",
    "NANODDP_STANDIN_RANGE_GIB",
    "NANODDP_KERNEL_TIMEOUT_S",
];

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts that `out` is a refusal (exit code 2) whose stderr holds every one of `mentions`.
fn assert_refused_with(out: &Output, mentions: &[&str]) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code: {stderr}");
    for m in mentions {
        assert!(stderr.contains(m), "expected {m:?} in: {stderr}");
    }
}

#[test]
fn a_cpu_isa_name_it_does_not_know_is_refused_naming_the_variable() {
    let out = nanoddp()
        .args(["bench", "kernels"])
        .env(ISA_ENV, "avx3")
        .output()
        .expect("runs");
    assert_refused_with(
        &out,
        &["NANODDP_CPU_ISA=avx3: expected `portable`", "`native`"],
    );
    // `info`, which says which levels exist, reports it as a line and goes on.
    let out = succeeds(nanoddp().arg("info").env(ISA_ENV, "avx3"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("NANODDP_CPU_ISA is refused: NANODDP_CPU_ISA=avx3")
            && stdout.contains("this CPU allows portable"),
        "{stdout}"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `nanoddp info` names, per operation, what runs it, for the level the process uses.
#[test]
fn info_prints_the_cpu_backends_plan_per_operation() {
    let out = nanoddp()
        .arg("info")
        .env(ISA_ENV, "portable")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for line in [
        "convolutions from 64 taps (conv2), f32 and f16: images in the lanes, the portable engine (4 lanes)",
        "convolutions under 64 taps (conv1): im2col, then the GEMM and dot-product tiles on the portable engine (4 lanes)",
        "linear layers, bf16: widened to f32, matrixmultiply",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
}

#[test]
fn a_cpu_isa_level_is_honoured_where_the_cpu_has_it_and_refused_where_not() {
    let cpu = nanoddp::backend::cpu::isa::cpu();
    let levels = [
        ("avx2", cpu.avx2),
        ("avx512", cpu.avx512),
        ("avx512bf16", cpu.avx512_bf16),
    ];
    for (level, has) in levels {
        let out = nanoddp()
            .arg("info")
            .env(ISA_ENV, level)
            .output()
            .expect("runs");
        if has {
            assert!(
                out.status.success(),
                "{level}, which this CPU has, is accepted: {}",
                text(&out.stderr)
            );
        } else {
            assert_refused_with(
                &out,
                &[
                    &format!("{ISA_ENV}={level}: this CPU lacks"),
                    "expected `portable`",
                ],
            );
            assert!(
                !text(&out.stderr).contains(&format!("`{level}`")),
                "the level it lacks is not offered: {}",
                text(&out.stderr)
            );
        }
    }
}

/// `nanoddp args...` on the CPU stand-in for the CUDA driver, with `var=value` and no other
/// stand-in setting.
fn on_standin(args: &[&str], var: &str, value: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nanoddp"));
    // The stand-in first; NVRTC's folder, where the path names it, kept for kernels built
    // without nvcc.
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    cmd.args(args)
        .env("LD_LIBRARY_PATH", format!("{STANDIN_DIR}:{path}"));
    for v in STANDIN_SETTINGS {
        cmd.env_remove(v);
    }
    cmd.env(var, value).output().expect("runs")
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_bad_standin_setting_makes_the_driver_refuse_naming_the_variable() {
    let gpus = "a whole number of GPUs from 0 to 16 (default 4)";
    let table = [
        ("NANODDP_STANDIN_GPUS", "abc", gpus),
        ("NANODDP_STANDIN_GPUS", "99", gpus),
        ("NANODDP_STANDIN_GPUS", "2.5", gpus),
        ("NANODDP_STANDIN_GPUS", "-1", gpus),
        (
            "NANODDP_STANDIN_EXEC",
            "sass",
            "`simt` (the default) or `ptx`",
        ),
        ("NANODDP_KERNEL_TIMEOUT_S", "soon", "seconds"),
        ("NANODDP_STANDIN_JIT_MS", "1ms", "milliseconds"),
        (
            "NANODDP_STANDIN_RANGE_GIB",
            "0",
            "GiB of address space per GPU",
        ),
        (
            "NANODDP_STANDIN_RANGE_GIB",
            "1.5",
            "GiB of address space per GPU",
        ),
    ];
    for (var, value, expected) in table {
        let out = on_standin(&["bench", "kernels", "--backend", "cuda"], var, value);
        assert_refused_with(
            &out,
            &[
                &format!("error: the CUDA driver refused to start: {var}={value}: expected"),
                expected,
            ],
        );
    }
}

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn a_good_standin_setting_is_honoured() {
    // Three GPUs, not the default four: the value is used, not replaced.
    let out = on_standin(&["info"], "NANODDP_STANDIN_GPUS", "3");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("GPU 2:"), "{stdout}");
    assert!(!stdout.contains("GPU 3:"), "{stdout}");
    // A small address range per GPU (what qemu-user needs) still runs the kernels.
    let args = [
        "bench",
        "kernels",
        "--backend",
        "cuda",
        "--batch",
        "2",
        "--repeats",
        "1",
    ];
    let out = on_standin(&args, "NANODDP_STANDIN_RANGE_GIB", "2");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_file_or_a_link_loop_given_as_data_is_reported_as_what_it_is() {
    let dir = scratch("cli-env-data");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "not a data set").expect("write");
    let a = dir.join("loop-a");
    let b = dir.join("loop-b");
    std::os::unix::fs::symlink(&b, &a).expect("link");
    std::os::unix::fs::symlink(&a, &b).expect("link");
    for (path, what) in [
        (&file, "is a file, not a folder"),
        (&a, "too many levels of symbolic links"),
    ] {
        let path = path.to_str().expect("a UTF-8 temporary path");
        let out = nanoddp()
            .args(["train", "--data", path, "--max-steps", "1"])
            .output()
            .expect("runs");
        assert_refused_with(&out, &[&format!("--data {path}: {what}")]);
        assert!(!text(&out.stderr).contains("not found"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_mistyped_nanoddp_data_is_refused_naming_the_variable() {
    let out = nanoddp()
        .args(["train", "--max-steps", "1"])
        .env("NANODDP_DATA", "/nonexistent/nanoddp-data")
        .output()
        .expect("runs");
    assert_refused_with(
        &out,
        &[
            "NANODDP_DATA=/nonexistent/nanoddp-data: no such file or folder",
            "NANODDP_DATA must name a folder",
        ],
    );
    assert!(
        !text(&out.stdout).contains("training on the small subset"),
        "no fall-back to the shipped subset"
    );
}

#[test]
fn a_nanoddp_font_naming_no_font_is_refused_naming_the_variable() {
    let dir = scratch("cli-env-font");
    let plot = dir.join("p.png");
    let not_a_font = dir.join("notes.txt");
    std::fs::write(&not_a_font, "not a font").expect("write");
    for (font, what) in [
        ("/nonexistent/font.ttf", "no such file or directory"),
        (not_a_font.to_str().expect("UTF-8"), "not a TrueType font"),
    ] {
        let out = nanoddp()
            .args(["train", "--data", SUBSET, "--max-steps", "1", "--plot"])
            .arg(&plot)
            .env("NANODDP_FONT", font)
            .output()
            .expect("runs");
        assert_refused_with(&out, &[&format!("NANODDP_FONT={font}: {what}")]);
        assert!(!plot.exists(), "refused before any work");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stand-in's call audit of `train --backend cuda` for `steps` steps at batch 4 with
/// `devices` ranks on a stand-in showing `gpus` GPUs (ranks share them round-robin): (entry
/// point, GPU or `-`) -> calls, read from stderr.
fn audited_training(
    steps: usize,
    (devices, gpus): (usize, usize),
    precision: &str,
    graph: &str,
) -> std::collections::BTreeMap<(String, String), u64> {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let (steps, devices) = (steps.to_string(), devices.to_string());
    let mut cmd = train_command(&[
        "--backend",
        "cuda",
        "--devices",
        &devices,
        "--batch",
        "4",
        "--epochs",
        "1",
        "--max-steps",
        &steps,
        "--test-images",
        "4",
        "--precision",
        precision,
        "--cuda-graph",
        graph,
    ]);
    cmd.env("LD_LIBRARY_PATH", format!("{STANDIN_DIR}:{path}"))
        .env("NANODDP_STANDIN_GPUS", gpus.to_string())
        .env("NANODDP_STANDIN_STATS", "1");
    let out = succeeds(&mut cmd);
    let mut calls = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        let Some(rest) = line.strip_prefix("[cuda stand-in] calls ") else {
            continue;
        };
        let f: Vec<&str> = rest.split(' ').collect();
        assert_eq!(f.len(), 3, "entry, GPU, count: {line}");
        let n = f[2].parse().unwrap_or_else(|e| panic!("{e}: {line}"));
        calls.insert((f[0].to_string(), f[1].to_string()), n);
    }
    calls
}

/// `later - earlier`, per key; polling calls (queries) and cudarc's context lookups
/// (`cuCtxGetCurrent`, which a wait loop may repeat) left out, as their number depends on
/// timing: on a loaded machine the rest still counts alike.
fn calls_between(
    earlier: &std::collections::BTreeMap<(String, String), u64>,
    later: &std::collections::BTreeMap<(String, String), u64>,
) -> std::collections::BTreeMap<(String, String), i64> {
    later
        .iter()
        .filter(|((entry, _), _)| !entry.ends_with("Query") && entry != "cuCtxGetCurrent")
        .map(|(k, &n)| (k.clone(), n as i64 - *earlier.get(k).unwrap_or(&0) as i64))
        .filter(|(_, d)| *d != 0)
        .collect()
}

/// What a steady training step must never call, at any number of ranks: a wait for the
/// device, a copy in either direction, an allocation, a free or a memset.
const NEVER_IN_A_STEP: [&str; 14] = [
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemAllocAsync",
    "cuMemAlloc_v2",
    "cuMemFreeAsync",
    "cuMemFree_v2",
    "cuMemsetD8Async",
];

#[test]
#[cfg_attr(not(simt_emulator), ignore = "needs the SIMT emulator (Linux only)")]
fn the_standin_audit_counts_a_steady_step_alike_on_every_gpu_and_one_device_neither_waits_nor_copies_in(
) {
    // Four ranks on four GPUs, then on one (round-robin: ranks on one GPU need no peer
    // access). The step's data, scalars and workspaces stay on the device, each step's
    // record is written by a kernel into page-locked memory the host reads late, and the
    // gradients' and statistics' reductions are ordered between the ranks' queues by events
    // (cuStreamWaitEvent), not by the host waiting: so a steady step neither waits for a
    // device nor copies, allocates or clears anything, on any GPU. Its compute is five graphs
    // per rank (the stretches before each of the three buckets' reductions at 64 KiB
    // buckets, before the statistics' sum, and after it: the step's first run is from the
    // stream, its second captured, the third replayed); what it launches from the stream
    // is the collectives' reductions, which a rank's graph cannot hold (train::step_graph).
    for gpus in [4, 1] {
        let runs: Vec<_> = (2..=3)
            .map(|steps| audited_training(steps, (4, gpus), "fp32", "on"))
            .collect();
        assert!(
            runs[0].contains_key(&("cuInit".to_string(), "-".to_string())),
            "cuInit is called before any context: {:?}",
            runs[0]
        );
        let third = calls_between(&runs[0], &runs[1]);
        let what = format!("4 ranks on {gpus} GPU(s), step 3: {third:?}");
        let count = |entry: &str, gpu: &str| -> i64 {
            third
                .get(&(entry.to_string(), gpu.to_string()))
                .copied()
                .unwrap_or(0)
        };
        for gpu in 0..gpus {
            let ranks = 4 / gpus as i64;
            let gpu = gpu.to_string();
            assert_eq!(count("cuGraphLaunch", &gpu), 5 * ranks, "GPU {gpu}: {what}");
            assert!(
                count("cuLaunchKernel", &gpu) > 0,
                "GPU {gpu} reduces: {what}"
            );
            assert!(
                count("cuStreamWaitEvent", &gpu) > 0,
                "GPU {gpu} orders the ranks by events: {what}"
            );
        }
        // Summed over the GPUs: which GPU a call made while the process tears down is counted
        // against depends on the thread that makes it, so whole runs can differ by one call
        // here and one there (a free) that cancel out. A call in every step would not.
        for entry in NEVER_IN_A_STEP {
            let total: i64 = (0..gpus).map(|g| count(entry, &g.to_string())).sum();
            assert_eq!(total, 0, "{entry} at {what}");
        }
        if gpus == 4 {
            // The ranks are alike: each GPU sees the same launches, records and waits.
            let of = |gpu: &str| -> Vec<(&String, i64)> {
                third
                    .iter()
                    .filter(|((e, g), _)| {
                        g == gpu
                            && [
                                "cuGraphLaunch",
                                "cuLaunchKernel",
                                "cuEventRecord",
                                "cuStreamWaitEvent",
                            ]
                            .contains(&e.as_str())
                    })
                    .map(|((e, _), &n)| (e, n))
                    .collect()
            };
            for gpu in ["1", "2", "3"] {
                assert_eq!(of("0"), of(gpu), "GPU {gpu}: {what}");
            }
        }
    }
    // One device has nothing to reduce: its steady step binds no context for another thread
    // (cuCtxSetCurrent), and its one fence (an event record the host only asks about: its
    // wait, when it is more than train::resident's LAG = 4 steps ahead, is past these steps)
    // is all it adds. So in every precision, and with graphs (the first step runs from the
    // stream, the second is captured) the third step is one graph launch.
    for (precision, graph) in [
        ("fp32", "on"),
        ("fp16", "on"),
        ("bf16", "on"),
        ("fp32", "off"),
    ] {
        let alone = calls_between(
            &audited_training(2, (1, 1), precision, graph),
            &audited_training(3, (1, 1), precision, graph),
        );
        let what = format!("one device, {precision}, --cuda-graph {graph}: {alone:?}");
        let count = |entry: &str| -> i64 {
            alone
                .iter()
                .filter(|((e, _), _)| e == entry)
                .map(|(_, &n)| n)
                .sum()
        };
        for entry in NEVER_IN_A_STEP.iter().chain(&["cuCtxSetCurrent"]) {
            assert_eq!(count(entry), 0, "{entry} at {what}");
        }
        assert_eq!(count("cuEventRecord"), 1, "{what}");
        if graph == "on" {
            assert_eq!(count("cuGraphLaunch"), 1, "{what}");
            assert_eq!(count("cuLaunchKernel"), 0, "{what}");
        } else {
            assert_eq!(count("cuGraphLaunch"), 0, "{what}");
            assert!(count("cuLaunchKernel") > 0, "{what}");
        }
    }
}
