//! Checkpoints in the safetensors format: the eight LeNet tensors under PyTorch's names and
//! layouts (so `torch.nn` loads them), the optimizer's momentum buffers under
//! `optimizer.velocity.<name>`, and the epoch and step in the metadata. Written to a temporary
//! file in the same folder, flushed, then renamed over the target: a crash leaves the old
//! checkpoint or the new one, never half of one.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use thiserror::Error;

use crate::model::PARAMS;

/// Why a checkpoint could not be written or read.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// File system trouble.
    #[error("{path}: {}", io_error_words(source))]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Not a LeNet checkpoint.
    #[error("{path}: {problem}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
}

/// An I/O error as a sentence's end, without the OS's error number: `no such file`,
/// `permission denied`, else the OS's own words.
pub fn io_error_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::NotFound => "no such file".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        _ => {
            let text = e.to_string();
            match text.find(" (os error") {
                Some(at) => text[..at].to_string(),
                None => text,
            }
        }
    }
}

/// Everything needed to continue a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Parameters, one vector per tensor of [`PARAMS`].
    pub weights: Vec<Vec<f32>>,
    /// Momentum buffers, same layout (absent in a weights-only file).
    pub velocity: Option<Vec<Vec<f32>>>,
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps taken.
    pub step: usize,
    /// Mixed precision's dynamic loss scale and its clean steps since the last change
    /// (absent for fp32 runs), so a resumed fp16 run scales exactly as the uninterrupted one.
    pub loss_scale: Option<(f32, usize)>,
    /// The settings that define the run ([`super::TrainConfig::run_settings`]), stored as
    /// `run.<name>` metadata; empty for a weights-only file.
    pub settings: Vec<(String, String)>,
}

/// Metadata key prefix of [`Checkpoint::settings`].
const SETTING: &str = "run.";

/// The `model` metadata [`save`] writes: how a file is known as one of nanoddp's checkpoints.
const MODEL: &str = "nanoddp LeNet";

/// The name of the first tensor of `tensors` (laid out as [`PARAMS`]) holding a value that is
/// not finite, if any.
pub fn first_not_finite(tensors: &[Vec<f32>]) -> Option<&'static str> {
    PARAMS
        .iter()
        .zip(tensors)
        .find(|(_, t)| t.iter().any(|v| !v.is_finite()))
        .map(|(p, _)| p.name)
}

/// Where a run stands: the epochs it completed and the steps it took. Displayed as `train`
/// labels its epochs: `epoch 2, step 470` at the end of an epoch, `epoch 3 (part), step 500`
/// inside one (where the run's steps per epoch are known).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Epochs completed.
    pub epochs: usize,
    /// Optimizer steps taken.
    pub step: usize,
    /// Steps in one of the run's epochs, where known (a weights-only file does not say).
    pub steps_per_epoch: Option<usize>,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inside = match self.steps_per_epoch {
            Some(per) => per > 0 && !self.step.is_multiple_of(per),
            None => self.step > 0 && self.epochs == 0,
        };
        if inside {
            write!(f, "epoch {} (part), step {}", self.epochs + 1, self.step)
        } else {
            write!(f, "epoch {}, step {}", self.epochs, self.step)
        }
    }
}

impl Checkpoint {
    /// Where the run that wrote this checkpoint stood.
    pub fn position(&self) -> Position {
        Position {
            epochs: self.epoch,
            step: self.step,
            steps_per_epoch: steps_per_epoch(|key| {
                self.settings
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
            }),
        }
    }
}

/// A run's steps per epoch from its recorded settings (`lookup` of a setting's name).
fn steps_per_epoch(lookup: impl Fn(&str) -> Option<String>) -> Option<usize> {
    let number = |key: &str| lookup(key)?.parse::<usize>().ok();
    let (batch, images) = (number("batch")?, number("training-images")?);
    (batch > 0).then(|| images.div_ceil(batch))
}

/// Where a checkpoint written by [`save`] stands. `None` if `path` cannot be read or holds
/// anything else (another program's safetensors included).
pub fn position(path: &Path) -> Option<Position> {
    let bytes = std::fs::read(path).ok()?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).ok()?;
    let meta = meta.metadata().as_ref()?;
    if meta.get("model").map(String::as_str) != Some(MODEL) {
        return None;
    }
    let number = |key: &str| meta.get(key)?.parse().ok();
    Some(Position {
        epochs: number("epoch")?,
        step: number("step")?,
        steps_per_epoch: steps_per_epoch(|key| meta.get(&format!("{SETTING}{key}")).cloned()),
    })
}

/// Checks that a checkpoint (or any output file) can be written to `path` without
/// destroying anything it must not: the folder exists and takes new files, and `path` is
/// absent or a regular file. A run calls this before its first step, so a typo costs
/// nothing; [`save`] checks again when it writes.
pub fn check_destination(path: &Path) -> Result<(), CheckpointError> {
    let shown = path.display().to_string();
    let invalid = |problem: String| CheckpointError::Invalid {
        path: shown.clone(),
        problem,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() => {
            return Err(invalid(format!(
                "is not a regular file (it is {}): refusing to replace it",
                describe_file_type(&meta.file_type())
            )))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CheckpointError::Io {
                path: shown,
                source,
            })
        }
    }
    let dir = folder_of(path);
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(invalid(format!("{} is not a folder", dir.display()))),
        Err(_) => {
            return Err(invalid(format!(
                "the folder {} does not exist",
                dir.display()
            )))
        }
    }
    // Can a file be created there? (Permissions, read-only file systems.)
    let (probe, file) = create_temp(path).map_err(|source| CheckpointError::Io {
        path: format!("{} (creating a file in {})", shown, dir.display()),
        source,
    })?;
    drop(file);
    let _ = std::fs::remove_file(probe);
    Ok(())
}

fn describe_file_type(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a folder"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_fifo() {
        "a pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The folder `path` lives in (`.` for a bare file name).
pub fn folder_of(path: &Path) -> std::path::PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    }
}

/// The name of `path`'s file, as temporary files beside it end.
fn target_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".into())
}

/// The process that made `file_name` if it is one of [`create_temp`]'s temporary files for a
/// target named `target` (`.tmp.<pid>.<n>.<target>`).
fn temp_owner(file_name: &str, target: &str) -> Option<u32> {
    let rest = file_name.strip_prefix(".tmp.")?.strip_suffix(target)?;
    let rest = rest.strip_suffix('.')?;
    let (pid, n) = rest.split_once('.')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether process `pid` is alive (or might be: one we may not signal still exists).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
    let sent = unsafe { libc::kill(pid, 0) } == 0;
    sent || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes the temporary files beside `path` that a save to the same name left when its
/// process was killed mid-write (Ctrl-C, a crash): their process is gone. Another live
/// process's files, and every other file, are left alone. Best effort: a folder that cannot
/// be listed keeps them.
fn remove_orphaned_temps(path: &Path) {
    let target = target_name(path);
    let Ok(entries) = std::fs::read_dir(folder_of(path)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_owner(&name.to_string_lossy(), &target) else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A new file beside `path`, named for this process and unique within it (never an existing
/// file: `create_new`), so concurrent runs and a crashed run's leftovers never collide.
fn create_temp(path: &Path) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // The name ends as the target's does: writers that pick a format by extension (the
    // plots) see the right one.
    let tmp = folder_of(path).join(format!(
        ".tmp.{}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        target_name(path)
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    Ok((tmp, file))
}

/// Writes `ckpt` to `path` atomically: a temporary file unique to this process in the same
/// folder, synced, renamed over `path`, and the folder synced. Refuses to replace anything
/// but a regular file; on any failure the previous file at `path` is intact and the
/// temporary file is removed.
pub fn save(path: &Path, ckpt: &Checkpoint) -> Result<(), CheckpointError> {
    let shown = path.display().to_string();
    let invalid = |problem: String| CheckpointError::Invalid {
        path: shown.clone(),
        problem,
    };
    let velocity_names: Vec<String> = PARAMS
        .iter()
        .map(|p| format!("optimizer.velocity.{}", p.name))
        .collect();
    let mut tensors: Vec<(&str, &[usize], &[f32])> = PARAMS
        .iter()
        .zip(&ckpt.weights)
        .map(|(p, w)| (p.name, p.shape, w.as_slice()))
        .collect();
    if let Some(v) = &ckpt.velocity {
        tensors.extend(
            PARAMS
                .iter()
                .zip(v)
                .zip(&velocity_names)
                .map(|((p, v), n)| (n.as_str(), p.shape, v.as_slice())),
        );
    }
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            let bytes: &[u8] = bytemuck::cast_slice(data);
            Ok((
                *name,
                TensorView::new(Dtype::F32, shape.to_vec(), bytes)
                    .map_err(|e| invalid(e.to_string()))?,
            ))
        })
        .collect::<Result<Vec<_>, CheckpointError>>()?;
    let mut metadata = HashMap::from([
        ("epoch".to_string(), ckpt.epoch.to_string()),
        ("step".to_string(), ckpt.step.to_string()),
        ("model".to_string(), MODEL.to_string()),
    ]);
    if let Some((scale, clean)) = ckpt.loss_scale {
        metadata.insert("loss_scale".to_string(), scale.to_string());
        metadata.insert("loss_scale_clean_steps".to_string(), clean.to_string());
    }
    for (name, value) in &ckpt.settings {
        metadata.insert(format!("{SETTING}{name}"), value.clone());
    }
    let data = safetensors::tensor::serialize(views, Some(metadata))
        .map_err(|e| invalid(e.to_string()))?;
    let data = canonical_header(data).map_err(invalid)?;
    replace_file(path, |_, f| f.write_all(&data))
}

/// Replaces `path` atomically with what `fill` writes: `fill` gets a new temporary file
/// beside `path` (its path and an open handle: write through either), which is then synced,
/// renamed over `path`, and the folder synced. Refuses to replace anything but a regular
/// file; on any failure the previous file at `path` is intact and the temporary file is
/// removed. Checkpoints, and the CLI's plots, schedule pictures and rewritten metrics, are
/// written this way.
pub fn replace_file(
    path: &Path,
    fill: impl FnOnce(&Path, &mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let shown = path.display().to_string();
    let io = |source| CheckpointError::Io {
        path: shown.clone(),
        source,
    };
    check_destination(path)?;
    remove_orphaned_temps(path);
    let (tmp, mut f) = create_temp(path).map_err(io)?;
    let written = fill(&tmp, &mut f)
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    // The rename is durable once the folder's entry is on disk too.
    std::fs::File::open(folder_of(path))
        .and_then(|dir| dir.sync_all())
        .map_err(io)
}

/// The same file with its JSON header's keys sorted. `safetensors` writes the metadata in
/// the order of a `HashMap` (random per process), which would make two identical runs'
/// checkpoints differ in their bytes; the tensor data and offsets are untouched.
fn canonical_header(file: Vec<u8>) -> Result<Vec<u8>, String> {
    let len_bytes: [u8; 8] = file
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or("serialized file shorter than its header length")?;
    let n = usize::try_from(u64::from_le_bytes(len_bytes)).map_err(|e| e.to_string())?;
    let header = file.get(8..8 + n).ok_or("header longer than the file")?;
    // serde_json's maps are ordered (BTreeMap): parsing and printing sorts every key.
    let value: serde_json::Value = serde_json::from_slice(header).map_err(|e| e.to_string())?;
    let mut text = serde_json::to_string(&value).map_err(|e| e.to_string())?;
    // Keep the data 8-byte aligned, as safetensors pads (with spaces).
    while (8 + text.len()) % 8 != 0 {
        text.push(' ');
    }
    let mut out = Vec::with_capacity(file.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&file[8 + n..]);
    Ok(out)
}

/// Reads a checkpoint written by [`save`] (or weights saved by PyTorch under the same names).
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let shown = path.display().to_string();
    let invalid = |problem: String| CheckpointError::Invalid {
        path: shown.clone(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: shown.clone(),
        source,
    })?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| invalid(format!("not a safetensors file: {e}")))?;
    let number = |key: &str| {
        meta.metadata()
            .as_ref()
            .and_then(|m| m.get(key))
            .and_then(|e| e.parse().ok())
            .unwrap_or(0)
    };
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>, CheckpointError> {
        let t = st
            .tensor(name)
            .map_err(|_| invalid(format!("no tensor `{name}`")))?;
        if t.dtype() != Dtype::F32 || t.shape() != shape {
            return Err(invalid(format!(
                "`{name}` is {:?} {:?}, expected F32 {shape:?}",
                t.dtype(),
                t.shape()
            )));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let weights = PARAMS
        .iter()
        .map(|p| read(p.name, p.shape))
        .collect::<Result<Vec<_>, _>>()?;
    // A diverged state is not a starting point: refuse it here, before any work.
    if let Some(name) = first_not_finite(&weights) {
        return Err(invalid(format!(
            "tensor `{name}` holds a value that is not finite (NaN or infinity): the weights \
             of a diverged run"
        )));
    }
    let has_velocity = st
        .names()
        .iter()
        .any(|n| n.starts_with("optimizer.velocity."));
    let velocity = if has_velocity {
        Some(
            PARAMS
                .iter()
                .map(|p| read(&format!("optimizer.velocity.{}", p.name), p.shape))
                .collect::<Result<Vec<_>, _>>()?,
        )
    } else {
        None
    };
    if let Some(name) = velocity.as_deref().and_then(first_not_finite) {
        return Err(invalid(format!(
            "tensor `optimizer.velocity.{name}` holds a value that is not finite (NaN or \
             infinity): the optimizer state of a diverged run"
        )));
    }
    let text = |key: &str| meta.metadata().as_ref().and_then(|m| m.get(key).cloned());
    let loss_scale = match (text("loss_scale"), text("loss_scale_clean_steps")) {
        (None, None) => None,
        (Some(s), Some(c)) => match (s.parse::<f32>(), c.parse::<usize>()) {
            (Ok(s), Ok(c)) if s.is_finite() && s >= 1.0 => Some((s, c)),
            _ => {
                return Err(invalid(format!(
                    "loss scale metadata `{s}` / `{c}` is not a scale >= 1 and a step count"
                )))
            }
        },
        _ => return Err(invalid("loss scale metadata is incomplete".into())),
    };
    let settings = meta
        .metadata()
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.strip_prefix(SETTING)?.to_string(), v.clone())))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect();
    Ok(Checkpoint {
        weights,
        velocity,
        epoch: number("epoch"),
        step: number("step"),
        loss_scale,
        settings,
    })
}
