//! gpushare-agent: turns a named sharing profile into GPU state.
//!
//! The layers follow DESIGN.md, each depending only on those above it:
//! [`catalog`] (GPU models and MIG tables) → [`profile`] (the profile format) →
//! [`plan`] (pure planning) → [`gpu`] (the hardware seam) → [`apply`] (executing plans) →
//! [`engine`] (the agent's operations, shared by every transport) → [`service`] (D-Bus).

pub mod access;
pub mod apply;
pub mod catalog;
pub mod config;
pub mod daemon;
pub mod engine;
pub mod gpu;
pub mod metrics;
pub mod node;
pub mod plan;
pub mod probe;
pub mod profile;
pub mod service;
pub mod sharing;
pub mod sys;
