//! Reads of extractions on PostgreSQL: each one statement (one snapshot) where redb uses
//! one read transaction.
