//! What both backends decide alike, as pure functions over the records a backend has
//! loaded: each returns what to write, and each backend only carries it out.

pub(crate) mod claim;
pub(crate) mod close;
#[cfg(test)]
mod close_tests;
pub(crate) mod depth;
pub(crate) mod erase;
pub(crate) mod evaluation;
pub(crate) mod evaluation_checks;
pub(crate) mod fair;
#[cfg(test)]
mod fair_tests;
#[cfg(test)]
mod fixtures;
pub(crate) mod intent;
pub(crate) mod lease;
pub(crate) mod ledger;
pub(crate) mod member;
pub(crate) mod operator;
pub(crate) mod outbox;
pub(crate) mod post;
pub(crate) mod reserve;
pub(crate) mod retention;
pub(crate) mod revision;
pub(crate) mod schedule;
#[cfg(test)]
mod schedule_tests;
pub(crate) mod staging;
#[cfg(test)]
mod staging_tests;
pub(crate) mod verify;
