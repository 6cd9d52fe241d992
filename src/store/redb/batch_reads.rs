//! The scheduler's reads of provider batches in the redb store: open batches, their
//! members with content, recorded job ids, and staged answers awaiting commit. Each is one
//! read transaction's snapshot.
