//! The C ABI: nvml.h's types and the exported functions.

pub mod types;
