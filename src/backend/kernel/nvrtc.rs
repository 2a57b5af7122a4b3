//! Run-time compilation of the embedded kernel sources with NVRTC.
//!
//! Used by the CUDA backend when no prebuilt fatbin fits the GPU (the crate was built
//! without nvcc, or the GPU is newer than the fatbin's SASS and its driver rejects the PTX).
//! Compiling to a cubin for the exact `sm_XY` comes first, because SASS skips the driver's
//! PTX-version check that stops newer-toolkit PTX on older drivers; PTX is the last resort.
//!
//! NVRTC needs no GPU, so this module is tested on machines without one.

use std::ffi::{c_char, CString};
use std::path::PathBuf;

use cudarc::nvrtc::{result, sys};

use crate::backend::error::c_text;
use crate::backend::BackendError;
use crate::kernels::{KernelModule, PREBUILT};

/// What to ask NVRTC for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// SASS for exactly `sm_{major}{minor}`.
    Cubin,
    /// PTX for `compute_{major}{minor}`, JIT-compiled by the driver at load time.
    Ptx,
}

/// True when `libnvrtc.so` can be loaded.
pub fn is_available() -> bool {
    // SAFETY: only tries to dlopen the library; no NVRTC call is made.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, e.g. `(13, 0)`, or `None` when the library is absent.
pub fn version() -> Option<(i32, i32)> {
    if !is_available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above) and both pointers are valid.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (status == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// CUDA's headers the kernels need from outside NVRTC, with the PyPI package that ships
/// each: `simt.cuh` includes `cuda_fp16.h`, `cuda_bf16.h` and `mma.h` (all from
/// nvidia-cuda-runtime), and `mma.h` includes `crt/mma.h`, which comes from another package,
/// nvidia-cuda-crt. A folder with only the first passes a search for it and then fails the
/// compile.
pub const REQUIRED_HEADERS: [(&str, &str); 3] = [
    ("cuda_fp16.h", "nvidia-cuda-runtime"),
    ("cuda_bf16.h", "nvidia-cuda-runtime"),
    ("crt/mma.h", "nvidia-cuda-crt"),
];

/// Folders holding CUDA's headers ([`REQUIRED_HEADERS`]), searched in this order:
/// `NANODDP_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`, `../include` beside
/// the loaded libnvrtc (the layout of both a toolkit and NVIDIA's PyPI wheels), the headers
/// of the nvcc the crate was built with, then `/usr/local/cuda/include`. See
/// [`header_dirs`] for which folders are kept.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("NANODDP_CUDA_INCLUDE") {
        dirs.push(p.into());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            dirs.push(PathBuf::from(p).join("include"));
        }
    }
    if let Some(lib_dir) = loaded_library_dir("libnvrtc.so") {
        dirs.push(lib_dir.join("..").join("include"));
    }
    if let Some(dir) = PREBUILT.and_then(|p| p.cuda_include_dir) {
        dirs.push(dir.into());
    }
    dirs.push("/usr/local/cuda/include".into());
    header_dirs(dirs)
}

/// The `candidates` worth passing to NVRTC, in order: the first folder that holds every
/// required header, else the folders that hold any of them (so headers split across two
/// installs are still found together). Whether anything is still missing is for
/// [`missing_headers`] to say.
pub fn header_dirs(candidates: Vec<PathBuf>) -> Vec<PathBuf> {
    let holds = |d: &PathBuf, header: &str| d.join(header).is_file();
    // One complete folder beats a mix: headers of one install agree with each other, and a
    // stale partial folder earlier in the list must not shadow part of a complete one.
    if let Some(whole) = candidates
        .iter()
        .find(|d| REQUIRED_HEADERS.iter().all(|(h, _)| holds(d, h)))
    {
        return vec![whole.clone()];
    }
    let mut dirs: Vec<PathBuf> = candidates
        .into_iter()
        .filter(|d| REQUIRED_HEADERS.iter().any(|(h, _)| holds(d, h)))
        .collect();
    dirs.dedup();
    dirs
}

/// The headers of [`REQUIRED_HEADERS`] that none of `dirs` holds.
pub fn missing_headers(dirs: &[PathBuf]) -> Vec<&'static str> {
    REQUIRED_HEADERS
        .iter()
        .map(|(h, _)| *h)
        .filter(|h| !dirs.iter().any(|d| d.join(h).is_file()))
        .collect()
}

/// What to do when NVRTC cannot open a header: which headers it needs, which of them the
/// search found nowhere, and how to provide them (the variable and both packages).
fn header_hint(dirs: &[PathBuf]) -> String {
    let headers: Vec<&str> = REQUIRED_HEADERS.iter().map(|(h, _)| *h).collect();
    let mut packages: Vec<&str> = REQUIRED_HEADERS.iter().map(|(_, p)| *p).collect();
    packages.dedup();
    let listed = || {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let missing = missing_headers(dirs);
    let found = if dirs.is_empty() {
        "no include folder holds any of them".to_string()
    } else if missing.is_empty() {
        format!("searched {}", listed())
    } else {
        format!("{} not in {}", missing.join(" or "), listed())
    };
    format!(
        "NVRTC needs CUDA's headers {} ({found}): set NANODDP_CUDA_INCLUDE to a folder holding \
         them, or `pip install {}` beside nvidia-cuda-nvrtc",
        headers.join(" and "),
        packages.join(" "),
    )
}

/// The folder of a shared library this process has mapped, read from `/proc/self/maps`.
fn loaded_library_dir(name: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(PathBuf::from)
        .find(|path| {
            path.file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.starts_with(name))
        })
        .and_then(|path| path.parent().map(PathBuf::from))
}

/// Compiles `module` for compute capability `major.minor`.
pub fn compile(
    module: &KernelModule,
    arch: (i32, i32),
    output: Output,
) -> Result<Vec<u8>, BackendError> {
    compile_source(module.name, module.file, module.source, arch, output)
}

/// Compiles CUDA C++ `source` (self-contained: local includes already inlined) for compute
/// capability `major.minor`; `name` labels errors and `file` is the name NVRTC reports.
pub fn compile_source(
    name: &str,
    file: &str,
    source: &str,
    (major, minor): (i32, i32),
    output: Output,
) -> Result<Vec<u8>, BackendError> {
    if !is_available() {
        return Err(BackendError::NoNvrtc {
            module: name.to_string(),
        });
    }
    let arch = match output {
        Output::Cubin => format!("sm_{major}{minor}"),
        Output::Ptx => format!("compute_{major}{minor}"),
    };
    let compile_error = |log: String| BackendError::Compile {
        module: name.to_string(),
        arch: arch.clone(),
        log,
    };
    let source =
        CString::new(source).map_err(|_| compile_error("source contains a NUL byte".into()))?;
    let name =
        CString::new(file).map_err(|_| compile_error("file name contains a NUL byte".into()))?;
    // Creating the program loads libnvrtc for good, which `include_dirs` looks for.
    let program =
        result::create_program(&source, Some(&name)).map_err(|e| compile_error(e.to_string()))?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--generate-line-info".to_string(),
    ];
    let dirs = include_dirs();
    options.extend(
        dirs.iter()
            .map(|d| format!("--include-path={}", d.display())),
    );

    // SAFETY: `program` was just created and is destroyed exactly once below; `source` and
    // `name` outlive it.
    let compiled = unsafe { result::compile_program(program, &options) };
    // SAFETY: as above; the log is available whether or not compilation succeeded.
    let log = unsafe { result::get_program_log(program) }
        .map(|raw| c_text(&raw))
        .unwrap_or_default();
    let bytes = match compiled {
        Err(_) if log.contains("could not open source file") => {
            Err(compile_error(format!("{log}\n{}", header_hint(&dirs))))
        }
        Err(_) => Err(compile_error(log)),
        // SAFETY: as above; the program compiled.
        Ok(()) => unsafe { take_output(program, output) }
            .map_err(|e| compile_error(format!("{e}\n{log}"))),
    };
    // SAFETY: `program` is live and not used after this.
    let _ = unsafe { result::destroy_program(program) };
    bytes
}

/// Copies the compiled image out of a program.
///
/// # Safety
/// `program` must be a live, successfully compiled NVRTC program.
unsafe fn take_output(
    program: sys::nvrtcProgram,
    output: Output,
) -> Result<Vec<u8>, result::NvrtcError> {
    match output {
        Output::Ptx => {
            // SAFETY: guaranteed by the caller.
            let ptx = unsafe { result::get_ptx(program) }?;
            Ok(ptx.iter().map(|&c| c.to_ne_bytes()[0]).collect())
        }
        Output::Cubin => {
            let mut size = 0usize;
            // SAFETY: guaranteed by the caller; `size` is a valid out-pointer.
            unsafe { sys::nvrtcGetCUBINSize(program, &mut size) }.result()?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` has exactly the size NVRTC reported.
            unsafe { sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast::<c_char>()) }.result()?;
            Ok(cubin)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder under the system's temporary one holding `headers` (empty files).
    fn folder(name: &str, headers: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("nanoddp-nvrtc-{}", std::process::id()))
            .join(name);
        let _ = std::fs::remove_dir_all(&dir);
        for h in headers {
            let path = dir.join(h);
            std::fs::create_dir_all(path.parent().expect("a header path has a folder"))
                .expect("temporary folder");
            std::fs::write(&path, "").expect("temporary header");
        }
        std::fs::create_dir_all(&dir).expect("temporary folder");
        dir
    }

    #[test]
    fn the_search_wants_cuda_fp16_h_and_crt_mma_h() {
        let runtime_only = folder("runtime", &["cuda_fp16.h", "cuda_bf16.h", "mma.h"]);
        let crt_only = folder("crt", &["crt/mma.h"]);
        let both = folder(
            "both",
            &["cuda_fp16.h", "cuda_bf16.h", "mma.h", "crt/mma.h"],
        );
        let neither = folder("neither", &["cuda.h"]);

        // A folder without crt/mma.h is no longer enough on its own...
        let dirs = header_dirs(vec![neither.clone(), runtime_only.clone()]);
        assert_eq!(dirs, std::slice::from_ref(&runtime_only));
        assert_eq!(missing_headers(&dirs), ["crt/mma.h"]);
        // ...a complete folder is taken alone, wherever it is in the order...
        let dirs = header_dirs(vec![runtime_only.clone(), both.clone(), crt_only.clone()]);
        assert_eq!(dirs, std::slice::from_ref(&both));
        assert!(missing_headers(&dirs).is_empty());
        // ...and headers split over two installs are found together.
        let dirs = header_dirs(vec![
            crt_only.clone(),
            neither.clone(),
            runtime_only.clone(),
        ]);
        assert_eq!(dirs, [crt_only.clone(), runtime_only.clone()]);
        assert!(missing_headers(&dirs).is_empty());
        assert!(header_dirs(vec![neither.clone()]).is_empty());
        for d in [runtime_only, crt_only, both, neither] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn the_hint_names_both_packages_the_variable_and_what_is_missing() {
        let runtime_only = folder("hint", &["cuda_fp16.h", "cuda_bf16.h"]);
        for (dirs, says) in [
            (vec![runtime_only.clone()], "crt/mma.h not in"),
            (vec![], "no include folder holds any"),
        ] {
            let hint = header_hint(&dirs);
            assert_eq!(hint.matches("nvidia-cuda-runtime").count(), 1, "{hint}");
            for needed in [
                "cuda_fp16.h",
                "cuda_bf16.h",
                "crt/mma.h",
                "NANODDP_CUDA_INCLUDE",
                "nvidia-cuda-runtime",
                "nvidia-cuda-crt",
                says,
            ] {
                assert!(hint.contains(needed), "{needed} missing from: {hint}");
            }
        }
        let _ = std::fs::remove_dir_all(runtime_only);
    }
}
