//! The IDX format: a 4-byte magic (0, 0, dtype, rank), `rank` big-endian u32 dimensions, then
//! the data. Read from `.gz` or raw files; everything is validated against the file's length
//! and reported with the file's name.

use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a data file could not be used.
#[derive(Debug, Error)]
pub enum DataError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not what it should be.
    #[error("{path}: {problem}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// No data set where we looked.
    #[error("Fashion-MNIST not found; looked in: {searched}. Install it with `apt-get install dataset-fashion-mnist`, or pass --data DIR (a folder holding train-images-idx3-ubyte.gz and the other three files)")]
    NotFound {
        /// Every folder tried.
        searched: String,
    },
    /// The folder named by `--data` or `NANODDP_DATA` (the only one then considered) is not
    /// a data folder: not there, a file, unreadable, or without the four files.
    #[error("{given}: {problem}")]
    NamedFolder {
        /// How it was named: `--data DIR` or `NANODDP_DATA=DIR`.
        given: String,
        /// What it is instead, and what it should be.
        problem: String,
    },
    /// A folder holds some of the four files but not all.
    #[error("{dir}: no {missing} (.gz or uncompressed); a data folder holds all four Fashion-MNIST files")]
    MissingFiles {
        /// The folder.
        dir: PathBuf,
        /// The files it lacks, by name.
        missing: String,
    },
}

/// Images of one data set: `count` images of `rows` x `cols` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// Number of images.
    pub count: usize,
    /// Rows per image.
    pub rows: usize,
    /// Columns per image.
    pub cols: usize,
    /// Pixels, image after image, row-major.
    pub pixels: Vec<u8>,
}

impl Images {
    /// Pixels per image.
    pub fn size(&self) -> usize {
        self.rows * self.cols
    }

    /// Image `i`'s pixels.
    pub fn image(&self, i: usize) -> &[u8] {
        &self.pixels[i * self.size()..(i + 1) * self.size()]
    }

    /// Keeps the first `n` images (all of them when there are no more).
    pub fn truncate(&mut self, n: usize) {
        self.count = self.count.min(n);
        self.pixels.truncate(self.count * self.size());
    }
}

fn corrupt(path: &Path, problem: impl Into<String>) -> DataError {
    DataError::Corrupt {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// The file's bytes, gunzipped if they start with gzip's magic.
fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| corrupt(path, format!("not a valid gzip stream: {e}")))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Parses the header: returns the dimensions and the data after them.
fn parse<'a>(
    path: &Path,
    bytes: &'a [u8],
    rank: usize,
) -> Result<(Vec<usize>, &'a [u8]), DataError> {
    if bytes.len() < 4 {
        return Err(corrupt(
            path,
            format!("{} bytes is too short for an IDX header", bytes.len()),
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(corrupt(
            path,
            format!(
                "bad IDX magic {:02x}{:02x}{:02x}{:02x}",
                bytes[0], bytes[1], bytes[2], bytes[3]
            ),
        ));
    }
    if bytes[2] != 0x08 {
        return Err(corrupt(
            path,
            format!(
                "element type 0x{:02x}: only unsigned bytes (0x08) are supported",
                bytes[2]
            ),
        ));
    }
    if bytes[3] as usize != rank {
        return Err(corrupt(
            path,
            format!("{} dimensions, expected {rank}", bytes[3]),
        ));
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(corrupt(path, "truncated header"));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|i| {
            u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize
        })
        .collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| corrupt(path, "dimensions overflow"))?;
    let data = &bytes[header..];
    if data.len() != expected {
        return Err(corrupt(
            path,
            format!(
                "dimensions {dims:?} need {expected} bytes of data, the file has {}",
                data.len()
            ),
        ));
    }
    Ok((dims, data))
}

/// Reads an IDX image file (3 dimensions: count, rows, cols).
pub fn read_images(path: &Path) -> Result<Images, DataError> {
    let bytes = read_bytes(path)?;
    let (dims, data) = parse(path, &bytes, 3)?;
    if dims[1] == 0 || dims[2] == 0 {
        return Err(corrupt(
            path,
            format!("empty images ({}x{})", dims[1], dims[2]),
        ));
    }
    Ok(Images {
        count: dims[0],
        rows: dims[1],
        cols: dims[2],
        pixels: data.to_vec(),
    })
}

/// Reads an IDX label file (1 dimension) whose labels must all be below `classes`.
pub fn read_labels(path: &Path, classes: u8) -> Result<Vec<u8>, DataError> {
    let bytes = read_bytes(path)?;
    let (_, data) = parse(path, &bytes, 1)?;
    if let Some((i, l)) = data.iter().enumerate().find(|(_, l)| **l >= classes) {
        return Err(corrupt(
            path,
            format!("label {l} at index {i} is not below {classes}"),
        ));
    }
    Ok(data.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(rank: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, 8, rank];
        for d in dims {
            v.extend(d.to_be_bytes());
        }
        v.extend(data);
        v
    }

    #[test]
    fn parses_and_rejects_with_the_reason() {
        let p = Path::new("x.idx");
        let good = idx(3, &[2, 2, 3], &[7; 12]);
        assert_eq!(parse(p, &good, 3).expect("valid").0, vec![2, 2, 3]);
        let cases = [
            (idx(3, &[2, 2, 3], &[7; 11]), "need 12 bytes"),
            (idx(1, &[5], &[0; 5]), "1 dimensions, expected 3"),
            (vec![0, 1, 8, 3], "bad IDX magic"),
            (vec![0, 0, 0x0d, 3, 0, 0, 0, 1], "only unsigned bytes"),
            (vec![0, 0], "too short"),
            (
                idx(3, &[0xffff_ffff, 0xffff_ffff, 0xffff_ffff], &[]),
                "overflow",
            ),
        ];
        for (bytes, want) in cases {
            let e = parse(p, &bytes, 3).expect_err(want).to_string();
            assert!(e.contains(want) && e.contains("x.idx"), "{e}");
        }
    }
}
