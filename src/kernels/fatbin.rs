//! Reads the table of contents of an nvcc fatbin: which SASS and PTX images it carries.
//!
//! Layout (little-endian, as written by nvcc's `fatbinary`): a 16-byte header
//! (`magic 0xBA55ED50`, `u16 version`, `u16 header size`, `u64 payload size`), then
//! entries, each a header (`u16 kind` 1 = PTX, 2 = ELF/SASS; `u32 header size` at +4;
//! `u64 payload size` at +8; `u32 arch` at +28, e.g. 80 for sm_80) followed by its payload.
//! Payloads may be compressed; only the headers are read here.

use thiserror::Error;

const MAGIC: u32 = 0xBA55_ED50;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// Machine code (a cubin) for one real architecture.
    Sass,
    /// PTX for one virtual architecture, JIT-compiled by the driver.
    Ptx,
}

/// One image inside a fatbin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatbinImage {
    /// SASS or PTX.
    pub kind: ImageKind,
    /// Architecture number: 80 means sm_80 (SASS) or compute_80 (PTX).
    pub arch: u32,
    /// Payload bytes as stored (possibly compressed).
    pub size: u64,
}

impl std::fmt::Display for FatbinImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ImageKind::Sass => write!(f, "sm_{} SASS", self.arch),
            ImageKind::Ptx => write!(f, "compute_{} PTX", self.arch),
        }
    }
}

/// Bytes that are not an nvcc fatbin.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FatbinError {
    /// Wrong magic number.
    #[error("not a fatbin (magic {0:#010x}, expected 0xba55ed50)")]
    BadMagic(u32),
    /// A header or payload runs past the end.
    #[error("fatbin truncated at byte {0}")]
    Truncated(usize),
    /// An entry kind other than PTX or ELF.
    #[error("fatbin entry at byte {offset} has unknown kind {kind}")]
    UnknownKind {
        /// Entry offset.
        offset: usize,
        /// The kind field.
        kind: u16,
    },
    /// A PTX entry that is not text (compressed: nvcc without `--no-compress`).
    #[error("the compute_{0} PTX in the fatbin is not text (compressed?)")]
    PtxNotText(u32),
}

fn read<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], FatbinError> {
    bytes
        .get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or(FatbinError::Truncated(at))
}

/// Lists the images in a fatbin, in file order.
pub fn images(bytes: &[u8]) -> Result<Vec<FatbinImage>, FatbinError> {
    Ok(entries(bytes)?
        .into_iter()
        .map(|(image, _)| image)
        .collect())
}

/// The PTX texts a fatbin carries, as (virtual architecture, text), in file order: readable
/// where nvcc ran with `--no-compress`, as the build does.
pub fn ptx_texts(bytes: &[u8]) -> Result<Vec<(u32, &str)>, FatbinError> {
    entries(bytes)?
        .into_iter()
        .filter(|(image, _)| image.kind == ImageKind::Ptx)
        .map(|(image, payload)| {
            let text = std::str::from_utf8(&bytes[payload])
                .map_err(|_| FatbinError::PtxNotText(image.arch))?;
            Ok((image.arch, text.trim_end_matches('\0')))
        })
        .collect()
}

/// Every entry with the byte range of its payload.
fn entries(bytes: &[u8]) -> Result<Vec<(FatbinImage, std::ops::Range<usize>)>, FatbinError> {
    let magic = u32::from_le_bytes(read(bytes, 0)?);
    if magic != MAGIC {
        return Err(FatbinError::BadMagic(magic));
    }
    let header = usize::from(u16::from_le_bytes(read(bytes, 6)?));
    let payload = u64::from_le_bytes(read(bytes, 8)?);
    let end = usize::try_from(payload)
        .ok()
        .and_then(|p| p.checked_add(header))
        .filter(|&e| e <= bytes.len())
        .ok_or(FatbinError::Truncated(bytes.len()))?;
    let mut images = Vec::new();
    let mut at = header;
    while at < end {
        let kind = match u16::from_le_bytes(read(bytes, at)?) {
            1 => ImageKind::Ptx,
            2 => ImageKind::Sass,
            kind => return Err(FatbinError::UnknownKind { offset: at, kind }),
        };
        let entry_header = u32::from_le_bytes(read(bytes, at + 4)?) as usize;
        let size = u64::from_le_bytes(read(bytes, at + 8)?);
        let arch = u32::from_le_bytes(read(bytes, at + 28)?);
        let next = usize::try_from(size)
            .ok()
            .and_then(|s| at.checked_add(entry_header)?.checked_add(s))
            .filter(|&next| next <= end)
            .ok_or(FatbinError::Truncated(at))?;
        images.push((FatbinImage { kind, arch, size }, at + entry_header..next));
        at = next;
    }
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: u16, arch: u32, payload: &[u8]) -> Vec<u8> {
        let mut e = vec![0u8; 32];
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[4..8].copy_from_slice(&32u32.to_le_bytes());
        e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        e[28..32].copy_from_slice(&arch.to_le_bytes());
        e.extend_from_slice(payload);
        e
    }

    fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        f.extend_from_slice(&(body.len() as u64).to_le_bytes());
        f.extend_from_slice(&body);
        f
    }

    #[test]
    fn lists_entries_and_rejects_damage() {
        let f = fatbin(&[entry(2, 80, &[7; 5]), entry(1, 75, &[9; 3])]);
        let got = images(&f).expect("valid");
        assert_eq!(
            got,
            vec![
                FatbinImage {
                    kind: ImageKind::Sass,
                    arch: 80,
                    size: 5
                },
                FatbinImage {
                    kind: ImageKind::Ptx,
                    arch: 75,
                    size: 3
                }
            ]
        );
        assert!(matches!(
            images(&f[..f.len() - 1]),
            Err(FatbinError::Truncated(_))
        ));
        let mut bad = f.clone();
        bad[0] ^= 1;
        assert!(matches!(images(&bad), Err(FatbinError::BadMagic(_))));
        let mut odd = f;
        odd[16] = 9;
        assert_eq!(
            images(&odd),
            Err(FatbinError::UnknownKind {
                offset: 16,
                kind: 9
            })
        );
    }

    #[test]
    fn reads_the_ptx_texts() {
        let sass = entry(2, 90, &[7; 5]);
        let ptx = entry(1, 90, b".version 9.0\0\0");
        let good = fatbin(&[sass.clone(), ptx.clone()]);
        assert_eq!(ptx_texts(&good), Ok(vec![(90, ".version 9.0")]));
        let packed = fatbin(&[sass, ptx, entry(1, 75, &[0xff, 0xfe])]);
        assert_eq!(ptx_texts(&packed), Err(FatbinError::PtxNotText(75)));
    }
}
