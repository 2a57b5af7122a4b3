//! `nanoddp info` tells the truth about this build and this machine, and never fails
//! because CUDA is missing.

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
