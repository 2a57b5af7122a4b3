//! Finding Fashion-MNIST (or MNIST: same file names and format).

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

/// The folders searched, in order: `explicit` (from --data), `$NANODDP_DATA`, Debian's
/// `/usr/share/datasets/fashion-mnist`, `./data/fashion-mnist`.
pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = explicit {
        dirs.push(d.to_path_buf());
        return dirs; // an explicit folder is the only one considered
    }
    if let Some(d) = std::env::var_os("NANODDP_DATA") {
        dirs.push(d.into());
    }
    dirs.push("/usr/share/datasets/fashion-mnist".into());
    dirs.push("data/fashion-mnist".into());
    dirs
}

/// Loads the first complete data set among [`candidates`].
pub fn find_dataset(explicit: Option<&Path>) -> Result<Dataset, DataError> {
    let dirs = candidates(explicit);
    let dir = dirs
        .iter()
        .find(|d| complete(d))
        .ok_or_else(|| not_found(&dirs))?;
    load(dir)
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
