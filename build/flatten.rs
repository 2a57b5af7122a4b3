//! Flattening a kernel file's local includes into one source.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// Inlines every local `#include "x"` (resolved next to the including file, each file once,
/// as `#pragma once` would) and keeps `#line` markers so NVRTC errors name the real file.
/// `#include <...>` (CUDA's own headers) are left for NVRTC's include path.
pub(crate) fn flatten(path: &Path, kernel_dir: &Path, seen: &mut HashSet<PathBuf>) -> String {
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
