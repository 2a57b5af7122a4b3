//! What the build script (`build/`) embedded: every kernel file, its flattened source, the
//! signatures parsed from it, its shipped PTX (`kernels/ptx/`, current with nvcc's output),
//! and (when nvcc was found) the fatbin and a ptxas report with no spills.
//!
//! CI sets NANODDP_EXPECT_PREBUILT=1 (nvcc build) or 0 (NANODDP_NO_NVCC build), so a build
//! that silently took the other path fails here instead of skipping checks.

use std::collections::BTreeSet;
use std::path::Path;

use nanoddp::kernels::fatbin::{self, ImageKind};
use nanoddp::kernels::shipped_ptx::{self, ARCHS};
use nanoddp::kernels::{
    resources, KernelModule, KernelSignature, ParamKind, Prebuilt, Scalar, MODULES, PREBUILT,
};

fn kernel_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/kernels"))
}

#[test]
fn the_build_took_the_path_ci_asked_for() {
    match std::env::var("NANODDP_EXPECT_PREBUILT").as_deref() {
        Ok("1") => assert!(
            PREBUILT.is_some(),
            "expected an nvcc build, but the kernels were not prebuilt"
        ),
        Ok("0") => assert!(
            PREBUILT.is_none(),
            "expected a build without nvcc, but kernels were prebuilt"
        ),
        _ => eprintln!(
            "NANODDP_EXPECT_PREBUILT unset: accepting either build (prebuilt: {})",
            PREBUILT.is_some()
        ),
    }
    for m in MODULES {
        assert_eq!(
            m.fatbin.is_some(),
            PREBUILT.is_some(),
            "{}: fatbin presence disagrees with PREBUILT",
            m.name
        );
        assert_eq!(
            m.ptxas_report.is_some(),
            PREBUILT.is_some(),
            "{}: report presence disagrees",
            m.name
        );
    }
}

#[test]
fn every_kernel_file_is_embedded_once() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(kernel_dir())
        .expect("kernels/ exists")
        .filter_map(|e| e.ok()?.path().file_name()?.to_str().map(str::to_string))
        .filter_map(|name| name.strip_suffix(".cu").map(str::to_string))
        .collect();
    let embedded: Vec<&str> = MODULES.iter().map(|m| m.name).collect();
    assert_eq!(
        embedded
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>(),
        on_disk
    );
    assert_eq!(embedded.len(), on_disk.len(), "a module is embedded twice");
}

/// kernels/ptx/ holds exactly one file per kernel file and architecture, each for its
/// architecture, defining every entry point of its file, written by nvcc 13.0.
#[test]
fn every_kernel_file_ships_ptx_for_each_arch() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(shipped_ptx::DIR);
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("kernels/ptx/ exists")
        .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
        .collect();
    let want: BTreeSet<String> = MODULES
        .iter()
        .flat_map(|m| ARCHS.map(|a| shipped_ptx::file_name(m.name, a)))
        .collect();
    assert_eq!(
        on_disk, want,
        "kernels/ptx/ must hold one file per kernel file and architecture: tools/update-ptx"
    );
    for m in MODULES {
        let archs: Vec<u32> = m.ptx.iter().map(|p| p.arch).collect();
        assert_eq!(archs, ARCHS, "{}: embedded PTX", m.name);
        for p in m.ptx {
            let file = shipped_ptx::file_name(m.name, p.arch);
            let version = shipped_ptx::nvcc_version(p.text);
            assert!(
                version.is_some_and(|v| v.starts_with("13.0,")),
                "{file}: written by nvcc {version:?}, not 13.0"
            );
            assert!(
                p.text
                    .lines()
                    .any(|l| l == format!(".target sm_{}", p.arch)),
                "{file}: not PTX for compute_{}",
                p.arch
            );
            for k in m.kernels {
                let entry = format!(".entry {}(", k.name);
                assert!(p.text.contains(&entry), "{file}: no entry {}", k.name);
            }
        }
    }
}

/// With nvcc 13.0, the shipped PTX is byte for byte what this build's nvcc put in the
/// fatbins: it can never go stale. (The build compares them; another nvcc release emits
/// other PTX, so the comparison means something only with the one that wrote the files, which
/// CI's nvcc build, NANODDP_EXPECT_PREBUILT=1, must have.)
#[test]
fn the_shipped_ptx_is_what_nvcc_emits() {
    each_prebuilt_module("nothing to compare the shipped PTX with", |pre, m| {
        let shipped = m
            .ptx
            .first()
            .and_then(|p| shipped_ptx::nvcc_version(p.text));
        if shipped != Some(pre.nvcc_version) {
            assert_ne!(
                std::env::var("NANODDP_EXPECT_PREBUILT").as_deref(),
                Ok("1"),
                "{}: the shipped PTX was written by nvcc {shipped:?}, this build's is {}: CI \
                 needs the release that wrote it (tools/cuda-13.0.txt)",
                m.name,
                pre.nvcc_version
            );
            eprintln!(
                "not compared: {} was written by nvcc {shipped:?}, this build's is {}",
                m.name, pre.nvcc_version
            );
            return;
        }
        let stale: Vec<&&str> = pre
            .stale_ptx
            .iter()
            .filter(|f| f.starts_with(&format!("{}/{}.", shipped_ptx::DIR, m.name)))
            .collect();
        assert!(
            stale.is_empty(),
            "{stale:?}: not what nvcc {} emits from kernels/{}.cu; run tools/update-ptx and \
             commit the result",
            pre.nvcc_version,
            m.name
        );
    });
}

#[test]
fn flattened_sources_are_self_contained() {
    for m in MODULES {
        for (i, line) in m.source.lines().enumerate() {
            let t = line.trim_start();
            assert!(
                !(t.starts_with("#include") && t.contains('"')),
                "{}: line {} of the embedded source still includes a local file: {line}",
                m.name,
                i + 1
            );
        }
        // Every local header the file includes is inlined, once.
        let headers = std::fs::read_dir(kernel_dir())
            .unwrap()
            .filter_map(|e| e.ok()?.path().file_name()?.to_str().map(str::to_string))
            .filter(|n| n.ends_with(".cuh"));
        let original =
            std::fs::read_to_string(kernel_dir().join(format!("{}.cu", m.name))).unwrap();
        for h in headers {
            let included = original.contains(&format!("#include \"{h}\""));
            let inlined = m
                .source
                .matches(&format!("#line 1 \"kernels/{h}\""))
                .count();
            assert_eq!(
                inlined,
                usize::from(included),
                "{}: {h} inlined {inlined} times",
                m.name
            );
        }
    }
}

/// The C spelling of a parameter type, rendered independently of the parser the build
/// script uses (`src/kernels/declarations.rs` and its table of C types).
fn c_type(kind: ParamKind) -> String {
    let base = |s: Scalar| match s {
        Scalar::F32 => "float",
        Scalar::F64 => "double",
        Scalar::F16 => "__half",
        Scalar::BF16 => "__nv_bfloat16",
        Scalar::I32 => "int",
        Scalar::U32 => "unsigned int",
        Scalar::I64 => "long long",
        Scalar::U64 => "unsigned long long",
        Scalar::U8 => "unsigned char",
    };
    match kind {
        ParamKind::Value(s) => base(s).to_string(),
        ParamKind::ConstPtr(s) => format!("const {}*", base(s)),
        ParamKind::MutPtr(s) => format!("{}*", base(s)),
    }
}

/// Drops `__launch_bounds__(n)`: an attribute, not part of the signature.
fn strip_launch_bounds(text: &str) -> String {
    match text.find("__launch_bounds__") {
        Some(at) => {
            let close = at + text[at..].find(')').expect("closed");
            format!("{}{}", &text[..at], &text[close + 1..])
        }
        None => text.to_string(),
    }
}

fn normalize(text: &str) -> String {
    text.replace("__restrict__", "")
        .replace('*', "* ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" *", "*")
}

/// The declaration `text` (from its first line on) writes for kernel `name`: itself, or for
/// `simt.cuh`'s `NANODDP_ENTRY_EACH_TYPE(base, (bounds), (params), ...)`, the entry
/// point it defines for `name` (`base_f32`, `base_f16` or `base_bf16`), the storage type `T`
/// spelled out (written here, independently of the parser's table).
fn written_for(text: &str, name: &str) -> String {
    let Some(rest) = text.trim_start().strip_prefix("NANODDP_ENTRY_EACH_TYPE(") else {
        return text.to_string();
    };
    let (base, rest) = rest.split_once(',').expect("name, (bounds), ...");
    // Past the parenthesized launch bounds, to the comma before the parameters.
    let bounds_end = rest.find(')').expect("(bounds)");
    let rest = rest[bounds_end + 1..]
        .trim_start()
        .strip_prefix(',')
        .expect(", (params)");
    let c_type = match name.strip_prefix(base.trim()) {
        Some("_f32") => "float",
        Some("_f16") => "__half",
        Some("_bf16") => "__nv_bfloat16",
        other => panic!("{name} is not an entry of {base}: {other:?}"),
    };
    let params = rest.trim_start().strip_prefix('(').expect("(params)");
    let params = params
        .replace("T*", &format!("{c_type}*"))
        .replace("T ", &format!("{c_type} "));
    format!("extern \"C\" __global__ void {name}({params}")
}

#[test]
fn signatures_render_back_to_their_declarations() {
    let mut names = BTreeSet::new();
    for m in MODULES {
        let original =
            std::fs::read_to_string(kernel_dir().join(format!("{}.cu", m.name))).unwrap();
        let lines: Vec<&str> = original.lines().collect();
        for k in m.kernels {
            let k: &KernelSignature = k;
            assert_eq!(k.module, m.name);
            assert!(names.insert(k.name), "kernel {} defined twice", k.name);
            // The declaration starts on the recorded line and runs to the closing parenthesis.
            let from = k.line as usize - 1;
            let decl: String = strip_launch_bounds(&lines[from..].join(" "));
            let decl = written_for(&decl, k.name);
            let decl = &decl[..decl.find(')').expect("closing parenthesis")];
            let rendered: Vec<String> = k
                .params
                .iter()
                .map(|p| format!("{} {}", c_type(p.kind), p.name))
                .collect();
            let expected = format!(
                "extern \"C\" __global__ void {}({}",
                k.name,
                rendered.join(", ")
            );
            assert_eq!(
                normalize(decl),
                normalize(&expected),
                "{}:{}",
                m.file,
                k.line
            );
        }
    }
}

/// Runs `check` on the nvcc build and each of its modules, or notes that the test is skipped
/// for want of `missing` when the crate was built without nvcc.
fn each_prebuilt_module(missing: &str, check: impl Fn(&Prebuilt, &KernelModule)) {
    let Some(pre) = PREBUILT else {
        // Where CI expects an nvcc build, a skip would hide the check: fail instead.
        assert_ne!(
            std::env::var("NANODDP_EXPECT_PREBUILT").as_deref(),
            Ok("1"),
            "expected an nvcc build, but {missing}"
        );
        eprintln!("skipped: built without nvcc, {missing}");
        return;
    };
    for m in MODULES {
        check(&pre, m);
    }
}

#[test]
fn fatbins_hold_sass_for_each_arch_and_portable_ptx() {
    each_prebuilt_module("no fatbin to inspect", |pre, m| {
        let images = fatbin::images(m.fatbin.expect("prebuilt")).expect("fatbin parses");
        let sass: BTreeSet<String> = images
            .iter()
            .filter(|i| i.kind == ImageKind::Sass)
            .map(|i| format!("sm_{}", i.arch))
            .collect();
        // The fatbin's order of its PTX entries is nvcc's, not ours.
        let ptx: BTreeSet<String> = images
            .iter()
            .filter(|i| i.kind == ImageKind::Ptx)
            .map(|i| format!("compute_{}", i.arch))
            .collect();
        let want: BTreeSet<String> = pre.sass_archs.iter().map(|s| s.to_string()).collect();
        assert_eq!(sass, want, "{}: SASS images", m.name);
        let want_ptx: BTreeSet<String> = pre.ptx_archs.iter().map(|s| s.to_string()).collect();
        assert_eq!(ptx, want_ptx, "{}: PTX images", m.name);
    });
}

#[test]
fn ptxas_report_covers_exactly_the_kernels_and_nothing_spills() {
    each_prebuilt_module("no ptxas report", |pre, m| {
        let rows = resources::parse(m.ptxas_report.expect("prebuilt")).expect("report parses");
        let got: BTreeSet<(String, String)> = rows
            .iter()
            .map(|r| (r.kernel.clone(), r.arch.clone()))
            .collect();
        let want: BTreeSet<(String, String)> = m
            .kernels
            .iter()
            .flat_map(|k| {
                pre.sass_archs
                    .iter()
                    .map(move |a| (k.name.to_string(), a.to_string()))
            })
            .collect();
        assert_eq!(got, want, "{}: report entries", m.name);
        assert_eq!(
            rows.len(),
            want.len(),
            "{}: duplicate report entries",
            m.name
        );
        for r in &rows {
            assert!(
                r.registers > 0 && r.registers <= 255,
                "{}: {} registers on {}",
                r.kernel,
                r.registers,
                r.arch
            );
            assert!(
                !r.spills(),
                "{} spills on {}: {} B stored, {} B loaded; reduce register pressure",
                r.kernel,
                r.arch,
                r.spill_store_bytes,
                r.spill_load_bytes
            );
        }
    });
}
