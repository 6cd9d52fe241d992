//! The vocabulary every layer shares. Nothing here does I/O except reading the clock
//! and a secret's file, and creating a private file (`private_file`).

pub mod backoff;
pub mod batch;
pub mod budget;
pub mod clock;
pub mod cursor;
pub mod failpoint;
pub mod health;
pub mod identity;
pub mod lifecycle;
pub mod metric_names;
pub mod names;
pub mod private_file;
pub mod redact;
pub mod schema;
pub mod secret;
pub mod trace;
