//! Finding nvcc and compiling kernel files to fatbins with it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::kernel_files::Module;

/// Real GPU architectures the fatbins hold SASS for. They also hold PTX for every virtual
/// architecture the repository ships PTX for (`shipped_ptx::ARCHS`): the driver JIT-compiles
/// the newest PTX a GPU without matching SASS can take (compute_75 for Turing; compute_90 for
/// sm_100+, whose bf16 kernels compute_75 could not hold). compute_90's PTX is also what the
/// CUDA stand-in's PTX executor runs.
pub(crate) const SASS_ARCHS: &[&str] = &["sm_80", "sm_90"];

/// The fatbins' PTX architectures, `compute_XY`.
pub(crate) fn ptx_archs() -> Vec<String> {
    crate::shipped_ptx::ARCHS
        .iter()
        .map(|a| format!("compute_{a}"))
        .collect()
}
/// `--no-compress`: fatbin entries stay readable, so the stand-in's PTX executor can run the
/// PTX of the very fatbin a GPU would get.
pub(crate) const NVCC_FLAGS: &[&str] = &[
    "-O3",
    "-lineinfo",
    "-std=c++17",
    "-Xptxas",
    "-v",
    "--no-compress",
];

pub(crate) fn find_nvcc() -> Option<PathBuf> {
    if env::var("NANODDP_NO_NVCC").is_ok_and(|v| v == "1") {
        return None;
    }
    let mut candidates = Vec::new();
    if let Some(p) = env::var_os("NVCC") {
        candidates.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = env::var_os(var) {
            candidates.push(PathBuf::from(p).join("bin").join("nvcc"));
        }
    }
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

pub(crate) fn nvcc_version(nvcc: &Path) -> String {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .expect("nvcc --version");
    let text = String::from_utf8_lossy(&out.stdout);
    // "Cuda compilation tools, release 13.0, V13.0.88"
    text.lines()
        .find_map(|l| l.split_once("release ").map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| "unknown version".to_string())
}

/// Compiles one module to `$OUT_DIR/<name>.fatbin` and returns ptxas's resource report.
/// A kernel that does not compile fails the build: with a compiler present, a broken
/// kernel must never be silently replaced by the run-time path.
pub(crate) fn compile_fatbin(
    nvcc: &Path,
    module: &Module,
    kernel_dir: &Path,
    out: &Path,
) -> String {
    let mut cmd = Command::new(nvcc);
    cmd.arg("-fatbin")
        .args(NVCC_FLAGS)
        .arg("-I")
        .arg(kernel_dir);
    for sm in SASS_ARCHS {
        let compute = sm.replace("sm_", "compute_");
        cmd.arg("-gencode").arg(format!("arch={compute},code={sm}"));
    }
    for ptx in ptx_archs() {
        cmd.arg("-gencode").arg(format!("arch={ptx},code={ptx}"));
    }
    if let Some(ccbin) = env::var_os("NVCC_CCBIN") {
        cmd.arg("-ccbin").arg(ccbin);
    }
    cmd.arg(&module.path)
        .arg("-o")
        .arg(out.join(format!("{}.fatbin", module.name)));
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        panic!("nvcc failed on {}:\n{stderr}", module.path.display());
    }
    stderr
}
