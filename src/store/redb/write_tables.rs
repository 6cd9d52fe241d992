//! The tables a write job may touch, opened once per group commit, and the sequence
//! numbers the group hands out.

use std::sync::Arc;

use redb::{Table, WriteTransaction};

use super::Error;
use super::policies::Policies;
use super::tables;

/// The tables a write job may touch, opened once per batch.
pub(super) struct WriteTables<'txn> {
    pub meta: Table<'txn, &'static str, u64>,
    pub identity: Table<'txn, &'static [u8; 32], u64>,
    pub extractions: Table<'txn, u64, &'static [u8]>,
    pub contents: Table<'txn, u64, &'static [u8]>,
    pub state_index: Table<'txn, (u8, u64), ()>,
    pub state_counts: Table<'txn, u8, u64>,
    pub tenant_counts: Table<'txn, (&'static str, &'static str, u8), u64>,
    pub pending_queue: Table<'txn, (&'static str, &'static str, u64), ()>,
    pub lease_index: Table<'txn, (u64, u64), ()>,
    pub tenant_index: Table<'txn, (&'static str, u64), ()>,
    pub findings: Table<'txn, (u64, &'static [u8; 32]), &'static [u8]>,
    pub results: Table<'txn, u64, &'static [u8]>,
    pub commit_index: Table<'txn, (&'static str, u64, u64), ()>,
    pub batches: Table<'txn, u64, &'static [u8]>,
    pub open_batches: Table<'txn, u64, ()>,
    pub staged: Table<'txn, u64, &'static [u8]>,
    pub ledger: Table<'txn, u64, &'static [u8]>,
    pub ledger_by_tenant: Table<'txn, (&'static str, u64, u64), ()>,
    pub ledger_by_extraction: Table<'txn, (u64, u64), ()>,
    pub spend: Table<'txn, (&'static str, u64), u64>,
    pub outbox: Table<'txn, u64, &'static [u8]>,
    pub outbox_due: Table<'txn, (u64, u64), ()>,
    pub outbox_dead: Table<'txn, u64, ()>,
    pub webhook_deliveries: Table<'txn, (&'static str, &'static str), u64>,
    pub retired: Table<'txn, u64, u8>,
    pub erased_spend: Table<'txn, (&'static str, u64), u64>,
    pub revisions: Table<'txn, (&'static str, &'static str, &'static str, u64), ()>,
    pub reservations: Table<'txn, (&'static str, u64), u64>,
    pub evaluations: Table<'txn, &'static str, &'static [u8]>,
    pub trials: Table<'txn, (&'static str, &'static str, u32), &'static [u8]>,
    pub trial_batches: Table<'txn, u64, &'static [u8]>,
    /// Outbox sinks, prices, shares and budgets, as configured when this batch began.
    pub policies: Arc<Policies>,
    /// Wall-clock time of this batch, the same for every job in it.
    pub now_ms: u64,
    pub(super) next: Sequences,
}

/// The next free sequence numbers, kept by the writer and rebuilt from the tables on open.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sequences {
    pub(super) extraction: u64,
    pub(super) batch: u64,
    pub(super) ledger: u64,
    pub(super) outbox: u64,
}

impl Sequences {
    pub(super) const ZERO: Sequences = Sequences { extraction: 0, batch: 0, ledger: 0, outbox: 0 };
}

impl<'txn> WriteTables<'txn> {
    pub(super) fn open(
        txn: &'txn WriteTransaction,
        now_ms: u64,
        next: Sequences,
        policies: Arc<Policies>,
    ) -> Result<Self, Error> {
        Ok(Self {
            meta: txn.open_table(tables::META)?,
            identity: txn.open_table(tables::IDENTITY)?,
            extractions: txn.open_table(tables::EXTRACTIONS)?,
            contents: txn.open_table(tables::CONTENTS)?,
            state_index: txn.open_table(tables::STATE_INDEX)?,
            state_counts: txn.open_table(tables::STATE_COUNTS)?,
            tenant_counts: txn.open_table(tables::TENANT_COUNTS)?,
            pending_queue: txn.open_table(tables::PENDING_QUEUE)?,
            lease_index: txn.open_table(tables::LEASE_INDEX)?,
            tenant_index: txn.open_table(tables::TENANT_INDEX)?,
            findings: txn.open_table(tables::FINDINGS)?,
            results: txn.open_table(tables::RESULTS)?,
            commit_index: txn.open_table(tables::COMMIT_INDEX)?,
            batches: txn.open_table(tables::BATCHES)?,
            open_batches: txn.open_table(tables::OPEN_BATCHES)?,
            staged: txn.open_table(tables::STAGED)?,
            ledger: txn.open_table(tables::LEDGER)?,
            ledger_by_tenant: txn.open_table(tables::LEDGER_BY_TENANT)?,
            ledger_by_extraction: txn.open_table(tables::LEDGER_BY_EXTRACTION)?,
            spend: txn.open_table(tables::SPEND)?,
            outbox: txn.open_table(tables::OUTBOX)?,
            outbox_due: txn.open_table(tables::OUTBOX_DUE)?,
            outbox_dead: txn.open_table(tables::OUTBOX_DEAD)?,
            webhook_deliveries: txn.open_table(tables::WEBHOOK_DELIVERIES)?,
            retired: txn.open_table(tables::RETIRED)?,
            erased_spend: txn.open_table(tables::ERASED_SPEND)?,
            revisions: txn.open_table(tables::REVISIONS)?,
            reservations: txn.open_table(tables::RESERVATIONS)?,
            evaluations: txn.open_table(tables::EVALUATIONS)?,
            trials: txn.open_table(tables::TRIALS)?,
            trial_batches: txn.open_table(tables::TRIAL_BATCHES)?,
            policies,
            now_ms,
            next,
        })
    }

    pub(super) fn allocate_seq(&mut self) -> u64 {
        let seq = self.next.extraction;
        self.next.extraction += 1;
        seq
    }

    pub(super) fn allocate_batch_seq(&mut self) -> u64 {
        let seq = self.next.batch;
        self.next.batch += 1;
        seq
    }

    pub(super) fn allocate_ledger_seq(&mut self) -> u64 {
        let seq = self.next.ledger;
        self.next.ledger += 1;
        seq
    }

    pub(super) fn allocate_outbox_seq(&mut self) -> u64 {
        let seq = self.next.outbox;
        self.next.outbox += 1;
        seq
    }
}
