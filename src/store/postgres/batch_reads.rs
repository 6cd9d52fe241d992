//! The scheduler's reads of provider batches on PostgreSQL: open batches, their members
//! with content, recorded job ids, and staged answers awaiting commit. Plain reads, no
//! locks: each answer is one statement's snapshot, as each is one read transaction on redb.

/// How many `Ready` rows one read of `ready_items` looks at before filtering by provider.
pub(super) const READY_PAGE: i64 = 256;
