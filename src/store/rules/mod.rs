//! What both backends decide alike, as pure functions over the records a backend has
//! loaded: each returns what to write, and each backend only carries it out.

pub(crate) mod erase;
pub(crate) mod intent;
pub(crate) mod member;
pub(crate) mod outbox;
pub(crate) mod retention;
pub(crate) mod verify;
