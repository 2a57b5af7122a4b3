//! The command line: `nanoddp info` tells the truth about this build and this machine and
//! never fails because CUDA is missing; `train` refuses bad settings and output paths before
//! its first step, and stops a diverging run keeping the last checkpoint.

use std::os::unix::fs::FileTypeExt;
use std::process::Command;

use nanoddp::backend::cuda;
use nanoddp::kernels::{MODULES, PREBUILT};

#[test]
fn info_describes_the_build_the_driver_and_the_cpu() {
    let out = Command::new(env!("CARGO_BIN_EXE_nanoddp"))
        .arg("info")
        .output()
        .expect("runs");
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
    let out = Command::new(env!("CARGO_BIN_EXE_nanoddp"))
        .arg("frobnicate")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

#[test]
fn bench_kernels_prints_one_row_per_operation_with_a_rate() {
    let out = Command::new(env!("CARGO_BIN_EXE_nanoddp"))
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
    let out = Command::new(env!("CARGO_BIN_EXE_nanoddp"))
        .args(["bench", "kernels", "--batch", "0"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batch"));
}

/// `nanoddp train` on the shipped subset, with `args`.
fn train_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nanoddp"));
    cmd.arg("train")
        .args([
            "--data",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/fashion-mnist-subset"
            ),
        ])
        .args(args);
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

/// A fresh folder for one test's files.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nanoddp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary folder");
    dir
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
        let (code, err) = train_with(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains(mention),
            "{args:?}: expected `{mention}` in: {err}"
        );
        assert!(
            !err.contains("epoch"),
            "{args:?} must fail before training: {err}"
        );
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
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("diverged") && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(std::fs::read(&ckpt).unwrap(), b"the previous checkpoint");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_closed_pipe_ends_the_printing_not_the_run() {
    use std::io::Read;
    let dir = scratch("pipe");
    let ckpt = dir.join("run.safetensors");
    let ckpt_text = ckpt.to_string_lossy().into_owned();
    let mut child = train_command(&["--epochs", "2", "--max-steps", "14", "--save", &ckpt_text])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    // Read the header line, then go away, as `| head -1` does.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(nanoddp::train::checkpoint::load(&ckpt).unwrap().epoch, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
