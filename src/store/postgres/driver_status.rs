//! How this process names its sessions, so `pg_stat_activity` shows which instance each
//! one belongs to, with the same `host:pid` the provider leases name their holders by.

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
