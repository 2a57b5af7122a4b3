//! The kernels' PTX as the repository ships it, in `kernels/ptx/`: for every kernel file and
//! every virtual architecture in [`ARCHS`], the PTX the pinned nvcc emits with the build's
//! flags. A build without nvcc embeds these files, so the CUDA backend (on a GPU, whose driver
//! JIT-compiles PTX, or on the CPU stand-in for the driver) needs neither nvcc nor NVRTC. A
//! build with nvcc compares them with what its nvcc just emitted, and `NANODDP_UPDATE_PTX=1`
//! makes it rewrite them (`tools/update-ptx`).
//!
//! nvcc's PTX names where it was built: `-lineinfo` writes the absolute path of every source
//! file in `.file` directives, and the debug strings name functions with internal linkage after
//! a hash of that path (`_INTERNAL_<8 hex digits>_`). [`portable`] rewrites both, so a clone
//! anywhere emits the same bytes: kernel files relative to the crate root, CUDA's headers
//! under `cuda/include/`, the hash as zeros. The driver reads these only as debug information.
//!
//! Shared with the build script (`build/main.rs` includes this file), so both apply the same
//! rules.

/// Virtual architectures the repository ships PTX for, as `compute_XY` numbers: 7.5 (Turing),
/// 8.0 (Ampere; also what Ada's GPUs JIT-compile) and 9.0 (Hopper, and newer GPUs).
pub const ARCHS: [u32; 3] = [75, 80, 90];

/// Where the files live, relative to the crate root.
pub const DIR: &str = "kernels/ptx";

/// The shipped file of `module` for `compute_<arch>`, e.g. `conv.compute_90.ptx`.
pub fn file_name(module: &str, arch: u32) -> String {
    format!("{module}.compute_{arch}.ptx")
}

/// The newest of `archs` a GPU of compute capability `cc` can JIT-compile (PTX for
/// `compute_XY` runs on every GPU of capability X.Y or higher), if any.
pub fn best_for(archs: impl IntoIterator<Item = u32>, cc: (i32, i32)) -> Option<u32> {
    let gpu = i64::from(cc.0) * 10 + i64::from(cc.1);
    archs.into_iter().filter(|&a| i64::from(a) <= gpu).max()
}

/// The comment a shipped file opens with: which source, which nvcc and flags, what writes it.
/// The PTX after it is as the fatbin holds it (nvcc strips comments and indentation there).
pub fn with_header(ptx: &str, file: &str, nvcc_version: &str, arch: u32, flags: &str) -> String {
    format!(
        "// {file} for compute_{arch}, as nvcc {nvcc_version} ({flags}) puts it in the fatbin,\n\
         // with where it was built taken out. tools/update-ptx writes this file.\n{ptx}"
    )
}

/// The nvcc release that wrote a shipped file (`13.0, V13.0.88`), from its header.
pub fn nvcc_version(shipped: &str) -> Option<&str> {
    let first = shipped.lines().next()?;
    let (_, rest) = first.split_once(" as nvcc ")?;
    let (version, _) = rest.split_once(" (")?;
    Some(version)
}

/// `text` (PTX from nvcc, built in the crate at `root`) with the build's location taken out:
/// see the module's documentation.
pub fn portable(text: &str, root: &str) -> String {
    let root = format!("{}/", root.trim_end_matches('/'));
    let mut lines: Vec<String> = text.split('\n').map(|l| portable_file(l, &root)).collect();
    zero_internal_hashes(&mut lines);
    lines.join("\n")
}

/// A `.file N "PATH"` directive with PATH relative to the crate root, or for a file of CUDA's
/// own under `cuda/include/`; any other line unchanged.
fn portable_file(line: &str, root: &str) -> String {
    let Some(rest) = line.trim_start().strip_prefix(".file") else {
        return line.to_string();
    };
    let (Some(open), Some(close)) = (rest.find('"'), rest.rfind('"')) else {
        return line.to_string();
    };
    if close <= open {
        return line.to_string();
    }
    let path = &rest[open + 1..close];
    let relative = if let Some(inside) = path.strip_prefix(root) {
        inside.to_string()
    } else if let Some((_, header)) = path.split_once("/include/") {
        format!("cuda/include/{header}")
    } else {
        return line.to_string();
    };
    let indent = &line[..line.len() - line.trim_start().len()];
    format!(
        "{indent}.file{}\"{relative}\"{}",
        &rest[..open],
        &rest[close + 1..]
    )
}

/// Replaces the 8 hex digits of every `_INTERNAL_XXXXXXXX_` spelled out in `.b8` data (the
/// debug strings) with `0`s. A string may run over several `.b8` lines, so the bytes of
/// consecutive lines are searched as one.
fn zero_internal_hashes(lines: &mut [String]) {
    const MARK: &[u8] = b"_INTERNAL_";
    let mut start = 0;
    while start < lines.len() {
        if !lines[start].starts_with(".b8 ") {
            start += 1;
            continue;
        }
        let mut end = start;
        while end < lines.len() && lines[end].starts_with(".b8 ") {
            end += 1;
        }
        // The run's bytes, and for each the line it is on; a run that is not plain numbers
        // (a `.b8` data line of another form) is left alone.
        let mut bytes = Vec::new();
        let mut owner = Vec::new();
        let mut numeric = true;
        for (i, line) in lines[start..end].iter().enumerate() {
            for field in line[4..].split(',') {
                match field.trim().parse::<u8>() {
                    Ok(b) => {
                        bytes.push(b);
                        owner.push(start + i);
                    }
                    Err(_) => numeric = false,
                }
            }
        }
        let mut changed = Vec::new();
        if numeric {
            let mut at = 0;
            while let Some(found) = find(&bytes[at..], MARK) {
                let digits = at + found + MARK.len();
                let hashed = bytes
                    .get(digits..digits + 9)
                    .is_some_and(|h| h[..8].iter().all(u8::is_ascii_hexdigit) && h[8] == b'_');
                if hashed {
                    for b in &mut bytes[digits..digits + 8] {
                        *b = b'0';
                    }
                    changed.extend(owner[digits..digits + 8].iter().copied());
                }
                at = digits;
            }
        }
        changed.dedup();
        for line in changed {
            let values: Vec<String> = owner
                .iter()
                .zip(&bytes)
                .filter(|(o, _)| **o == line)
                .map(|(_, b)| b.to_string())
                .collect();
            lines[line] = format!(".b8 {}", values.join(","));
        }
        start = end;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b8(text: &str) -> String {
        let bytes: Vec<String> = text.bytes().map(|b| b.to_string()).collect();
        format!(".b8 {}", bytes.join(","))
    }

    #[test]
    fn paths_become_relative_and_hashes_zero() {
        let built = [
            "\t.file\t1 \"/home/a/nanoddp/kernels/conv.cu\"".to_string(),
            "\t.file\t2 \"/opt/v/lib/nvidia/cu13/bin/..//include/crt/mma.hpp\"".to_string(),
            "\t.file\t3 \"/elsewhere/x.h\"".to_string(),
            "$L__info_string7:".to_string(),
            b8("_ZN37_INTERNAL_0d90"),
            b8("54dd_7_conv_cu_c20dc9"),
            b8("_INTERNAL_12345678x"),
            "\t.loc\t1 879 0".to_string(),
        ]
        .join("\n");
        let got = portable(&built, "/home/a/nanoddp/");
        let want = [
            "\t.file\t1 \"kernels/conv.cu\"".to_string(),
            "\t.file\t2 \"cuda/include/crt/mma.hpp\"".to_string(),
            "\t.file\t3 \"/elsewhere/x.h\"".to_string(),
            "$L__info_string7:".to_string(),
            b8("_ZN37_INTERNAL_0000"),
            b8("0000_7_conv_cu_c20dc9"),
            b8("_INTERNAL_12345678x"),
            "\t.loc\t1 879 0".to_string(),
        ]
        .join("\n");
        assert_eq!(got, want);
        // Built in another place, the same bytes; and applied twice, no change.
        let moved = built
            .replace("/home/a/nanoddp", "/tmp/x")
            .replace("0d90", "ffff");
        assert_eq!(portable(&moved, "/tmp/x"), want);
        assert_eq!(portable(&want, "/home/a/nanoddp"), want);
    }

    #[test]
    fn the_header_names_the_nvcc() {
        let text = with_header(
            ".version 9.0\n",
            "kernels/a.cu",
            "13.0, V13.0.88",
            90,
            "-O3",
        );
        assert!(text.starts_with("// kernels/a.cu for compute_90, as nvcc 13.0, V13.0.88 (-O3)"));
        assert!(text.ends_with("\n.version 9.0\n"));
        assert_eq!(nvcc_version(&text), Some("13.0, V13.0.88"));
        assert_eq!(nvcc_version(".version 9.0"), None);
    }

    #[test]
    fn the_newest_arch_a_gpu_can_take() {
        assert_eq!(best_for(ARCHS, (9, 0)), Some(90));
        assert_eq!(best_for(ARCHS, (10, 0)), Some(90));
        assert_eq!(best_for(ARCHS, (8, 9)), Some(80));
        assert_eq!(best_for(ARCHS, (8, 0)), Some(80));
        assert_eq!(best_for(ARCHS, (7, 5)), Some(75));
        assert_eq!(best_for(ARCHS, (7, 0)), None);
    }
}
