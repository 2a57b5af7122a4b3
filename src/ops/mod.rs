//! Safe device operations built on the typed kernel launchers: each checks buffer lengths,
//! picks the launch shape, and launches. They work on every [`Device`](crate::backend::Device)
//! backend.

pub mod elementwise;
