//! The kernel files and the entry points they declare.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::flatten::flatten;
use crate::lowering;

/// One `kernels/<name>.cu` file.
pub(crate) struct Module {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) kernels: Vec<Kernel>,
}

pub(crate) struct Kernel {
    pub(crate) name: String,
    pub(crate) line: usize,
    pub(crate) params: Vec<Param>,
    /// `__launch_bounds__(N)`: the most threads per block the kernel is compiled for.
    pub(crate) max_threads: Option<u32>,
}

pub(crate) struct Param {
    pub(crate) name: String,
    /// Rust type of the scalar (`f32`, `half::f16`, `u64`, ...).
    pub(crate) rust: &'static str,
    /// Name of the `Scalar` variant in the crate.
    pub(crate) scalar: &'static str,
    pub(crate) pointer: Option<Mutability>,
}

impl Param {
    /// The C++ type the emulator's entry point casts this argument to.
    pub(crate) fn c_type(&self) -> String {
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
pub(crate) enum Mutability {
    Const,
    Mut,
}

impl Module {
    pub(crate) fn parse(path: &Path, kernel_dir: &Path, out: &Path) -> Module {
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
