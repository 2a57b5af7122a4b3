//! The files a subcommand writes, checked together before any work: each may be written
//! where it is named ([`checkpoint::check_destination`]), its name gives a format the
//! subcommand writes ([`check_format`]), and no two name the same file, nor an output a file
//! the run reads ([`check_outputs`]). A typo then costs nothing, and one output never
//! replaces another (the checkpoint's rename over the metrics, say).

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nanoddp::train::checkpoint;

use super::CliError;

/// A file named on the command line, by the flag that names it.
#[derive(Debug, Clone, Copy)]
pub struct Named<'a> {
    /// The flag (`--save`).
    pub flag: &'static str,
    /// The path as given.
    pub path: &'a Path,
}

/// Refuses a name whose extension is none of `formats` (lowercase, without the dot): the
/// format a file is written in follows from its name, and a name that gives none the
/// subcommand writes is a mistake found before any work, not after it.
pub fn check_format(out: Named<'_>, formats: &[&str]) -> Result<(), CliError> {
    let ext = out
        .path
        .extension()
        .and_then(OsStr::to_str)
        .map(str::to_ascii_lowercase);
    if ext.as_deref().is_some_and(|e| formats.contains(&e)) {
        return Ok(());
    }
    let names = formats
        .iter()
        .map(|f| format!(".{f}"))
        .collect::<Vec<_>>()
        .join(" or ");
    Err(CliError::Input(format!(
        "{} {}: the format follows the name, and {} writes {names} only: end the name in {names}",
        out.flag,
        out.path.display(),
        out.flag
    )))
}

/// Checks that every output can be written where it is named (the folder exists and takes
/// new files, and the path is absent or a regular file) and that no two of them, nor an
/// output and an input, are one file, after `..`, symbolic links in the folders and hard
/// links. `may_share` lists (output flag, input flag) pairs that may name the same file: a
/// run that saves over the checkpoint it started from.
pub fn check_outputs(
    outputs: &[Named<'_>],
    inputs: &[Named<'_>],
    may_share: &[(&str, &str)],
) -> Result<(), CliError> {
    for out in outputs {
        checkpoint::check_destination(out.path)?;
    }
    let ids: Vec<_> = outputs.iter().map(|o| FileId::of(o.path)).collect();
    for (i, (a, id_a)) in outputs.iter().zip(&ids).enumerate() {
        for (b, id_b) in outputs[i + 1..].iter().zip(&ids[i + 1..]) {
            if id_a.same(id_b) {
                return Err(same_file(a, b));
            }
        }
        for input in inputs {
            if !may_share.contains(&(a.flag, input.flag)) && id_a.same(&FileId::of(input.path)) {
                return Err(same_file(a, input));
            }
        }
    }
    Ok(())
}

fn same_file(a: &Named<'_>, b: &Named<'_>) -> CliError {
    CliError::Input(format!(
        "{} {} and {} {} are the same file: one would replace the other; name two files",
        a.flag,
        a.path.display(),
        b.flag,
        b.path.display()
    ))
}

/// What makes two paths one file.
#[derive(Debug)]
struct FileId {
    /// The path with `..` and every symbolic link resolved (its folder's, where the file is
    /// not there yet).
    resolved: Option<PathBuf>,
    /// Device and inode of an existing file (hard links share them).
    inode: Option<(u64, u64)>,
}

impl FileId {
    fn of(path: &Path) -> FileId {
        let resolved = std::fs::canonicalize(path).ok().or_else(|| {
            let folder = checkpoint::folder_of(path);
            Some(std::fs::canonicalize(folder).ok()?.join(path.file_name()?))
        });
        let inode = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        FileId { resolved, inode }
    }

    fn same(&self, other: &FileId) -> bool {
        fn both<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            a.is_some() && a == b
        }
        both(&self.resolved, &other.resolved) || both(&self.inode, &other.inode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_under_two_names_is_found() {
        let dir = std::env::temp_dir().join(format!("nanoddp-outputs-{}", std::process::id()));
        let sub = dir.join("logs");
        std::fs::create_dir_all(&sub).unwrap();
        let file = dir.join("x.jsonl");
        std::fs::write(&file, b"{}\n").unwrap();
        let hard = dir.join("hard.jsonl");
        let _ = std::fs::remove_file(&hard);
        std::fs::hard_link(&file, &hard).unwrap();
        let via_dots = sub.join("..").join("x.jsonl");
        let id = FileId::of(&file);
        assert!(id.same(&FileId::of(&via_dots)), "`..` resolved");
        assert!(id.same(&FileId::of(&hard)), "hard links share an inode");
        assert!(!id.same(&FileId::of(&dir.join("y.jsonl"))));
        // Two names of a file that does not exist yet.
        let (a, b) = (dir.join("new.png"), sub.join("../new.png"));
        assert!(FileId::of(&a).same(&FileId::of(&b)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_name_without_a_written_format_is_refused_naming_the_formats() {
        let ok = |p: &str| {
            check_format(
                Named {
                    flag: "--plot",
                    path: Path::new(p),
                },
                &["png", "svg"],
            )
        };
        assert!(ok("a.png").is_ok() && ok("b.SVG").is_ok());
        for bad in ["p.txt", "noext", "x.png.bak"] {
            let e = ok(bad).unwrap_err().to_string();
            assert!(e.contains(".png or .svg") && e.contains(bad), "{e}");
        }
    }
}
