//! weir: the I/O wiring around `weir-core`.
pub mod config;
