//! Build script: turns `kernels/*.cu` into what the crate embeds.
//!
//! For every kernel file it always produces
//!   * the source with local `#include "..."` flattened (for NVRTC at run time), and
//!   * the signatures of its `extern "C" __global__` entry points, parsed from the source,
//!     from which the typed Rust launchers are generated (one definition, every backend).
//!
//! When nvcc is found (env `NVCC`, `$CUDA_HOME/bin`, `$CUDA_PATH/bin`, then `PATH`; never when
//! `NANODDP_NO_NVCC=1`) it also compiles each file to a fatbin (SASS for sm_80 and sm_90, PTX
//! for compute_75) and keeps the `ptxas -v` resource report. Without nvcc the crate still
//! builds; the CUDA backend compiles the embedded source with NVRTC when it first needs it.
//!
//! It also compiles the same kernels as host C++ for the SIMT emulator ([`host_build`]),
//! together with the emulator's runtime `kernels/simt_host.cpp`, into a static library.
//!
//! Everything lands in `$OUT_DIR/kernels_generated.rs`, included by `src/kernels/mod.rs`.

use std::collections::HashSet;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

// The source lowering the host build shares with run-time module builds
// (nanoddp::backend::simt_module): one implementation for both.
#[path = "src/kernels/lowering.rs"]
mod lowering;

/// Real GPU architectures we ship SASS for, and the virtual one we ship PTX for (JIT for
/// anything else, e.g. sm_75 or sm_100+).
const SASS_ARCHS: &[&str] = &["sm_80", "sm_90"];
const PTX_ARCH: &str = "compute_75";
const NVCC_FLAGS: &[&str] = &["-O3", "-lineinfo", "-std=c++17", "-Xptxas", "-v"];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=kernels");
    println!("cargo::rerun-if-changed=cuda-standin");
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "PATH",
        "NANODDP_NO_NVCC",
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

    let nvcc = find_nvcc();
    let toolchain = match &nvcc {
        Some(nvcc) => {
            let version = nvcc_version(nvcc);
            println!(
                "cargo::warning=nanoddp: compiling kernels with {} ({version})",
                nvcc.display()
            );
            Some(version)
        }
        None => {
            println!(
                "cargo::warning=nanoddp: nvcc not found (set NVCC or CUDA_HOME); kernels will be \
                 compiled at run time by NVRTC when a GPU is used"
            );
            None
        }
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
                scope.spawn(move || nvcc.map(|nvcc| compile_fatbin(nvcc, m, kernel_dir, out)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("nvcc thread panicked"))
            .collect()
    });

    host_build(&modules, &kernel_dir, &out);
    standin_build(&modules, &root, &out);

    let generated = generate_rust(&modules, &reports, toolchain.as_deref(), nvcc.as_deref());
    fs::write(out.join("kernels_generated.rs"), generated).expect("write kernels_generated.rs");
}

/// The `cc` half of the build: compiles the same kernels as host C++ for the SIMT emulator.
///
/// gcc takes `.cu` for a linker input, so each kernel file becomes a generated `.cpp` shim
/// holding its flattened source (comments blanked, line numbers kept by `#line`) with one
/// lowering step: each static `__shared__` declaration is followed by
/// `SIMT_SHARED_REGISTER(name);`, so the emulator can poison it at the start of every
/// block. The shim ends with one `extern "C"` entry point per kernel that unpacks CUDA's
/// `kernelParams` array (pointers to each argument) into the typed call.
fn host_build(modules: &[Module], kernel_dir: &Path, out: &Path) {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .opt_level(2) // kernels run thousands of fibers; unoptimized they crawl even in tests
        .include(kernel_dir)
        .flag("-ftls-model=initial-exec")
        .flag("-fno-strict-aliasing")
        .flag_if_supported("-Wno-unused-parameter")
        .file(kernel_dir.join("simt_host.cpp"));
    for m in modules {
        let flat =
            fs::read_to_string(out.join(format!("{}.flat.cu", m.name))).expect("flattened source");
        let mut shim = format!(
            "// @generated by build.rs from {} for the SIMT emulator\n",
            m.path.display()
        );
        shim.push_str(
            &lowering::lower_static_shared(&lowering::strip_comments(&flat), &m.path)
                .unwrap_or_else(|e| panic!("{e}")),
        );
        shim.push_str(
            "\n// Entry points: CUDA's kernelParams convention, one pointer per argument.\n",
        );
        for k in &m.kernels {
            let args: Vec<String> = k
                .params
                .iter()
                .enumerate()
                .map(|(i, p)| format!("*static_cast<{} const*>(params[{i}])", p.c_type()))
                .collect();
            let _ = writeln!(
                shim,
                "extern \"C\" void {}(void* const* params) {{ {}({}); }}",
                simt_entry_symbol(m, k),
                k.name,
                args.join(", ")
            );
        }
        let path = out.join(format!("simt_{}.cpp", m.name));
        fs::write(&path, shim).expect("write host shim");
        build.file(path);
    }
    build.compile("nanoddp_simt");
}

/// The CUDA driver stand-in (`cuda-standin/`): a `libcuda.so.1` that runs the kernels on
/// the CPU, built into `target/<profile>/cuda-standin/` (with a `libcuda.so` link) so that
/// `LD_LIBRARY_PATH=target/<profile>/cuda-standin` puts it in front of any cudarc program.
///
/// It links its own copy of the SIMT runtime and of the host-compiled kernels (the shims
/// [`host_build`] wrote), without `-ftls-model=initial-exec`: a library loaded with `dlopen`
/// cannot count on static TLS space for the kernels' `__shared__` arrays. Hidden visibility
/// and a version script keep that copy from clashing with the program's own.
fn standin_build(modules: &[Module], root: &Path, out: &Path) {
    let standin_dir = root.join("cuda-standin");
    // The registry: every kernel's entry point, parameter kinds and launch bounds.
    let mut registry = String::from(
        "// @generated by build.rs: the kernels the stand-in's SIMT executor runs.\n\
         #include \"registry.h\"\n\n",
    );
    for m in modules {
        for k in &m.kernels {
            let _ = writeln!(
                registry,
                "extern \"C\" void {}(void* const* params);",
                simt_entry_symbol(m, k)
            );
        }
    }
    registry.push_str("\nnamespace standin {\nconst RegisteredKernel standin_kernels[] = {\n");
    let mut count = 0;
    for m in modules {
        for k in &m.kernels {
            let params: String = k
                .params
                .iter()
                .map(|p| match (p.pointer, p.scalar) {
                    (Some(Mutability::Const), _) => 'r',
                    (Some(Mutability::Mut), _) => 'w',
                    (None, "U8") => '1',
                    (None, "F16") => '2',
                    (None, "F32" | "I32" | "U32") => '4',
                    (None, _) => '8',
                })
                .collect();
            let _ = writeln!(
                registry,
                "    {{{:?}, {:?}, {}, {:?}, {}}},",
                m.name,
                k.name,
                simt_entry_symbol(m, k),
                params,
                k.max_threads.unwrap_or(0)
            );
            count += 1;
        }
    }
    let _ = writeln!(
        registry,
        "}};\nconst unsigned standin_kernel_count = {count};\n}}  // namespace standin"
    );
    let registry_path = out.join("standin_registry.cpp");
    fs::write(&registry_path, registry).expect("write the stand-in registry");

    let mut sources = vec![
        root.join("kernels").join("simt_host.cpp"),
        standin_dir.join("standin.cpp"),
        standin_dir.join("simt_executor.cpp"),
        registry_path,
    ];
    sources.extend(
        modules
            .iter()
            .map(|m| out.join(format!("simt_{}.cpp", m.name))),
    );
    let compiler = cc::Build::new().cpp(true).get_compiler();
    let objects: Vec<PathBuf> = std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .iter()
            .map(|src| {
                let (compiler, standin_dir) = (&compiler, &standin_dir);
                let obj = out.join(format!(
                    "standin_{}.o",
                    src.file_stem().and_then(|s| s.to_str()).unwrap_or("x")
                ));
                scope.spawn(move || {
                    let status = Command::new(compiler.path())
                        .args(["-std=c++20", "-O2", "-fPIC", "-fvisibility=hidden"])
                        .args(["-fno-strict-aliasing", "-Wall", "-Wno-unused-parameter"])
                        .arg("-I")
                        .arg(root.join("kernels"))
                        .arg("-I")
                        .arg(standin_dir)
                        .arg("-c")
                        .arg(src)
                        .arg("-o")
                        .arg(&obj)
                        .status()
                        .unwrap_or_else(|e| {
                            panic!("cannot run {}: {e}", compiler.path().display())
                        });
                    assert!(
                        status.success(),
                        "compiling {} for the CUDA stand-in failed",
                        src.display()
                    );
                    obj
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("stand-in compile thread panicked"))
            .collect()
    });
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let profile_dir = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR lies under target/<profile>/build");
    let dir = profile_dir.join("cuda-standin");
    fs::create_dir_all(&dir).expect("create target/<profile>/cuda-standin");
    let tmp = dir.join("libcuda.so.1.tmp");
    let status = Command::new(compiler.path())
        .args(["-shared", "-Wl,-soname,libcuda.so.1", "-Wl,-z,defs"])
        .arg(format!(
            "-Wl,--version-script={}",
            standin_dir.join("exports.map").display()
        ))
        .arg("-o")
        .arg(&tmp)
        .args(&objects)
        .args(["-lpthread", "-ldl"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", compiler.path().display()));
    assert!(status.success(), "linking the CUDA stand-in failed");
    // Renamed into place, so a program starting meanwhile never loads half a library.
    fs::rename(&tmp, dir.join("libcuda.so.1")).expect("install libcuda.so.1");
    let link = dir.join("libcuda.so");
    if fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("libcuda.so.1", &link).expect("link libcuda.so");
    }
    println!("cargo::rustc-env=NANODDP_STANDIN_DIR={}", dir.display());
}

fn simt_entry_symbol(m: &Module, k: &Kernel) -> String {
    format!("simt_entry_{}_{}", m.name, k.name)
}

// ---------------------------------------------------------------------------------------------
// Finding and running nvcc

fn find_nvcc() -> Option<PathBuf> {
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

fn nvcc_version(nvcc: &Path) -> String {
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
fn compile_fatbin(nvcc: &Path, module: &Module, kernel_dir: &Path, out: &Path) -> String {
    let mut cmd = Command::new(nvcc);
    cmd.arg("-fatbin")
        .args(NVCC_FLAGS)
        .arg("-I")
        .arg(kernel_dir);
    for sm in SASS_ARCHS {
        let compute = sm.replace("sm_", "compute_");
        cmd.arg("-gencode").arg(format!("arch={compute},code={sm}"));
    }
    cmd.arg("-gencode")
        .arg(format!("arch={PTX_ARCH},code={PTX_ARCH}"));
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

// ---------------------------------------------------------------------------------------------
// Parsing kernels: flattened source and entry-point signatures

/// One `kernels/<name>.cu` file.
struct Module {
    name: String,
    path: PathBuf,
    kernels: Vec<Kernel>,
}

struct Kernel {
    name: String,
    line: usize,
    params: Vec<Param>,
    /// `__launch_bounds__(N)`: the most threads per block the kernel is compiled for.
    max_threads: Option<u32>,
}

struct Param {
    name: String,
    /// Rust type of the scalar (`f32`, `half::f16`, `u64`, ...).
    rust: &'static str,
    /// Name of the `Scalar` variant in the crate.
    scalar: &'static str,
    pointer: Option<Mutability>,
}

impl Param {
    /// The C++ type the emulator's entry point casts this argument to.
    fn c_type(&self) -> String {
        let base = match self.scalar {
            "F32" => "float",
            "F64" => "double",
            "F16" => "__half",
            "I32" => "int",
            "U32" => "unsigned int",
            "I64" => "long long",
            "U64" => "unsigned long long",
            "U8" => "unsigned char",
            other => unreachable!("scalar {other}"),
        };
        match self.pointer {
            None => base.to_string(),
            Some(Mutability::Const) => format!("const {base}*"),
            Some(Mutability::Mut) => format!("{base}*"),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mutability {
    Const,
    Mut,
}

impl Module {
    fn parse(path: &Path, kernel_dir: &Path, out: &Path) -> Module {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("kernel file names are UTF-8")
            .to_string();
        let text =
            fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut seen = HashSet::new();
        let flat = flatten(path, kernel_dir, &mut seen);
        fs::write(out.join(format!("{name}.flat.cu")), flat).expect("write flattened source");
        let kernels = parse_kernels(&text, path);
        if kernels.is_empty() {
            panic!(
                "{} defines no extern \"C\" __global__ kernel",
                path.display()
            );
        }
        Module {
            name,
            path: path.to_path_buf(),
            kernels,
        }
    }
}

/// Inlines every local `#include "x"` (resolved next to the including file, each file once,
/// as `#pragma once` would) and keeps `#line` markers so NVRTC errors name the real file.
/// `#include <...>` (CUDA's own headers) are left for NVRTC's include path.
fn flatten(path: &Path, kernel_dir: &Path, seen: &mut HashSet<PathBuf>) -> String {
    let canonical = path
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if !seen.insert(canonical) {
        return String::new();
    }
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let display = path
        .strip_prefix(kernel_dir.parent().unwrap_or(kernel_dir))
        .unwrap_or(path);
    let mut out = format!("#line 1 \"{}\"\n", display.display());
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#pragma once") {
            out.push('\n');
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("#include") {
            let rest = rest.trim();
            if let Some(inc) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                let dir = path.parent().unwrap_or(kernel_dir);
                let target = dir.join(inc);
                if !target.exists() {
                    panic!(
                        "{}:{}: cannot find local include \"{inc}\"",
                        path.display(),
                        i + 1
                    );
                }
                out.push_str(&flatten(&target, kernel_dir, seen));
                let _ = writeln!(out, "#line {} \"{}\"", i + 2, display.display());
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn parse_kernels(text: &str, path: &Path) -> Vec<Kernel> {
    let code = lowering::strip_comments(text);
    let mut kernels = Vec::new();
    let mut search = 0;
    while let Some(found) = code[search..].find("__global__") {
        let at = search + found;
        search = at + "__global__".len();
        let line = code[..at].matches('\n').count() + 1;
        let where_ = format!("{}:{line}", path.display());
        // Skip the macro definition site in the portability header style `#define __global__`.
        let line_start = code[..at].rfind('\n').map_or(0, |p| p + 1);
        if code[line_start..at].trim_start().starts_with("#") {
            continue;
        }
        let before = code[line_start..at].trim();
        if !before.ends_with("extern \"C\"") {
            panic!(
                "{where_}: every __global__ kernel must be declared `extern \"C\" __global__` so \
                 its symbol name is stable for the launchers"
            );
        }
        let mut max_threads = None;
        let rest = skip_launch_bounds(code[search..].trim_start(), &where_, &mut max_threads);
        let rest = rest
            .strip_prefix("void")
            .unwrap_or_else(|| panic!("{where_}: a __global__ kernel must return void"))
            .trim_start();
        let rest = skip_launch_bounds(rest, &where_, &mut max_threads);
        let open = rest
            .find('(')
            .unwrap_or_else(|| panic!("{where_}: expected `(`"));
        let name = rest[..open].trim().to_string();
        let close = rest
            .find(')')
            .unwrap_or_else(|| panic!("{where_}: expected `)`"));
        let params = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "void")
            .map(|p| parse_param(p, &where_))
            .collect();
        kernels.push(Kernel {
            name,
            line,
            params,
            max_threads,
        });
    }
    kernels
}

/// Skips a `__launch_bounds__(maxThreads[, minBlocks])` at the start of `rest`, recording
/// its first argument (an integer literal: what the kernel is compiled for, and what the
/// launch checks enforce).
fn skip_launch_bounds<'a>(rest: &'a str, where_: &str, max_threads: &mut Option<u32>) -> &'a str {
    let Some(after) = rest.strip_prefix("__launch_bounds__") else {
        return rest;
    };
    let close = after
        .find(')')
        .unwrap_or_else(|| panic!("{where_}: unclosed __launch_bounds__"));
    let args = after[..close].trim_start().trim_start_matches('(');
    let first = args.split(',').next().unwrap_or("").trim();
    *max_threads = Some(first.parse().unwrap_or_else(|_| {
        panic!("{where_}: __launch_bounds__ takes an integer literal, got `{first}`")
    }));
    after[close + 1..].trim_start()
}

/// Parses one parameter such as `const float* __restrict__ x` or `unsigned long long n`.
fn parse_param(text: &str, where_: &str) -> Param {
    let spaced = text.replace('*', " * ");
    let mut words: Vec<&str> = spaced
        .split_whitespace()
        .filter(|w| *w != "__restrict__" && *w != "__restrict")
        .collect();
    let name = words
        .pop()
        .unwrap_or_else(|| panic!("{where_}: empty parameter"))
        .to_string();
    let stars = words.iter().filter(|w| **w == "*").count();
    let is_const = words.first() == Some(&"const");
    let base: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| *w != "*" && *w != "const")
        .collect();
    let base = base.join(" ");
    let (rust, scalar) = match base.as_str() {
        "float" => ("f32", "F32"),
        "double" => ("f64", "F64"),
        "__half" | "half" => ("half::f16", "F16"),
        "int" | "int32_t" => ("i32", "I32"),
        "unsigned" | "unsigned int" | "uint32_t" => ("u32", "U32"),
        "long long" | "int64_t" => ("i64", "I64"),
        "unsigned long long" | "uint64_t" => ("u64", "U64"),
        "unsigned char" | "uint8_t" => ("u8", "U8"),
        other => panic!(
            "{where_}: parameter `{text}`: type `{other}` has no Rust mapping; use float, double, \
             __half, int, unsigned, long long, unsigned long long or unsigned char (or pointers to them)"
        ),
    };
    let pointer = match stars {
        0 => None,
        1 if is_const => Some(Mutability::Const),
        1 => Some(Mutability::Mut),
        _ => panic!("{where_}: parameter `{text}`: pointers to pointers are not supported"),
    };
    if pointer.is_none() && scalar == "U8" || pointer.is_none() && scalar == "F16" {
        panic!(
            "{where_}: parameter `{text}`: pass bytes and halves by pointer, or widen to 32 bits"
        );
    }
    Param {
        name,
        rust,
        scalar,
        pointer,
    }
}

// ---------------------------------------------------------------------------------------------
// Code generation

fn generate_rust(
    modules: &[Module],
    reports: &[Option<String>],
    toolchain: Option<&str>,
    nvcc: Option<&Path>,
) -> String {
    let out = env::var("OUT_DIR").expect("OUT_DIR");
    let mut g = String::from("// @generated by build.rs from kernels/*.cu. Do not edit.\n\n");

    match toolchain {
        Some(version) => {
            let archs: Vec<String> = SASS_ARCHS.iter().map(|a| format!("{a:?}")).collect();
            let include = nvcc
                .and_then(|n| n.parent())
                .and_then(|bin| bin.parent())
                .map(|home| home.join("include"))
                .filter(|p| p.join("cuda_fp16.h").exists());
            let _ = writeln!(
                g,
                "/// How the kernels were prebuilt; `None` when the build found no nvcc.\n\
                 pub const PREBUILT: Option<Prebuilt> = Some(Prebuilt {{ nvcc_version: {version:?}, \
                 sass_archs: &[{}], ptx_arch: {PTX_ARCH:?}, cuda_include_dir: {:?} }});\n",
                archs.join(", "),
                include.map(|p| p.display().to_string()),
            );
        }
        None => g.push_str(
            "/// How the kernels were prebuilt; `None` when the build found no nvcc.\n\
             pub const PREBUILT: Option<Prebuilt> = None;\n\n",
        ),
    }

    g.push_str(
        "/// Every kernel file, in file-name order.\npub static MODULES: &[KernelModule] = &[\n",
    );
    for (m, report) in modules.iter().zip(reports) {
        let fatbin = match report {
            Some(_) => format!("Some(include_bytes!(\"{out}/{}.fatbin\"))", m.name),
            None => "None".to_string(),
        };
        let kernels: Vec<String> = m
            .kernels
            .iter()
            .map(|k| format!("&{}::{}", m.name, k.name.to_uppercase()))
            .collect();
        let _ = writeln!(
            g,
            "    KernelModule {{ name: {:?}, file: \"kernels/{}.cu\", source: include_str!(\"{out}/{}.flat.cu\"), \
             fatbin: {fatbin}, ptxas_report: {:?}, kernels: &[{}] }},",
            m.name,
            m.name,
            m.name,
            report,
            kernels.join(", ")
        );
    }
    g.push_str("];\n\n");

    g.push_str(
        "/// The SIMT emulator's host entry points, one per kernel (kernelParams convention).\n\
         pub(crate) mod simt_entries {\n    \
         /// A kernel compiled for the host: called once per emulated CUDA thread.\n    \
         pub(crate) type Entry = unsafe extern \"C\" fn(*const *mut core::ffi::c_void);\n    extern \"C\" {\n",
    );
    for m in modules {
        for k in &m.kernels {
            let _ = writeln!(
                g,
                "        fn {}(params: *const *mut core::ffi::c_void);",
                simt_entry_symbol(m, k)
            );
        }
    }
    g.push_str("    }\n    /// Every kernel's entry point, by signature.\n    pub(crate) static ENTRIES: &[(&crate::kernels::KernelSignature, Entry)] = &[\n");
    for m in modules {
        for k in &m.kernels {
            let _ = writeln!(
                g,
                "        (&super::{}::{}, {} as Entry),",
                m.name,
                k.name.to_uppercase(),
                simt_entry_symbol(m, k)
            );
        }
    }
    g.push_str("    ];\n}\n\n");

    for m in modules {
        let _ = writeln!(
            g,
            "/// Signatures and typed launchers of `kernels/{}.cu`.\npub mod {} {{\n    #[allow(unused_imports)]\n    \
             use crate::backend::{{Device, KernelArg, LaunchConfig}};\n    \
             use crate::kernels::{{KernelSignature, Param, ParamKind, Scalar}};\n",
            m.name, m.name
        );
        for k in &m.kernels {
            generate_kernel(&mut g, m, k);
        }
        g.push_str("}\n\n");
    }
    g
}

fn generate_kernel(g: &mut String, m: &Module, k: &Kernel) {
    let upper = k.name.to_uppercase();
    let params: Vec<String> = k
        .params
        .iter()
        .map(|p| {
            let kind = match p.pointer {
                None => format!("ParamKind::Value(Scalar::{})", p.scalar),
                Some(Mutability::Const) => format!("ParamKind::ConstPtr(Scalar::{})", p.scalar),
                Some(Mutability::Mut) => format!("ParamKind::MutPtr(Scalar::{})", p.scalar),
            };
            format!("Param {{ name: {:?}, kind: {kind} }}", p.name)
        })
        .collect();
    let _ = writeln!(
        g,
        "    /// Signature of `{}` (kernels/{}.cu:{}).\n    pub static {upper}: KernelSignature = KernelSignature {{ \
         module: {:?}, name: {:?}, line: {}, params: &[{}], max_threads: {:?} }};\n",
        k.name,
        m.name,
        k.line,
        m.name,
        k.name,
        k.line,
        params.join(", "),
        k.max_threads
    );

    let mut args = Vec::new();
    let mut values = Vec::new();
    for p in &k.params {
        let ident = rust_ident(&p.name);
        match p.pointer {
            None => {
                args.push(format!("{ident}: {}", p.rust));
                values.push(format!("KernelArg::{}({ident})", p.scalar));
            }
            // `x_or_null` parameters are optional buffers: `None` passes a null pointer.
            Some(mutability) => {
                let reference = if mutability == Mutability::Mut {
                    "&mut "
                } else {
                    "&"
                };
                if p.name.ends_with("_or_null") {
                    args.push(format!("{ident}: Option<{reference}D::Buffer<{}>>", p.rust));
                    values.push(format!(
                        "KernelArg::{}({ident})",
                        if mutability == Mutability::Mut {
                            "optional_mut"
                        } else {
                            "optional"
                        }
                    ));
                } else {
                    args.push(format!("{ident}: {reference}D::Buffer<{}>", p.rust));
                    values.push(format!(
                        "KernelArg::{}({ident})",
                        if mutability == Mutability::Mut {
                            "buffer_mut"
                        } else {
                            "buffer"
                        }
                    ));
                }
            }
        }
    }
    let _ = writeln!(
        g,
        "    /// Launches `{}` (kernels/{}.cu:{}) on `dev`.\n    ///\n    /// # Safety\n    /// The kernel indexes \
         its buffers by its scalar arguments with no bounds checks: they must describe\n    /// ranges inside the \
         buffers passed, as the kernel's comment defines.\n    #[allow(clippy::too_many_arguments)]\n    \
         pub unsafe fn {}<D: Device + ?Sized>(dev: &D, cfg: LaunchConfig, {}) -> Result<(), crate::backend::BackendError> {{\n        \
         // SAFETY: the caller upholds the kernel's bounds contract; the arguments match the signature by construction.\n        \
         unsafe {{ dev.launch(&{upper}, cfg, &[{}]) }}\n    }}\n",
        k.name,
        m.name,
        k.line,
        k.name,
        args.join(", "),
        values.join(", ")
    );
}

fn rust_ident(name: &str) -> String {
    const KEYWORDS: &[&str] = &[
        "type", "in", "ref", "mod", "fn", "loop", "match", "move", "use", "where", "self",
    ];
    if KEYWORDS.contains(&name) {
        format!("r#{name}")
    } else {
        name.to_string()
    }
}
