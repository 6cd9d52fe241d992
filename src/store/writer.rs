//! The single writer thread and its group commit.
//!
//! Callers enqueue a closure and wait. The writer takes the first waiting job, drains
//! whatever else has queued up behind it, applies them all inside one write
//! transaction, commits once with `Durability::Immediate`, then answers every caller.
//! Throughput therefore scales with the number of concurrent callers instead of being
//! capped at the disk's fsync rate. A batch that wrote nothing is aborted, not
//! committed: an empty commit still costs an fsync.

use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;

use redb::{Database, Durability, ReadableTable, Table, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use super::Error;
use super::ledger::Policies;
use super::tables::{self, LAYOUT_V1, META_LAYOUT};
use crate::clock;

/// How many jobs may share one transaction. Bounded so one commit's latency stays small.
const MAX_BATCH: usize = 1024;
/// Queue depth; callers wait (back-pressure) when the writer falls this far behind.
const QUEUE_DEPTH: usize = 8192;

/// The tables a write job may touch, opened once per batch.
pub struct WriteTables<'txn> {
    pub meta: Table<'txn, &'static str, u64>,
    pub identity: Table<'txn, &'static [u8; 32], u64>,
    pub extractions: Table<'txn, u64, &'static [u8]>,
    pub contents: Table<'txn, u64, &'static [u8]>,
    pub state_index: Table<'txn, (u8, u64), ()>,
    pub lease_index: Table<'txn, (u64, u64), ()>,
    pub tenant_index: Table<'txn, (&'static str, u64), ()>,
    pub findings: Table<'txn, (u64, &'static [u8; 32]), &'static [u8]>,
    pub results: Table<'txn, u64, &'static [u8]>,
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
    /// Outbox sinks and the price table, as configured when this batch began.
    pub policies: Arc<Policies>,
    /// Wall-clock time of this batch, the same for every job in it.
    pub now_ms: u64,
    next: Sequences,
}

/// The next free sequence numbers, kept by the writer and rebuilt from the tables on open.
#[derive(Debug, Clone, Copy)]
pub struct Sequences {
    extraction: u64,
    batch: u64,
    ledger: u64,
    outbox: u64,
}

impl Sequences {
    const ZERO: Sequences = Sequences { extraction: 0, batch: 0, ledger: 0, outbox: 0 };
}

impl<'txn> WriteTables<'txn> {
    fn open(txn: &'txn WriteTransaction, now_ms: u64, next: Sequences, policies: Arc<Policies>) -> Result<Self, Error> {
        Ok(Self {
            meta: txn.open_table(tables::META)?,
            identity: txn.open_table(tables::IDENTITY)?,
            extractions: txn.open_table(tables::EXTRACTIONS)?,
            contents: txn.open_table(tables::CONTENTS)?,
            state_index: txn.open_table(tables::STATE_INDEX)?,
            lease_index: txn.open_table(tables::LEASE_INDEX)?,
            tenant_index: txn.open_table(tables::TENANT_INDEX)?,
            findings: txn.open_table(tables::FINDINGS)?,
            results: txn.open_table(tables::RESULTS)?,
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
            policies,
            now_ms,
            next,
        })
    }

    pub fn allocate_seq(&mut self) -> u64 {
        let seq = self.next.extraction;
        self.next.extraction += 1;
        seq
    }

    pub fn allocate_batch_seq(&mut self) -> u64 {
        let seq = self.next.batch;
        self.next.batch += 1;
        seq
    }

    pub fn allocate_ledger_seq(&mut self) -> u64 {
        let seq = self.next.ledger;
        self.next.ledger += 1;
        seq
    }

    pub fn allocate_outbox_seq(&mut self) -> u64 {
        let seq = self.next.outbox;
        self.next.outbox += 1;
        seq
    }
}

/// A queued write: applied inside the batch transaction, answered after the commit.
trait Job: Send {
    /// Applies the job; `Ok(true)` if it wrote anything. An `Err` aborts the whole batch,
    /// so a job must finish its checks before its first write.
    fn apply(&mut self, tables: &mut WriteTables<'_>) -> Result<bool, Error>;
    fn finish(self: Box<Self>, commit: Result<(), &Error>);
}

struct TypedJob<F, R> {
    work: Option<F>,
    result: Option<R>,
    reply: oneshot::Sender<Result<R, Error>>,
}

impl<F, R> Job for TypedJob<F, R>
where
    F: FnOnce(&mut WriteTables<'_>) -> Result<(R, bool), Error> + Send,
    R: Send,
{
    fn apply(&mut self, tables: &mut WriteTables<'_>) -> Result<bool, Error> {
        let Some(work) = self.work.take() else {
            return Ok(false);
        };
        let (result, wrote) = work(tables)?;
        self.result = Some(result);
        Ok(wrote)
    }

    fn finish(self: Box<Self>, commit: Result<(), &Error>) {
        let answer = match (commit, self.result) {
            (Ok(()), Some(result)) => Ok(result),
            (Err(e), _) => Err(Error::Unavailable { reason: format!("{e:#}") }),
            (Ok(()), None) => {
                Err(Error::Unavailable { reason: "the batch this write belonged to was aborted; retry".to_string() })
            }
        };
        // A caller that went away (client disconnected) no longer needs the answer.
        let _ = self.reply.send(answer);
    }
}

#[derive(Debug, Clone)]
pub struct WriterHandle {
    jobs: mpsc::Sender<Message>,
}

/// What the writer's queue carries: work, or the order to finish and close.
enum Message {
    Job(Box<dyn Job>),
    Close,
}

impl std::fmt::Debug for dyn Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

impl WriterHandle {
    /// Runs `work` in the next group commit and returns its result once it is durable.
    pub async fn write<R, F>(&self, work: F) -> Result<R, Error>
    where
        R: Send + 'static,
        F: FnOnce(&mut WriteTables<'_>) -> Result<(R, bool), Error> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(TypedJob { work: Some(work), result: None, reply });
        let stopped = || Error::Unavailable { reason: "the writer thread has stopped".to_string() };
        self.jobs.send(Message::Job(job)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Owns the writer thread. `join` commits what is queued, refuses later writes and waits
/// for the thread, even while stray handles (a cut connection's task) still exist.
#[derive(Debug)]
pub struct WriterGuard {
    thread: Option<JoinHandle<()>>,
    close: mpsc::Sender<Message>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Message::Job(_) => "Job",
            Message::Close => "Close",
        })
    }
}

impl WriterGuard {
    /// Blocking: call it from a blocking context.
    pub fn join(mut self) {
        // The writer may already be gone (every handle dropped); that is fine.
        let _ = self.close.blocking_send(Message::Close);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the store writer thread panicked");
        }
    }
}

/// Creates the tables on first open and returns the next free sequence numbers.
pub fn initialize(db: &Database) -> Result<Sequences, Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let next_seq = {
        // Creating every table up front lets readers open them without special cases.
        let mut tables = WriteTables::open(&txn, 0, Sequences::ZERO, Arc::default())?;
        let meta = &mut tables.meta;
        let layout = meta.get(META_LAYOUT)?.map(|v| v.value());
        match layout {
            None => {
                meta.insert(META_LAYOUT, LAYOUT_V1)?;
            }
            Some(LAYOUT_V1) => {}
            Some(other) => {
                return Err(Error::Corrupt {
                    kind: "meta",
                    reason: format!("file layout {other} is newer than this build understands ({LAYOUT_V1})"),
                });
            }
        }
        let next = |last: Option<u64>| last.map_or(1, |seq| seq + 1);
        Sequences {
            extraction: next(tables.extractions.last()?.map(|(k, _)| k.value()))
                .max(next(meta.get(tables::META_SEQ_FLOOR)?.map(|v| v.value()))),
            batch: next(tables.batches.last()?.map(|(k, _)| k.value())),
            ledger: next(tables.ledger.last()?.map(|(k, _)| k.value())),
            outbox: next(tables.outbox.last()?.map(|(k, _)| k.value())),
        }
    };
    txn.commit()?;
    Ok(next_seq)
}

/// The policies, set at start (and on reload) and read by every write batch.
pub type PolicyCell = Arc<RwLock<Arc<Policies>>>;

pub fn spawn(
    db: Arc<Database>,
    next_seq: Sequences,
    policies: PolicyCell,
) -> Result<(WriterHandle, WriterGuard), Error> {
    let (jobs, queue) = mpsc::channel(QUEUE_DEPTH);
    let thread = std::thread::Builder::new()
        .name("store-writer".to_string())
        .spawn(move || run(&db, queue, next_seq, &policies))
        .map_err(|e| Error::Unavailable { reason: format!("cannot start the writer thread: {e}") })?;
    Ok((WriterHandle { jobs: jobs.clone() }, WriterGuard { thread: Some(thread), close: jobs }))
}

fn run(db: &Database, mut queue: mpsc::Receiver<Message>, mut next_seq: Sequences, policies: &PolicyCell) {
    let mut halted: Option<String> = None;
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    let mut closing = false;
    while let Some(first) = queue.blocking_recv() {
        match first {
            Message::Job(job) => batch.push(job),
            Message::Close => closing = true,
        }
        while !closing && batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(Message::Job(job)) => batch.push(job),
                Ok(Message::Close) => closing = true,
                Err(_) => break,
            }
        }
        if let Some(reason) = &halted {
            let refusal = Error::Unavailable { reason: reason.clone() };
            batch.drain(..).for_each(|job| job.finish(Err(&refusal)));
        } else if !batch.is_empty() {
            let policies = match policies.read() {
                Ok(current) => Arc::clone(&current),
                Err(poisoned) => Arc::clone(&poisoned.into_inner()),
            };
            match commit_batch(db, &mut batch, next_seq, policies) {
                Ok(advanced) => {
                    next_seq = advanced;
                    batch.drain(..).for_each(|job| job.finish(Ok(())));
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), jobs = batch.len(), "write batch aborted");
                    if e.is_fatal() {
                        halted = Some(format!("a storage error stopped the writer ({e}); restart commitpoint"));
                    }
                    batch.drain(..).for_each(|job| job.finish(Err(&e)));
                }
            }
        }
        if closing {
            refuse_the_rest(&mut queue);
            return;
        }
    }
}

/// After `Close`: nothing more is written; whoever still waits gets a clear answer.
fn refuse_the_rest(queue: &mut mpsc::Receiver<Message>) {
    queue.close();
    let refusal = Error::Unavailable { reason: "commitpoint is shutting down".to_string() };
    while let Some(message) = queue.blocking_recv() {
        if let Message::Job(job) = message {
            job.finish(Err(&refusal));
        }
    }
}

/// Applies every job in one transaction. Returns the next free sequence numbers.
fn commit_batch(
    db: &Database,
    batch: &mut [Box<dyn Job>],
    next_seq: Sequences,
    policies: Arc<Policies>,
) -> Result<Sequences, Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    let mut tables = WriteTables::open(&txn, clock::now_ms(), next_seq, policies)?;
    let mut wrote = false;
    for job in batch.iter_mut() {
        wrote |= job.apply(&mut tables)?;
    }
    let advanced = tables.next;
    drop(tables);
    if wrote {
        txn.commit()?;
        Ok(advanced)
    } else {
        txn.abort()?;
        Ok(next_seq)
    }
}
