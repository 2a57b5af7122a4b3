//! Collectives: allreduce and friends, hand-rolled.
//!
//! * [`schedule`]: the algorithms (ring, double binary tree, direct two-shot, one-shot) as
//!   pure data: per rank, steps that read peers' memory and write their own.
//! * [`tree`]: the double binary tree.
//! * [`verify`]: proves a schedule race-free under every interleaving its waits allow and
//!   computes what it leaves in every rank's output.
pub mod schedule;
pub mod tree;
pub mod verify;
