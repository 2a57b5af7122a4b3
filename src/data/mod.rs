//! Data: IDX files (MNIST's format, gzip or raw), Fashion-MNIST discovery, and the batches
//! each device trains on.
//!
//! Images stay as bytes (one per pixel) and are converted to f32 in [0, 1] one batch at a
//! time, so the full training set costs 47 MB, not 188.

pub mod batches;
pub mod idx;
pub mod locate;

pub use batches::{Batches, Shard};
pub use idx::{read_images, read_labels, DataError, Images};
pub use locate::{find_dataset, Dataset};
