//! The run-time compile path: every embedded kernel source compiles with NVRTC, alone (no
//! kernels/ folder, no nvcc), to SASS for the GPUs we target and to PTX.
//!
//! NVRTC needs no GPU, only libnvrtc.so.13 on the library path. CI installs it and sets
//! NANODDP_EXPECT_NVRTC=1 so its absence fails instead of skipping.

use nanoddp::backend::nvrtc::{self, Output};
use nanoddp::backend::BackendError;
use nanoddp::kernels::MODULES;

fn nvrtc_or_skip() -> bool {
    if nvrtc::is_available() {
        return true;
    }
    assert_ne!(
        std::env::var("NANODDP_EXPECT_NVRTC").as_deref(),
        Ok("1"),
        "NANODDP_EXPECT_NVRTC=1 but libnvrtc.so could not be loaded"
    );
    eprintln!("skipped: libnvrtc.so.13 not found (pip install nvidia-cuda-nvrtc, add its lib/ to LD_LIBRARY_PATH)");
    false
}

#[test]
fn every_module_compiles_to_sass_holding_each_kernel() {
    if !nvrtc_or_skip() {
        return;
    }
    for cc in [(8, 0), (9, 0)] {
        for m in MODULES {
            let cubin = nvrtc::compile(m, cc, Output::Cubin).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&cubin[..4], b"\x7fELF", "{}: not an ELF cubin", m.name);
            for k in m.kernels {
                let symbol = format!(".text.{}\0", k.name);
                assert!(
                    cubin.windows(symbol.len()).any(|w| w == symbol.as_bytes()),
                    "{}: cubin for sm_{}{} has no code section for {}",
                    m.name,
                    cc.0,
                    cc.1,
                    k.name
                );
            }
        }
    }
}

#[test]
fn every_module_compiles_to_ptx_with_each_entry() {
    if !nvrtc_or_skip() {
        return;
    }
    for m in MODULES {
        let ptx = nvrtc::compile(m, (7, 5), Output::Ptx).unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&ptx);
        assert!(text.contains(".target sm_75"), "{}: PTX target", m.name);
        assert_eq!(
            ptx.last(),
            Some(&0),
            "PTX must stay NUL-terminated for cuModuleLoadData"
        );
        for k in m.kernels {
            assert!(
                text.contains(&format!(".entry {}(", k.name)),
                "{}: no .entry {}",
                m.name,
                k.name
            );
        }
    }
}

#[test]
fn a_broken_source_reports_nvrtcs_log_with_the_file_name() {
    if !nvrtc_or_skip() {
        return;
    }
    let broken = Box::leak(Box::new(nanoddp::kernels::KernelModule {
        name: "broken",
        file: "kernels/broken.cu",
        source: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }\n",
        ptx: &[],
        fatbin: None,
        ptxas_report: None,
        kernels: &[],
    }));
    match nvrtc::compile(broken, (8, 0), Output::Cubin) {
        Err(BackendError::Compile { module, arch, log }) => {
            assert_eq!((module.as_str(), arch.as_str()), ("broken", "sm_80"));
            assert!(
                log.contains("undefined_name") && log.contains("broken.cu"),
                "log: {log}"
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
