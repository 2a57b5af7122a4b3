//! Finding Fashion-MNIST (or MNIST: same file names and format).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::idx::{read_images, read_labels, DataError, Images};

/// Train and test splits.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Where the files were found.
    pub dir: PathBuf,
    /// Training images.
    pub train_images: Images,
    /// Training labels.
    pub train_labels: Vec<u8>,
    /// Test images.
    pub test_images: Images,
    /// Test labels.
    pub test_labels: Vec<u8>,
}

impl Dataset {
    /// Keeps the first `n` training images and labels (all of them when there are no more).
    pub fn keep_train_images(&mut self, n: usize) {
        self.train_images.truncate(n);
        self.train_labels.truncate(n);
    }

    /// Keeps the first `n` test images and labels (all of them when there are no more).
    pub fn keep_test_images(&mut self, n: usize) {
        self.test_images.truncate(n);
        self.test_labels.truncate(n);
    }
}

const FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

/// The small subset shipped with the crate (tests, and a first run without the full set).
pub fn shipped_subset() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fashion-mnist-subset")
}

/// `dir/name.gz` or `dir/name`, whichever exists.
fn file(dir: &Path, name: &str) -> Option<PathBuf> {
    [dir.join(format!("{name}.gz")), dir.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

fn complete(dir: &Path) -> bool {
    FILES.iter().all(|f| file(dir, f).is_some())
}

/// The error for a folder that lacks files: naming them when it holds any of the four,
/// else the folders searched.
fn not_found(dirs: &[PathBuf]) -> DataError {
    for dir in dirs {
        let missing: Vec<&str> = FILES
            .iter()
            .copied()
            .filter(|f| file(dir, f).is_none())
            .collect();
        if missing.len() < FILES.len() {
            return DataError::MissingFiles {
                dir: dir.clone(),
                missing: missing.join(", "),
            };
        }
    }
    DataError::NotFound {
        searched: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The environment variable that names the data folder when `--data` does not.
pub const DATA_ENV: &str = "NANODDP_DATA";

/// The folders searched when neither `--data` nor [`DATA_ENV`] names one.
const SYSTEM_FOLDERS: [&str; 2] = ["/usr/share/datasets/fashion-mnist", "data/fashion-mnist"];

/// The folder named by `explicit` (from `--data`), else by `$NANODDP_DATA` (when set and not
/// empty), with how it was named (`--data DIR`, `NANODDP_DATA=DIR`): the only folder then
/// considered. `None` when neither names one and the system's folders are searched.
pub fn named_folder(explicit: Option<&Path>) -> Option<(PathBuf, String)> {
    named_in(explicit, std::env::var_os(DATA_ENV))
}

/// [`named_folder`] with the variable's value given.
fn named_in(explicit: Option<&Path>, env: Option<OsString>) -> Option<(PathBuf, String)> {
    if let Some(d) = explicit {
        return Some((d.to_path_buf(), format!("--data {}", d.display())));
    }
    let d = PathBuf::from(env.filter(|v| !v.is_empty())?);
    let given = format!("{DATA_ENV}={}", d.display());
    Some((d, given))
}

/// The folders searched, in order: the one [`named_folder`] names (`--data`, else
/// `$NANODDP_DATA`) and no other; else Debian's `/usr/share/datasets/fashion-mnist`, then
/// `./data/fashion-mnist`.
pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    match named_folder(explicit) {
        Some((dir, _)) => vec![dir],
        None => SYSTEM_FOLDERS.iter().map(PathBuf::from).collect(),
    }
}

/// Loads the data set from the folder [`named_folder`] names, which must hold it (an error
/// names the flag or variable and says what the path is instead); else from the first
/// complete one of the system's folders ([`candidates`]).
pub fn find_dataset(explicit: Option<&Path>) -> Result<Dataset, DataError> {
    find_in(explicit, std::env::var_os(DATA_ENV))
}

/// [`find_dataset`] with `$NANODDP_DATA`'s value given.
fn find_in(explicit: Option<&Path>, env: Option<OsString>) -> Result<Dataset, DataError> {
    if let Some((dir, given)) = named_in(explicit, env) {
        let Err(what) = check_named(&dir) else {
            return load(&dir);
        };
        let (name, unset) = match explicit {
            Some(_) => ("--data", String::new()),
            None => (
                DATA_ENV,
                format!(", or be unset to search {}", SYSTEM_FOLDERS.join(" and ")),
            ),
        };
        return Err(DataError::NamedFolder {
            given,
            problem: format!(
                "{what}; {name} must name a folder holding the four Fashion-MNIST IDX files \
                 (train-images-idx3-ubyte.gz and the other three; `apt-get install \
                 dataset-fashion-mnist` installs them){unset}"
            ),
        });
    }
    let dirs: Vec<PathBuf> = SYSTEM_FOLDERS.iter().map(PathBuf::from).collect();
    let dir = dirs
        .iter()
        .find(|d| complete(d))
        .ok_or_else(|| not_found(&dirs))?;
    load(dir)
}

/// What `dir`, named by the user, is instead of a data folder: not there, a file, a
/// symbolic-link loop, unreadable, or short of files.
fn check_named(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or folder".to_string(),
        _ => io_problem(&e),
    })?;
    if meta.is_file() {
        return Err("is a file, not a folder".into());
    }
    if !meta.is_dir() {
        return Err("is not a folder".into());
    }
    std::fs::read_dir(dir).map_err(|e| io_problem(&e))?;
    let missing: Vec<&str> = FILES
        .iter()
        .copied()
        .filter(|f| file(dir, f).is_none())
        .collect();
    match missing.len() {
        0 => Ok(()),
        n if n == FILES.len() => Err("a folder holding none of the four files".into()),
        _ => Err(format!(
            "a folder without {} (.gz or uncompressed)",
            missing.join(", ")
        )),
    }
}

/// An OS error as a clause: "too many levels of symbolic links", "permission denied".
fn io_problem(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) => &text[..at],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text.to_string(),
    }
}

/// Loads the four files from `dir`.
pub fn load(dir: &Path) -> Result<Dataset, DataError> {
    let path = |i: usize| file(dir, FILES[i]).ok_or_else(|| not_found(&[dir.to_path_buf()]));
    let train_images = read_images(&path(0)?)?;
    let train_labels = read_labels(&path(1)?, 10)?;
    let test_images = read_images(&path(2)?)?;
    let test_labels = read_labels(&path(3)?, 10)?;
    for (images, labels, which) in [
        (&train_images, &train_labels, 1),
        (&test_images, &test_labels, 3),
    ] {
        if images.count != labels.len() {
            return Err(DataError::Corrupt {
                path: path(which)?,
                problem: format!("{} labels for {} images", labels.len(), images.count),
            });
        }
    }
    Ok(Dataset {
        dir: dir.to_path_buf(),
        train_images,
        train_labels,
        test_images,
        test_labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("nanoddp-locate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temporary folder");
        dir
    }

    fn problem(result: Result<Dataset, DataError>) -> (String, String) {
        match result {
            Err(DataError::NamedFolder { given, problem }) => (given, problem),
            Err(other) => panic!("expected a named-folder error, got {other}"),
            Ok(d) => panic!("expected an error, loaded {}", d.dir.display()),
        }
    }

    #[test]
    fn a_named_folder_is_the_only_one_considered() {
        let env = Some(OsString::from("/nonexistent/nanoddp-data"));
        assert_eq!(
            named_in(None, env.clone()).map(|(_, g)| g),
            Some("NANODDP_DATA=/nonexistent/nanoddp-data".into())
        );
        // --data wins over the variable; an empty variable names nothing.
        let flag = Path::new("/x");
        assert_eq!(
            named_in(Some(flag), env),
            Some((PathBuf::from("/x"), "--data /x".into()))
        );
        assert_eq!(named_in(None, Some(OsString::new())), None);
        assert_eq!(named_in(None, None), None);
    }

    #[test]
    fn a_mistyped_variable_is_an_error_naming_it_not_a_fallback() {
        let (given, why) = problem(find_in(
            None,
            Some(OsString::from("/nonexistent/nanoddp-data")),
        ));
        assert_eq!(given, "NANODDP_DATA=/nonexistent/nanoddp-data");
        assert!(why.starts_with("no such file or folder"), "{why}");
        assert!(why.contains("NANODDP_DATA must name a folder"), "{why}");
        assert!(
            why.contains("unset to search /usr/share/datasets/fashion-mnist"),
            "{why}"
        );
        // The shipped subset, named by the variable, loads.
        let subset = shipped_subset();
        let data = find_in(None, Some(subset.clone().into_os_string())).expect("loads");
        assert_eq!(data.dir, subset);
    }

    #[test]
    fn a_file_or_a_link_loop_is_reported_as_what_it_is() {
        let dir = scratch("what-it-is");
        let file = dir.join("notes.txt");
        std::fs::write(&file, "not a data set").expect("write");
        let (given, why) = problem(find_in(Some(&file), None));
        assert_eq!(given, format!("--data {}", file.display()));
        assert!(why.starts_with("is a file, not a folder;"), "{why}");
        assert!(
            why.contains("--data must name a folder holding the four"),
            "{why}"
        );
        assert!(!why.contains("unset"), "{why}");

        let a = dir.join("loop-a");
        let b = dir.join("loop-b");
        std::os::unix::fs::symlink(&b, &a).expect("link");
        std::os::unix::fs::symlink(&a, &b).expect("link");
        let (_, why) = problem(find_in(None, Some(a.clone().into_os_string())));
        assert!(
            why.starts_with("too many levels of symbolic links"),
            "{why}"
        );
        assert!(!why.contains("not found"), "{why}");

        let empty = dir.join("empty");
        std::fs::create_dir(&empty).expect("folder");
        let (_, why) = problem(find_in(Some(&empty), None));
        assert!(
            why.starts_with("a folder holding none of the four files;"),
            "{why}"
        );
        std::fs::write(empty.join("train-images-idx3-ubyte.gz"), "").expect("write");
        let (_, why) = problem(find_in(Some(&empty), None));
        assert!(
            why.starts_with(
                "a folder without train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels"
            ),
            "{why}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
