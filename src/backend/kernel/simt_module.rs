//! Bring your own kernel: a `.cu` file of yours, compiled at run time for the SIMT emulator
//! (by the host C++ compiler) and for GPUs (by NVRTC), launched from Rust with the same
//! checks nanoddp's own kernels get: lane orders, poisoned shared memory, guard pages after
//! every allocation, divergent-barrier and warp-misuse errors.
//!
//! Write the kernel as CUDA C++ with `#include "simt.cuh"` (the header nanoddp ships; it is
//! plain CUDA under nvcc/NVRTC), kernels declared `extern "C" __global__ void name(...)`
//! with parameters of `float`, `double`, `__half`, `int`, `unsigned`, `long long`,
//! `unsigned long long`, `unsigned char` or pointers to them, one `__shared__` variable per
//! statement, dynamic shared memory as `SIMT_DYNAMIC_SHARED(T, name)`, and a kernel's
//! `__launch_bounds__`, if any, with integer literals (launches are checked against them).
//! Then:
//!
//! ```no_run
//! use nanoddp::backend::simt::SimtDevice;
//! use nanoddp::backend::simt_module::SimtModule;
//! use nanoddp::backend::{KernelArg, LaunchConfig, Memory};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let module = SimtModule::compile("my_kernels/scale.cu")?;
//! let dev = SimtDevice::new(0);
//! let mut x = dev.upload(&[1.0f32, 2.0, 3.0])?;
//! // SAFETY: `scale(float* x, float a, int n)` touches x[0..n) only.
//! unsafe {
//!     module.launch(&dev, "scale", LaunchConfig::flat(3),
//!         &[KernelArg::buffer_mut(&mut x), KernelArg::F32(2.0), KernelArg::I32(3)])?;
//! }
//! assert_eq!(dev.download(&x)?, [2.0, 4.0, 6.0]);
//! # Ok(()) }
//! ```
//!
//! How it works: the kernels are found by the parser the build uses for nanoddp's own
//! (`src/kernels/declarations.rs`), with their `__launch_bounds__`, which every launch is
//! checked against; the source is lowered exactly as the build lowers nanoddp's own kernels
//! (`src/kernels/lowering.rs`: every static `__shared__` is registered so the runtime can
//! poison it per block), one entry point per kernel is appended (the kernel's parameter
//! types unpack CUDA's `kernelParams` and are reported as a signature string the launch
//! checks arguments against), and the result is built with `SIMT_MODULE` defined into a
//! shared library. That library calls the emulator linked into this program through a
//! table of functions it receives when loaded, so nothing needs exported symbols.
//! The compiler is `$CXX`, else `c++`, else `g++` (C++20, as for the crate's own build).

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use thiserror::Error;

use super::nvrtc::{self, Output};
use super::simt::SimtDevice;
use super::{KernelArg, LaunchConfig};
use crate::backend::BackendError;
use crate::kernels::declarations::{self, Declaration, DeclarationError};
use crate::kernels::lowering::{lower_static_shared, strip_comments};
use crate::kernels::{simt_entries::Entry, KernelSignature, Param, ParamKind};

/// The emulator header, as shipped in `kernels/simt.cuh`.
pub const SIMT_HEADER: &str = include_str!("../../../kernels/simt.cuh");

#[cfg(simt_emulator)]
extern "C" {
    fn simt_runtime_table() -> *const c_void;
}

/// Without the emulator no module is built ([`ModuleError::NoEmulator`] first), so this is
/// never called: it stands in for the runtime's symbol so that the crate links.
#[cfg(not(simt_emulator))]
unsafe fn simt_runtime_table() -> *const c_void {
    std::ptr::null()
}

/// What can go wrong building or loading a module.
#[derive(Debug, Error)]
pub enum ModuleError {
    /// The source could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A kernel declaration cannot be read (e.g. `__launch_bounds__` with an argument that
    /// is not an integer literal: the launch checks need its value).
    #[error("{path}:{}: {}", source.line, source.message)]
    Declaration {
        /// The file.
        path: PathBuf,
        /// What the parser found.
        source: DeclarationError,
    },
    /// The source defines no kernel nanoddp can launch.
    #[error("{path}: no `extern \"C\" __global__ void name(...)` kernel found")]
    NoKernels {
        /// The file.
        path: PathBuf,
    },
    /// The source breaks a rule of the emulator (e.g. two `__shared__` in one statement).
    #[error("{0}")]
    Lowering(String),
    /// No C++ compiler could be run.
    #[error("no C++20 compiler found (tried {tried}): install g++ or set CXX")]
    NoCompiler {
        /// The commands tried.
        tried: String,
    },
    /// The compiler rejected the module.
    #[error("{compiler} could not compile {path} for the SIMT emulator:\n{log}")]
    Compile {
        /// The file.
        path: PathBuf,
        /// The compiler command.
        compiler: String,
        /// Its diagnostics.
        log: String,
    },
    /// The built library could not be loaded or lacks what the build put in it.
    #[error("loading the module built from {path}: {detail}")]
    Load {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// Files in the build folder.
    #[error("module build folder: {0}")]
    Io(#[from] std::io::Error),
    /// This build has no SIMT emulator to load a module into ([`BackendError::NoEmulator`]).
    #[error("{0}")]
    NoEmulator(BackendError),
}

struct ModuleKernel {
    signature: &'static KernelSignature,
    entry: Entry,
}

/// A user's `.cu` file built for the SIMT emulator and loaded into this process.
pub struct SimtModule {
    path: PathBuf,
    kernels: Vec<ModuleKernel>,
    // Declared last: the entry points above point into it, so it is dropped after them.
    _library: libloading::Library,
}

impl std::fmt::Debug for SimtModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimtModule")
            .field("path", &self.path)
            .field(
                "kernels",
                &self
                    .kernels
                    .iter()
                    .map(|k| k.signature.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The kernels a source declares as `extern "C" __global__ void name(`, in order
/// (comments ignored; `__launch_bounds__(...)` before or after `void` allowed), read by the
/// parser the build uses for nanoddp's own kernels ([`declarations`]). A source whose
/// declarations cannot be read yields none; [`SimtModule::compile`] says why.
pub fn kernel_names(source: &str) -> Vec<String> {
    launchable(source)
        .map(|found| found.into_iter().map(|d| d.name).collect())
        .unwrap_or_default()
}

/// The declarations of `source` a module can launch: those declared `extern "C"`.
fn launchable(source: &str) -> Result<Vec<Declaration>, DeclarationError> {
    let mut found = declarations::parse(source)?;
    found.retain(|d| d.extern_c);
    Ok(found)
}

/// The source with `#include "simt.cuh"` replaced by the header itself (for NVRTC, which
/// has no include folder for it). Other local includes are not supported there.
fn inline_header(source: &str) -> String {
    source
        .lines()
        .map(|l| {
            let t = l.trim();
            if t.starts_with("#include") && t.contains("\"simt.cuh\"") {
                format!("{SIMT_HEADER}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

impl SimtModule {
    /// Builds `path` for the emulator and loads it. Takes a second or two (a C++ compile).
    /// Each kernel's signature is kept for the life of the process (a few bytes per kernel).
    pub fn compile(path: impl AsRef<Path>) -> Result<SimtModule, ModuleError> {
        if !super::simt::EMULATOR_BUILT {
            return Err(ModuleError::NoEmulator(BackendError::NoEmulator));
        }
        let path = path.as_ref().to_path_buf();
        let source = std::fs::read_to_string(&path).map_err(|source| ModuleError::Read {
            path: path.clone(),
            source,
        })?;
        let declared = launchable(&source).map_err(|source| ModuleError::Declaration {
            path: path.clone(),
            source,
        })?;
        if declared.is_empty() {
            return Err(ModuleError::NoKernels { path });
        }
        let shown = path.canonicalize().unwrap_or_else(|_| path.clone());
        let lowered =
            lower_static_shared(&strip_comments(&source), &path).map_err(ModuleError::Lowering)?;
        let mut shim = format!(
            "// @generated by nanoddp::backend::simt_module from {}\n#line 1 \"{}\"\n{lowered}\n",
            shown.display(),
            shown.display()
        );
        shim.push_str(
            "// ---- generated entry points\n#line 1 \"<nanoddp entry points>\"\n\
             extern \"C\" int simt_module_bind(const void* table) {\n\
             \x20   auto* t = static_cast<const ::simt::RuntimeTable*>(table);\n\
             \x20   if (t->version != ::simt::RUNTIME_TABLE_VERSION) return 1;\n\
             \x20   ::simt::runtime = t;\n    return 0;\n}\n",
        );
        for name in declared.iter().map(|d| &d.name) {
            shim.push_str(&format!(
                "extern \"C\" void simt_user_entry_{name}(void* const* params) {{ ::simt::invoke({name}, params); }}\n\
                 extern \"C\" const char* simt_user_signature_{name}() {{ static const std::string s = ::simt::signature({name}); return s.c_str(); }}\n"
            ));
        }

        static BUILDS: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nanoddp-simt-module-{}-{}",
            std::process::id(),
            BUILDS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let result = build_and_load(&path, &shown, &dir, &shim, &declared);
        // The loaded library stays mapped after its file is gone.
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    /// The file this module was built from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The signatures of the module's kernels, in source order (parameter names are
    /// `arg0`, `arg1`, ...: only the types are known).
    pub fn kernels(&self) -> impl Iterator<Item = &KernelSignature> {
        self.kernels.iter().map(|k| k.signature)
    }

    /// Runs `kernel` on `dev` with `args`, checked against the kernel's parameter types
    /// (count, scalar types, const-ness), as nanoddp's own launches are. Synchronous.
    ///
    /// # Safety
    /// As [`crate::backend::KernelDevice::launch`]: pointer arguments must be live buffers of the
    /// emulator and the kernel must stay inside them given its scalar arguments (past the
    /// end it hits a guard page and returns an error, but before the start it does not).
    pub unsafe fn launch(
        &self,
        dev: &SimtDevice,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), BackendError> {
        let k = self
            .kernels
            .iter()
            .find(|k| k.signature.name == kernel)
            .ok_or_else(|| BackendError::NoSuchKernel {
                module: self.path.display().to_string(),
                kernel: kernel.to_string(),
            })?;
        // SAFETY: the entry point was generated for this very kernel and its signature read
        // from the same instantiation; the rest is the caller's contract.
        unsafe { dev.launch_entry(k.entry, k.signature, cfg, args) }
    }

    /// The same file compiled by NVRTC for compute capability `arch` (e.g. `(8, 0)`), with
    /// `simt.cuh` inlined: PTX or a cubin to load on a GPU, and proof that the text nvcc
    /// sees compiles. Needs libnvrtc ([`nvrtc::is_available`]).
    pub fn compile_for_gpu(
        path: impl AsRef<Path>,
        arch: (i32, i32),
        output: Output,
    ) -> Result<Vec<u8>, BackendError> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path).map_err(|e| BackendError::Compile {
            module: path.display().to_string(),
            arch: format!("{arch:?}"),
            log: e.to_string(),
        })?;
        let name = path.display().to_string();
        nvrtc::compile_source(&name, &name, &inline_header(&source), arch, output)
    }
}

fn compiler_candidates() -> Vec<String> {
    std::env::var("CXX")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .into_iter()
        .chain(["c++".to_string(), "g++".to_string()])
        .collect()
}

fn build_and_load(
    path: &Path,
    shown: &Path,
    dir: &Path,
    shim: &str,
    declared: &[Declaration],
) -> Result<SimtModule, ModuleError> {
    std::fs::write(dir.join("simt.cuh"), SIMT_HEADER)?;
    let cpp = dir.join("module.cpp");
    std::fs::write(&cpp, shim)?;
    let so = dir.join("module.so");
    let mut tried = Vec::new();
    let mut ran = None;
    for cxx in compiler_candidates() {
        let mut cmd = Command::new(&cxx);
        cmd.args([
            "-std=c++20",
            "-O2",
            "-fPIC",
            "-shared",
            "-DSIMT_MODULE",
            "-fno-strict-aliasing",
            "-Wno-unused-parameter",
        ])
        .arg(format!("-I{}", dir.display()));
        if let Some(parent) = shown.parent() {
            cmd.arg(format!("-I{}", parent.display()));
        }
        cmd.arg(&cpp).arg("-o").arg(&so);
        match cmd.output() {
            Ok(out) => {
                ran = Some((cxx, out));
                break;
            }
            Err(_) => tried.push(cxx),
        }
    }
    let Some((compiler, out)) = ran else {
        return Err(ModuleError::NoCompiler {
            tried: tried.join(", "),
        });
    };
    if !out.status.success() {
        return Err(ModuleError::Compile {
            path: path.to_path_buf(),
            compiler,
            log: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let load_error = |detail: String| ModuleError::Load {
        path: path.to_path_buf(),
        detail,
    };
    // SAFETY: the library was just built from our shim: its initializers only set up
    // statics, and it defines the symbols read below with the types used here.
    let library =
        unsafe { libloading::Library::new(&so) }.map_err(|e| load_error(e.to_string()))?;
    // SAFETY: `simt_module_bind` is generated with exactly this C signature.
    let bind =
        unsafe { library.get::<unsafe extern "C" fn(*const c_void) -> i32>(b"simt_module_bind\0") }
            .map_err(|e| load_error(e.to_string()))?;
    // SAFETY: the table is a static of the runtime linked into this program, valid forever.
    if unsafe { bind(simt_runtime_table()) } != 0 {
        return Err(load_error(
            "built against a different simt.cuh runtime table version".into(),
        ));
    }
    let module_name = leak(
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let mut kernels = Vec::new();
    for declaration in declared {
        let name = &declaration.name;
        // SAFETY: generated for every name with these C signatures.
        let (entry, signature) = unsafe {
            (
                library
                    .get::<Entry>(format!("simt_user_entry_{name}\0").as_bytes())
                    .map(|s| *s),
                library
                    .get::<unsafe extern "C" fn() -> *const c_char>(
                        format!("simt_user_signature_{name}\0").as_bytes(),
                    )
                    .map(|s| *s),
            )
        };
        let (entry, signature) = (
            entry.map_err(|e| load_error(e.to_string()))?,
            signature.map_err(|e| load_error(e.to_string()))?,
        );
        // SAFETY: returns a NUL-terminated string owned by a static of the library.
        let text = unsafe { CStr::from_ptr(signature()) }
            .to_string_lossy()
            .into_owned();
        let params = if text.is_empty() {
            Vec::new()
        } else {
            text.split(',')
                .enumerate()
                .map(|(i, code)| {
                    ParamKind::from_code(code)
                        .map(|kind| Param {
                            name: leak(format!("arg{i}")),
                            kind,
                        })
                        .ok_or_else(|| load_error(format!("{name}: parameter type `{code}`")))
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        let signature: &'static KernelSignature = Box::leak(Box::new(KernelSignature {
            module: module_name,
            name: leak(name.clone()),
            line: declaration.line,
            params: Box::leak(params.into_boxed_slice()),
            max_threads: declaration.launch_bounds.map(|b| b.max_threads),
            min_blocks: declaration.launch_bounds.and_then(|b| b.min_blocks),
        }));
        kernels.push(ModuleKernel { signature, entry });
    }
    Ok(SimtModule {
        path: path.to_path_buf(),
        kernels,
        _library: library,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Scalar;

    #[test]
    fn kernel_names_follow_the_declarations_and_skip_comments_and_device_functions() {
        let src = r#"
            #include "simt.cuh"
            // extern "C" __global__ void commented(float* x) {}
            __device__ float helper(float x) { return x; }
            extern "C" __global__ void first(float* x, int n) {}
            extern "C" __global__ void __launch_bounds__(256) second(const __half* h) {}
            __global__ void not_extern_c(float* x) {}
            /* extern "C" __global__ void blocked(int n) {} */
        "#;
        assert_eq!(kernel_names(src), ["first", "second"]);
    }

    #[test]
    fn signature_codes_map_to_parameter_kinds() {
        assert_eq!(
            ParamKind::from_code("f32"),
            Some(ParamKind::Value(Scalar::F32))
        );
        assert_eq!(
            ParamKind::from_code("const f16*"),
            Some(ParamKind::ConstPtr(Scalar::F16))
        );
        assert_eq!(
            ParamKind::from_code("u8*"),
            Some(ParamKind::MutPtr(Scalar::U8))
        );
        assert_eq!(ParamKind::from_code("bool"), None);
    }
}
