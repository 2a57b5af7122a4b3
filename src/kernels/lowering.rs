//! Source lowering for the SIMT emulator's host build, shared by the build script (`build/`, the crate's
//! own kernels, compiled with `#[path]` into the build script) and by
//! [`crate::backend::simt_module`] (a user's kernel, compiled at run time).

use std::fmt::Write as _;
use std::path::Path;

/// Blanks out comments (keeping newlines, so line numbers stay right).
pub fn strip_comments(src: &str) -> String {
    let bytes = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            i += 2;
            while i < bytes.len() && !bytes[i..].starts_with(b"*/") {
                if bytes[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Appends `SIMT_SHARED_REGISTER(name);` after every static `__shared__` declaration of
/// `code` (comments already blanked). `#define` lines are left alone.
pub fn lower_static_shared(code: &str, path: &Path) -> Result<String, String> {
    let mut out = String::with_capacity(code.len() + 256);
    let mut rest = code;
    let mut line_no = 1;
    while let Some(at) = rest.find("__shared__") {
        let before = &rest[..at];
        let line_start = before.rfind('\n').map_or(0, |p| p + 1);
        let here = line_no + before.matches('\n').count();
        let in_directive = before[line_start..].trim_start().starts_with('#');
        let is_extern = before.trim_end().ends_with("extern");
        let Some(semi) = rest[at..].find(';').map(|s| at + s) else {
            break;
        };
        if in_directive || is_extern {
            out.push_str(&rest[..at + "__shared__".len()]);
            line_no += rest[..at + "__shared__".len()].matches('\n').count();
            rest = &rest[at + "__shared__".len()..];
            continue;
        }
        let decl = &rest[at + "__shared__".len()..semi];
        let mut depth = 0i32;
        for c in decl.chars() {
            match c {
                '[' | '(' | '{' | '<' => depth += 1,
                ']' | ')' | '}' | '>' => depth -= 1,
                ',' if depth == 0 => {
                    return Err(format!(
                        "{}:{here}: declare one __shared__ variable per statement (the emulator registers each)",
                        path.display()
                    ))
                }
                _ => {}
            }
        }
        let head = decl.split(['[', '=']).next().unwrap_or(decl);
        let Some(name) = head
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .rfind(|w| !w.is_empty())
        else {
            return Err(format!(
                "{}:{here}: cannot find the name in `__shared__{decl};`",
                path.display()
            ));
        };
        out.push_str(&rest[..=semi]);
        let _ = write!(out, " SIMT_SHARED_REGISTER({name});");
        line_no += rest[..=semi].matches('\n').count();
        rest = &rest[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
