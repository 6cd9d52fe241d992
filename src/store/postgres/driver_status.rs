//! Who holds each provider's driver lock, read from the server's lock table: the answer
//! is whatever PostgreSQL says now, so a killed instance stops being named the moment its
//! session ends, with nothing of ours to clean up.

/// Every session of this process names itself `commitpoint host:pid`.
pub(super) const APPLICATION_PREFIX: &str = "commitpoint ";

/// The session name for this process; PostgreSQL keeps at most 63 bytes of it.
pub(super) fn application_name() -> String {
    let mut name = format!("{APPLICATION_PREFIX}{}", crate::store::this_instance());
    while name.len() > 63 {
        name.pop();
    }
    name
}
