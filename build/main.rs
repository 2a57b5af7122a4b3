//! Build script: turns `kernels/*.cu` into what the crate embeds.
//!
//! For every kernel file it always produces
//!   * the source with local `#include "..."` flattened (for NVRTC at run time), and
//!   * the signatures of its `extern "C" __global__` entry points, parsed from the source,
//!     from which the typed Rust launchers are generated (one definition, every backend).
//!
//! and it embeds the file's PTX the repository ships in `kernels/ptx/` (for compute_75,
//! compute_80 and compute_90), which the CUDA backend loads when no fatbin is embedded.
//!
//! When nvcc is found (env `NVCC`, `$CUDA_HOME/bin`, `$CUDA_PATH/bin`, then `PATH`; never when
//! `NANODDP_NO_NVCC=1`) it also compiles each file to a fatbin (SASS for sm_80 and sm_90, PTX
//! for the shipped architectures), keeps the `ptxas -v` resource report, and records which
//! shipped PTX files differ from the PTX in the fatbin (`tests/kernel_build.rs` fails naming
//! them); `NANODDP_UPDATE_PTX=1` rewrites them instead. Without nvcc the crate builds from
//! the shipped PTX alone.
//!
//! It also compiles the same kernels as host C++ for the SIMT emulator, together with the
//! emulator's runtime `kernels/simt_host.cpp`, into a static library, and builds the CUDA
//! driver stand-in from `cuda-standin/`.
//!
//! Everything lands in `$OUT_DIR/kernels_generated.rs`, included by `src/kernels/mod.rs`.
//!
//! One job per module:
//! * [`nvcc`]: finding nvcc and compiling a kernel file to a fatbin;
//! * [`flatten`]: inlining a kernel file's local includes;
//! * [`ptx`]: the shipped PTX, checked against nvcc's or rewritten;
//! * [`kernel_files`]: the kernel files and the entry points they declare, read by
//!   [`declarations`] (`src/kernels/declarations.rs`, shared with the library);
//! * [`rust_gen`]: the generated Rust (signatures, typed launchers, module table);
//! * [`emulator`]: the host C++ shims and static library of the SIMT emulator;
//! * [`standin`]: the CUDA driver stand-in.

use std::env;
use std::fs;
use std::path::PathBuf;

mod emulator;
mod flatten;
mod kernel_files;
mod nvcc;
mod ptx;
mod rust_gen;
mod standin;

// The source lowering the host build shares with run-time module builds
// (nanoddp::backend::simt_module): one implementation for both.
#[path = "../src/kernels/lowering.rs"]
mod lowering;
// The kernel-declaration parser and table of C types, shared with run-time module builds
// the same way. The library uses parts of it the build script does not.
#[allow(dead_code)]
#[path = "../src/kernels/declarations.rs"]
mod declarations;
// How the shipped PTX is named and made independent of where it was built, and how a
// fatbin's PTX is read: the library's rules, shared the same way.
#[allow(dead_code)]
#[path = "../src/kernels/fatbin.rs"]
mod fatbin;
#[allow(dead_code)]
#[path = "../src/kernels/shipped_ptx.rs"]
mod shipped_ptx;

use kernel_files::Module;

fn main() {
    println!("cargo::rerun-if-changed=build");
    println!("cargo::rerun-if-changed=kernels");
    println!("cargo::rerun-if-changed=cuda-standin");
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "PATH",
        "NANODDP_NO_NVCC",
        "NANODDP_UPDATE_PTX",
        "NVCC_CCBIN",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }

    let root =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernel_dir = root.join("kernels");

    let mut sources: Vec<PathBuf> = fs::read_dir(&kernel_dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", kernel_dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();

    let nvcc = nvcc::find_nvcc();
    let toolchain = match &nvcc {
        Some(nvcc) => {
            let version = nvcc::nvcc_version(nvcc);
            println!(
                "cargo::warning=nanoddp: compiling kernels with {} ({version})",
                nvcc.display()
            );
            Some(version)
        }
        None if ptx::updating() => panic!(
            "NANODDP_UPDATE_PTX=1 rewrites kernels/ptx/ from what nvcc emits, and no nvcc was \
             found: set NVCC to nvcc 13.0 (tools/update-ptx installs it)"
        ),
        // The usual case, and a complete build: no warning.
        None => None,
    };

    let modules: Vec<Module> = sources
        .iter()
        .map(|path| Module::parse(path, &kernel_dir, &out))
        .collect();

    // nvcc is slow (~1.5 s a file); compile the files in parallel.
    let reports: Vec<Option<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = modules
            .iter()
            .map(|m| {
                let nvcc = nvcc.as_deref();
                let kernel_dir = &kernel_dir;
                let out = &out;
                scope.spawn(move || nvcc.map(|nvcc| nvcc::compile_fatbin(nvcc, m, kernel_dir, out)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("nvcc thread panicked"))
            .collect()
    });

    let stale: Vec<String> = match &toolchain {
        Some(version) => modules
            .iter()
            .flat_map(|m| {
                let fatbin = out.join(format!("{}.fatbin", m.name));
                ptx::check_against_fatbin(&root, m, &fatbin, version)
            })
            .collect(),
        None => Vec::new(),
    };
    for name in &stale {
        println!(
            "cargo::warning=nanoddp: {name} is not what this nvcc emits: tools/update-ptx \
             rewrites it"
        );
    }
    // After the check: an update has written the files.
    let shipped: Vec<_> = modules.iter().map(|m| ptx::shipped(&root, m)).collect();
    for (m, files) in modules.iter().zip(&shipped) {
        if files.len() < shipped_ptx::ARCHS.len() {
            println!(
                "cargo::warning=nanoddp: {} has no PTX in kernels/ptx/ for every architecture: \
                 tools/update-ptx writes it",
                m.path.display()
            );
        }
    }

    // The emulator's fiber switch and fault handling are written for Linux on x86-64 and
    // aarch64, and the stand-in (which links the emulator) for Linux: elsewhere (macOS) the
    // crate builds without both, and says so at run time (`nanoddp info`; the SIMT backend's
    // `BackendError::NoEmulator`; the tests that need them are ignored, by name).
    // `NANODDP_NO_EMULATOR=1` builds so on Linux too, to run those paths where they can run.
    println!("cargo::rustc-check-cfg=cfg(simt_emulator)");
    println!("cargo::rerun-if-env-changed=NANODDP_NO_EMULATOR");
    let target = |var: &str| env::var(var).unwrap_or_default();
    let emulator = target("CARGO_CFG_TARGET_OS") == "linux"
        && ["x86_64", "aarch64"].contains(&target("CARGO_CFG_TARGET_ARCH").as_str())
        && target("NANODDP_NO_EMULATOR") != "1";
    if emulator {
        println!("cargo::rustc-cfg=simt_emulator");
        emulator::host_build(&modules, &kernel_dir, &out);
        standin::standin_build(&modules, &root, &out);
    } else {
        println!(
            "cargo::warning=nanoddp: this build for {} has no SIMT emulator and no CUDA \
             stand-in (built for Linux on x86-64 and aarch64 only, unless NANODDP_NO_EMULATOR=1)",
            target("TARGET")
        );
        println!("cargo::rustc-env=NANODDP_STANDIN_DIR=");
    }

    let generated = rust_gen::generate_rust(
        &modules,
        rust_gen::Built {
            reports: &reports,
            shipped: &shipped,
            stale: &stale,
        },
        (toolchain.as_deref(), nvcc.as_deref()),
        emulator,
    );
    fs::write(out.join("kernels_generated.rs"), generated).expect("write kernels_generated.rs");
}
