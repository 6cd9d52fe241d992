//! commitpoint: exactly-once LLM structured extraction at the commit point.
//!
//! # Layout
//!
//! - [`identity`]: blake3 identities of extractions, sources and findings.
//! - [`schema`]: the JSON Schema registry and finding identity fields.
//! - [`lifecycle`]: the persisted state enum and its one transition function.
//! - [`store`]: the redb file, its tables and codec, the group-commit writer, `verify`.
//! - [`service`]: input checks + identity + validation in front of the store.
//! - [`provider_registry`]: typed provider settings from [`config`] become adapters.
//! - [`http`]: the JSON API; [`server`] starts and stops it.
//! - [`cli`]: the `commitpoint` command (serve, submit, get, verify, demo).
//!
//! See docs/ARCHITECTURE.md for the data flow.

pub mod access;
pub mod cli;
pub mod clock;
pub mod config;
pub mod cursor;
pub mod failpoint;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod identity;
pub mod ledger;
pub mod lifecycle;
pub mod metric_names;
pub mod metrics;
pub mod outbox;
pub mod provider_registry;
pub mod providers;
pub mod retention;
pub mod routing;
pub mod scheduler;
pub mod schema;
pub mod server;
pub mod service;
pub mod simulator;
pub mod store;
pub mod supervisor;
pub mod systemd;
pub mod webhook;
