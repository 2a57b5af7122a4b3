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

use super::BackendError;
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

/// Folders holding `cuda_fp16.h`, which the kernels include: `NANODDP_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `../include` beside the loaded libnvrtc (the
/// layout of both a toolkit and NVIDIA's PyPI wheels), the headers of the nvcc the crate
/// was built with, then `/usr/local/cuda/include`.
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
    dirs.retain(|d| d.join("cuda_fp16.h").is_file());
    dirs.dedup();
    dirs
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
    options.extend(
        include_dirs()
            .iter()
            .map(|d| format!("--include-path={}", d.display())),
    );

    // SAFETY: `program` was just created and is destroyed exactly once below; `source` and
    // `name` outlive it.
    let compiled = unsafe { result::compile_program(program, &options) };
    // SAFETY: as above; the log is available whether or not compilation succeeded.
    let log = unsafe { result::get_program_log(program) }
        .map(|raw| c_chars_to_string(&raw))
        .unwrap_or_default();
    let bytes = match compiled {
        Err(_) if log.contains("could not open source file") => Err(compile_error(format!(
            "{log}\nNVRTC needs CUDA's headers (cuda_fp16.h): set NANODDP_CUDA_INCLUDE to a folder \
             holding them, or `pip install nvidia-cuda-runtime` beside nvidia-cuda-nvrtc"
        ))),
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
            Ok(ptx.iter().map(|&c| c as u8).collect())
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

fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
