//! The kernel files and the entry points they declare, read by the parser the library shares
//! ([`crate::declarations`]).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::declarations::{self, DeclaredParam, LaunchBounds, ParamKind, Scalar};
use crate::flatten::flatten;

/// One `kernels/<name>.cu` file.
pub(crate) struct Module {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) kernels: Vec<Kernel>,
}

/// One `extern "C" __global__` entry point.
pub(crate) struct Kernel {
    pub(crate) name: String,
    pub(crate) line: u32,
    pub(crate) params: Vec<DeclaredParam>,
    pub(crate) launch_bounds: Option<LaunchBounds>,
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

/// The kernels `text` declares. Stricter than a run-time module build: every `__global__`
/// must be `extern "C"`, and every parameter typed so a Rust launcher can pass it.
fn parse_kernels(text: &str, path: &Path) -> Vec<Kernel> {
    let fail = |e: declarations::DeclarationError| -> ! {
        panic!("{}:{}: {}", path.display(), e.line, e.message)
    };
    let found = declarations::parse(text).unwrap_or_else(|e| fail(e));
    found
        .into_iter()
        .map(|d| {
            let where_ = format!("{}:{}", path.display(), d.line);
            if !d.extern_c {
                panic!(
                    "{where_}: every __global__ kernel must be declared `extern \"C\" __global__` so \
                     its symbol name is stable for the launchers"
                );
            }
            let params = d.typed_params().unwrap_or_else(|e| fail(e));
            for p in &params {
                if let ParamKind::Value(Scalar::U8 | Scalar::F16) = p.kind {
                    panic!(
                        "{where_}: parameter `{}`: pass bytes and halves by pointer, or widen to \
                         32 bits",
                        p.name
                    );
                }
            }
            Kernel {
                name: d.name,
                line: d.line,
                params,
                launch_bounds: d.launch_bounds,
            }
        })
        .collect()
}
