//! What the integration and torture test crates share: the real binary as a guarded child
//! process. Each crate includes this with `#[path = "support/mod.rs"] mod support;` and
//! builds its own `serve` command line on top.

// Each including crate uses its own part of this module.
#![allow(dead_code)]

pub mod postgres;
pub mod process;
