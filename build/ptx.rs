//! The PTX the repository ships (`kernels/ptx/`; the rules are in `shipped_ptx`): which files
//! a kernel file has, and, where nvcc built a fatbin, whether they are what it emitted. With
//! `NANODDP_UPDATE_PTX=1` the build rewrites them from the fatbins instead (`tools/update-ptx`).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use crate::fatbin;
use crate::kernel_files::Module;
use crate::nvcc::NVCC_FLAGS;
use crate::shipped_ptx::{self, ARCHS, DIR};

/// `(arch, path)` of each shipped PTX file of `module` that exists, in [`ARCHS`] order.
pub(crate) fn shipped(root: &Path, module: &Module) -> Vec<(u32, PathBuf)> {
    ARCHS
        .iter()
        .map(|&arch| {
            (
                arch,
                root.join(DIR)
                    .join(shipped_ptx::file_name(&module.name, arch)),
            )
        })
        .filter(|(_, path)| path.is_file())
        .collect()
}

/// Whether this build rewrites the shipped PTX (it then needs nvcc).
pub(crate) fn updating() -> bool {
    env::var("NANODDP_UPDATE_PTX").is_ok_and(|v| v == "1")
}

/// Compares the shipped PTX of `module` with the PTX in the fatbin nvcc just built (or writes
/// it, when [`updating`]), and returns the shipped files, relative to the crate root, that are
/// missing or differ.
pub(crate) fn check_against_fatbin(
    root: &Path,
    module: &Module,
    fatbin_path: &Path,
    nvcc_version: &str,
) -> Vec<String> {
    let bytes =
        fs::read(fatbin_path).unwrap_or_else(|e| panic!("read {}: {e}", fatbin_path.display()));
    let texts =
        fatbin::ptx_texts(&bytes).unwrap_or_else(|e| panic!("{}: {e}", fatbin_path.display()));
    let root_text = root.to_str().expect("the crate's path is UTF-8");
    let mut stale = Vec::new();
    for arch in ARCHS {
        let name = format!("{DIR}/{}", shipped_ptx::file_name(&module.name, arch));
        let Some((_, text)) = texts.iter().find(|(a, _)| *a == arch) else {
            panic!(
                "the fatbin of {} holds no compute_{arch} PTX",
                module.path.display()
            );
        };
        let file = format!("kernels/{}.cu", module.name);
        let emitted = shipped_ptx::with_header(
            &shipped_ptx::portable(text, root_text),
            &file,
            nvcc_version,
            arch,
            &NVCC_FLAGS.join(" "),
        );
        let path = root.join(&name);
        if updating() {
            fs::create_dir_all(root.join(DIR)).expect("create kernels/ptx");
            if fs::read_to_string(&path).ok().as_deref() != Some(&emitted) {
                fs::write(&path, &emitted).unwrap_or_else(|e| panic!("write {name}: {e}"));
            }
        } else if fs::read_to_string(&path).ok().as_deref() != Some(&emitted) {
            stale.push(name);
        }
    }
    stale
}
