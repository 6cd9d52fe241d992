//! The single writer thread and its group commit.
//!
//! Callers enqueue a closure and wait. The writer takes the first waiting job, drains
//! whatever else has queued up behind it, applies them all inside one write
//! transaction, commits once with `Durability::Immediate` (unless every job of the group
//! let its flush wait, see [`Flush`]), then answers every caller.
//! Throughput therefore scales with the number of concurrent callers instead of being
//! capped at the disk's fsync rate. A batch that wrote nothing is aborted, not
//! committed: an empty commit still costs an fsync.

use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;

use redb::{Database, Durability, ReadableTable};
use tokio::sync::{mpsc, oneshot, watch};

use super::Error;
use super::policies::Policies;
use super::tables::{LAYOUT_V1, META_LAYOUT};
pub(super) use super::write_tables::{Sequences, WriteTables};
use crate::domain::clock;
use crate::store::error_chain as chain;
use crate::store::seam::Flush;

/// How many jobs may share one transaction. Bounded so one commit's latency stays small.
const MAX_BATCH: usize = 1024;
/// Queue depth; callers wait (back-pressure) when the writer falls this far behind.
const QUEUE_DEPTH: usize = 8192;

/// A queued write: applied inside the batch transaction, answered after the commit.
trait Job: Send {
    /// Applies the job; `Ok(true)` if it wrote anything. A job may be applied more than
    /// once: when another job of its group fails, the group is rolled back and applied
    /// again without that one.
    fn apply(&mut self, tables: &mut WriteTables<'_>) -> Result<bool, Error>;
    /// Takes the job out of its group with its own error; it is answered with it.
    fn reject(&mut self, error: Error);
    fn is_rejected(&self) -> bool;
    /// Whether the caller needs its write on disk when answered; a group is flushed
    /// when any of its jobs does.
    fn needs_flush(&self) -> bool;
    fn finish(self: Box<Self>, commit: Result<(), &Arc<Error>>);
}

struct TypedJob<F, R> {
    /// Cloned for each application, so a group can be applied again.
    work: F,
    flush: Flush,
    result: Option<R>,
    rejected: Option<Error>,
    reply: oneshot::Sender<Result<R, Error>>,
}

impl<F, R> Job for TypedJob<F, R>
where
    F: FnOnce(&mut WriteTables<'_>) -> Result<(R, bool), Error> + Clone + Send,
    R: Send,
{
    fn apply(&mut self, tables: &mut WriteTables<'_>) -> Result<bool, Error> {
        let (result, wrote) = (self.work.clone())(tables)?;
        self.result = Some(result);
        Ok(wrote)
    }

    fn reject(&mut self, error: Error) {
        self.result = None;
        self.rejected = Some(error);
    }

    fn is_rejected(&self) -> bool {
        self.rejected.is_some()
    }

    fn needs_flush(&self) -> bool {
        self.flush == Flush::Now
    }

    fn finish(self: Box<Self>, commit: Result<(), &Arc<Error>>) {
        let answer = match (self.rejected, commit, self.result) {
            (Some(own), _, _) => Err(own),
            (None, Ok(()), Some(result)) => Ok(result),
            (None, Err(e), _) if matches!(**e, Error::Closing) => Err(Error::Closing),
            (None, Err(e), _) => Err(Error::Halted {
                reason: "the write batch it belonged to was not committed".to_string(),
                cause: Some(Arc::clone(e)),
            }),
            (None, Ok(()), None) => {
                Err(Error::Conflict { reason: "the group this write belonged to was aborted".to_string(), cause: None })
            }
        };
        // A caller that went away (client disconnected) no longer needs the answer.
        let _ = self.reply.send(answer);
    }
}

#[derive(Debug, Clone)]
pub(super) struct WriterHandle {
    jobs: mpsc::Sender<Message>,
    /// Counts the commits: every change to the file passes through this writer, so a
    /// watcher can sleep until something changed instead of polling.
    commits: watch::Receiver<u64>,
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
    /// `work` must be `Clone`: if another write of its group fails on its own, the group
    /// is rolled back and applied again without it.
    pub(super) async fn write<R, F>(&self, work: F) -> Result<R, Error>
    where
        R: Send + 'static,
        F: FnOnce(&mut WriteTables<'_>) -> Result<(R, bool), Error> + Clone + Send + 'static,
    {
        self.write_flushed(Flush::Now, work).await
    }

    /// Changes with every commit (not with an aborted, empty group).
    pub(super) fn commits(&self) -> watch::Receiver<u64> {
        self.commits.clone()
    }

    /// `write` whose commit may be left unflushed (see [`Flush::Later`]).
    pub(super) async fn write_flushed<R, F>(&self, flush: Flush, work: F) -> Result<R, Error>
    where
        R: Send + 'static,
        F: FnOnce(&mut WriteTables<'_>) -> Result<(R, bool), Error> + Clone + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(TypedJob { work, flush, result: None, rejected: None, reply });
        let stopped = || Error::Halted { reason: "the writer thread has stopped".to_string(), cause: None };
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
pub(super) fn initialize(db: &Database) -> Result<Sequences, Error> {
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
        super::state_counts::reconcile(&mut tables)?;
        super::commit_index::build_if_absent(&mut tables)?;
        super::pending_queue::build_if_absent(&mut tables)?;
        super::revisions::build_if_absent(&mut tables)?;
        super::tenant_counts::build_if_absent(&mut tables)?;
        let next = |last: Option<u64>| last.map_or(1, |seq| seq + 1);
        Sequences {
            extraction: next(tables.extractions.last()?.map(|(k, _)| k.value()))
                .max(next(tables.meta.get(super::tables::META_SEQ_FLOOR)?.map(|v| v.value()))),
            batch: next(tables.batches.last()?.map(|(k, _)| k.value())),
            ledger: next(tables.ledger.last()?.map(|(k, _)| k.value())),
            outbox: next(tables.outbox.last()?.map(|(k, _)| k.value())),
        }
    };
    txn.commit()?;
    Ok(next_seq)
}

/// The policies, set at start (and on reload) and read by every write batch.
pub(super) type PolicyCell = Arc<RwLock<Arc<Policies>>>;

pub(super) fn spawn(
    db: Arc<Database>,
    next_seq: Sequences,
    policies: PolicyCell,
) -> Result<(WriterHandle, WriterGuard), Error> {
    let (jobs, queue) = mpsc::channel(QUEUE_DEPTH);
    let (committed, commits) = watch::channel(0);
    let thread = std::thread::Builder::new()
        .name("store-writer".to_string())
        .spawn(move || run(&db, queue, next_seq, &policies, &committed))
        .map_err(|e| Error::task("start the writer thread", e))?;
    Ok((WriterHandle { jobs: jobs.clone(), commits }, WriterGuard { thread: Some(thread), close: jobs }))
}

fn run(
    db: &Database,
    mut queue: mpsc::Receiver<Message>,
    mut next_seq: Sequences,
    policies: &PolicyCell,
    committed: &watch::Sender<u64>,
) {
    let mut halted: Option<Arc<Error>> = None;
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
        if let Some(cause) = &halted {
            batch.drain(..).for_each(|job| job.finish(Err(cause)));
        } else if !batch.is_empty() {
            let policies = match policies.read() {
                Ok(current) => Arc::clone(&current),
                Err(poisoned) => Arc::clone(&poisoned.into_inner()),
            };
            match commit_batch(db, &mut batch, next_seq, policies) {
                Ok((advanced, wrote)) => {
                    next_seq = advanced;
                    if wrote {
                        committed.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    batch.drain(..).for_each(|job| job.finish(Ok(())));
                }
                Err(e) => {
                    let e = Arc::new(e);
                    tracing::error!(error = %chain(e.as_ref()), jobs = batch.len(), "write batch aborted");
                    if e.is_fatal() {
                        tracing::error!("the store writer refuses further writes until commitpoint restarts");
                        halted = Some(Arc::new(Error::Halted {
                            reason: "a storage error stopped the writer; restart commitpoint".to_string(),
                            cause: Some(Arc::clone(&e)),
                        }));
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
    let refusal = Arc::new(Error::Closing);
    while let Some(message) = queue.blocking_recv() {
        if let Message::Job(job) = message {
            job.finish(Err(&refusal));
        }
    }
}

/// Applies every job in one transaction. Returns the next free sequence numbers, and
/// whether anything was committed.
///
/// A job that fails on its own (a record it reads does not decode, a value does not
/// encode) is taken out with its error and the others are applied again in a fresh
/// transaction, so one bad record never costs unrelated writes their commit. A storage
/// failure ends the whole batch.
fn commit_batch(
    db: &Database,
    batch: &mut [Box<dyn Job>],
    next_seq: Sequences,
    policies: Arc<Policies>,
) -> Result<(Sequences, bool), Error> {
    loop {
        let mut txn = db.begin_write()?;
        // A durable commit also makes every unflushed one before it durable.
        let flush = batch.iter().any(|job| !job.is_rejected() && job.needs_flush());
        txn.set_durability(if flush { Durability::Immediate } else { Durability::None })?;
        let mut tables = WriteTables::open(&txn, clock::now_ms(), next_seq, Arc::clone(&policies))?;
        let mut wrote = false;
        let mut failed = None;
        for (index, job) in batch.iter_mut().enumerate() {
            if job.is_rejected() {
                continue;
            }
            match job.apply(&mut tables) {
                Ok(job_wrote) => wrote |= job_wrote,
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => {
                    failed = Some((index, e));
                    break;
                }
            }
        }
        let advanced = tables.next;
        drop(tables);
        let Some((index, error)) = failed else {
            return if wrote {
                txn.commit()?;
                Ok((advanced, true))
            } else {
                txn.abort()?;
                Ok((next_seq, false))
            };
        };
        // What the failed job may already have written goes with the rollback.
        txn.abort()?;
        tracing::warn!(error = %chain(&error), "a write failed on its own; its group is applied again without it");
        if let Some(job) = batch.get_mut(index) {
            job.reject(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use redb::ReadableDatabase;

    use super::*;
    use crate::store::Store;

    /// Jobs sent at once share group commits; the one that writes and then fails must
    /// neither land nor cost the others theirs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_that_fails_on_its_own_costs_the_others_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, guard) = Store::open(dir.path(), 1 << 20).unwrap();
        let mut calls = Vec::new();
        for i in 0..64u64 {
            let writer = store.writer.clone();
            calls.push(tokio::spawn(async move {
                writer
                    .write(move |t| {
                        t.meta.insert(format!("test-{i}").as_str(), i)?;
                        if i == 20 {
                            return Err(Error::Corrupt { kind: "test", reason: "made to fail".into() });
                        }
                        Ok(((), true))
                    })
                    .await
            }));
        }
        for (i, call) in calls.into_iter().enumerate() {
            let answer = call.await.unwrap();
            if i == 20 {
                assert!(matches!(answer, Err(Error::Corrupt { .. })), "the failing job gets its own error: {answer:?}");
            } else {
                assert!(answer.is_ok(), "job {i} was committed: {answer:?}");
            }
        }
        let read = store.db.begin_read().unwrap();
        let meta = read.open_table(crate::store::redb::tables::META).unwrap();
        for i in 0..64u64 {
            let stored = meta.get(format!("test-{i}").as_str()).unwrap().map(|v| v.value());
            assert_eq!(stored, (i != 20).then_some(i), "key test-{i}");
        }
        drop((meta, read, store));
        tokio::task::spawn_blocking(move || guard.join()).await.unwrap();
    }

    #[test]
    fn the_chain_keeps_every_cause() {
        let io = std::io::Error::other("disk on fire");
        let storage = Error::Storage(redb::Error::Io(io).into());
        let outer = Error::Halted { reason: "writer stopped".into(), cause: Some(Arc::new(storage)) };
        let text = chain(&outer);
        assert!(
            text.contains("writer stopped") && text.contains("storage failure") && text.contains("disk on fire"),
            "{text}"
        );
    }
}
