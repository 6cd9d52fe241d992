//! commitpoint: exactly-once LLM structured extraction at the commit point.
//!
//! # Layers
//!
//! The module tree is the architecture. Each layer may use the layers above it in this
//! list and never one below it (`.ci/check-layers.py` refuses an arrow that runs back up):
//!
//! 1. [`domain`]: the vocabulary every layer shares: identities, the lifecycle, schemas,
//!    batch members and line results, usage, provider health, the clock, secrets.
//! 2. [`store`]: the redb file, its tables and codec, the group-commit writer, `verify`.
//! 3. [`providers`]: the `BatchProvider` trait and one adapter per provider API;
//!    [`simulator`]: the fake provider APIs the demo and tests drive.
//! 4. [`engine`]: the background work: scheduler, outbox delivery, routing, ledger,
//!    webhook signatures, task supervision.
//! 5. [`service`]: input checks, identity and validation in front of the store.
//! 6. [`http`]: the JSON API, its access rules and the metrics exposition.
//! 7. [`app`]: configuration, the provider registry, starting and stopping `serve`.
//! 8. [`cli`]: the `commitpoint` command.
//!
//! See docs/ARCHITECTURE.md for the data flow.

#![warn(unreachable_pub)]

pub(crate) mod app;
pub mod cli;
pub mod domain;
pub mod engine;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod http;
pub mod providers;
pub mod service;
pub mod simulator;
pub mod store;
