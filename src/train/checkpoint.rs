//! Checkpoints in the safetensors format: the eight LeNet tensors under PyTorch's names and
//! layouts (so `torch.nn` loads them), plus the epoch in the metadata. Written to a temporary
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
    #[error("{path}: {source}")]
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

/// Writes `weights` (one vector per tensor of [`PARAMS`]) and `epoch` to `path` atomically.
pub fn save(path: &Path, weights: &[Vec<f32>], epoch: usize) -> Result<(), CheckpointError> {
    let shown = path.display().to_string();
    let invalid = |problem: String| CheckpointError::Invalid {
        path: shown.clone(),
        problem,
    };
    let bytes: Vec<Vec<u8>> = weights
        .iter()
        .map(|w| bytemuck::cast_slice::<f32, u8>(w).to_vec())
        .collect();
    let views = PARAMS
        .iter()
        .zip(&bytes)
        .map(|(p, b)| {
            Ok((
                p.name,
                TensorView::new(Dtype::F32, p.shape.to_vec(), b)
                    .map_err(|e| invalid(e.to_string()))?,
            ))
        })
        .collect::<Result<Vec<_>, CheckpointError>>()?;
    let metadata = HashMap::from([
        ("epoch".to_string(), epoch.to_string()),
        ("model".to_string(), "nanoddp LeNet".to_string()),
    ]);
    let data = safetensors::tensor::serialize(views, Some(metadata))
        .map_err(|e| invalid(e.to_string()))?;
    let io = |source| CheckpointError::Io {
        path: shown.clone(),
        source,
    };
    let tmp = path.with_extension("safetensors.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&data).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Reads a checkpoint written by [`save`] (or by PyTorch with the same names and shapes).
pub fn load(path: &Path) -> Result<(Vec<Vec<f32>>, usize), CheckpointError> {
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
    let epoch = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("epoch"))
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    let weights = PARAMS
        .iter()
        .map(|p| {
            let t = st
                .tensor(p.name)
                .map_err(|_| invalid(format!("no tensor `{}`", p.name)))?;
            if t.dtype() != Dtype::F32 || t.shape() != p.shape {
                return Err(invalid(format!(
                    "`{}` is {:?} {:?}, expected F32 {:?}",
                    p.name,
                    t.dtype(),
                    t.shape(),
                    p.shape
                )));
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        })
        .collect::<Result<Vec<Vec<f32>>, _>>()?;
    Ok((weights, epoch))
}
