//! Intake on PostgreSQL, alone or in groups that share one commit.
//!
//! An intake is a lookup (the existing record of its identity, or a fresh sequence number:
//! the record is encoded with its number, so the number comes first) and an insert that
//! commits on its own (autocommit: one statement, one transaction). Intakes that arrive
//! while the committers are busy are taken together, as the redb writer drains its queue:
//! one lookup and one set-based insert for the whole group, so one WAL flush acknowledges
//! all of them, and each is answered only after that insert's commit returned. Outcomes are
//! per request: when the group's statement fails, its members are taken again one by one,
//! so one bad request never fails the others.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::types::ToSql;

use super::rows::{big, decode_record, insert_new, unbig};
use super::{Error, pg};
use crate::domain::clock;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::StateName;
use crate::store::codec::encode;
use crate::store::records::{ExtractionRecord, StoredContent};
use crate::store::{IntakeOutcome, NewExtraction};

/// The existing record of an identity, or else a fresh sequence number for it.
const LOOKUP: &str = "SELECT e.record, CASE WHEN e.record IS NULL THEN nextval('extraction_seq') END \
     FROM (SELECT (SELECT record FROM extractions WHERE id = $1) AS record) e";

/// [`LOOKUP`] for a group of distinct identities.
const LOOKUP_MANY: &str = "SELECT u.id, e.record, CASE WHEN e.record IS NULL THEN nextval('extraction_seq') END \
     FROM unnest($1::bytea[]) AS u(id) LEFT JOIN extractions e ON e.id = u.id";

pub(super) const EXISTING: &str = "SELECT record FROM extractions WHERE id = $1";

const EXISTING_MANY: &str = "SELECT id, record FROM extractions WHERE id = ANY($1)";

/// The group's new rows in identity order: two groups that share identities wait for each
/// other's rows in the same order, so they cannot deadlock.
const INSERT_MANY: &str = "INSERT INTO extractions (id, seq, tenant, schema_name, state_code, updated_at_ms, format, \
     record, content, fence, source_id, schema_family) \
     SELECT n.id, n.seq, n.tenant, n.schema_name, $11, n.updated_at_ms, n.format, n.record, n.content, NULL, \
     n.source_id, n.schema_family \
     FROM unnest($1::bytea[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::smallint[], $7::bytea[], \
     $8::bytea[], $9::text[], $10::text[]) \
     AS n(id, seq, tenant, schema_name, updated_at_ms, format, record, content, source_id, schema_family) \
     ORDER BY n.id ON CONFLICT (id) DO NOTHING RETURNING id";

/// Committers working at once: each takes whatever has queued up while it was busy.
const COMMITTERS: usize = 8;

/// The most intakes one group takes.
const MOST: usize = 512;

/// What [`LOOKUP`] found: the existing record, or the number a new one gets.
pub(super) enum Lookup {
    Known(Box<ExtractionRecord>),
    Fresh(u64),
}

pub(super) async fn look_up(client: &impl GenericClient, id: &ExtractionId) -> Result<Lookup, Error> {
    let statement = client.prepare_cached(LOOKUP).await.map_err(pg("cannot look an identity up"))?;
    let row =
        client.query_one(&statement, &[&id.as_bytes().as_slice()]).await.map_err(pg("cannot look an identity up"))?;
    match (row.get::<_, Option<&[u8]>>(0), row.get::<_, Option<i64>>(1)) {
        (Some(bytes), _) => Ok(Lookup::Known(Box::new(decode_record(bytes)?))),
        (None, Some(seq)) => Ok(Lookup::Fresh(unbig(seq))),
        (None, None) => Err(no_number()),
    }
}

fn no_number() -> Error {
    Error::Corrupt { kind: "sequence", reason: "no sequence number for a new intake".into() }
}

fn erased(id: &ExtractionId) -> Error {
    // Erased between the conflict and the read: asking again makes it anew.
    Error::Conflict { reason: format!("{id} was erased while it was taken in"), cause: None }
}

/// The new pending record numbered `seq` and its encoded content; `new` keeps its content.
fn pending(new: &mut NewExtraction, seq: u64, now_ms: u64) -> Result<(ExtractionRecord, Vec<u8>), Error> {
    let stored = StoredContent { text: std::mem::take(&mut new.content) };
    let content = encode(&stored);
    let shell = new.clone();
    new.content = stored.text;
    let content = content?;
    Ok((shell.pending(seq, new.content.len() as u64, now_ms), content))
}

/// Inserts a new extraction numbered `seq` unless its identity exists; the existing row is
/// the answer otherwise (the conflicting insert waited for its writer's commit, so the
/// next statement sees it). In autocommit, the insert is its own transaction.
pub(super) async fn insert_or_existing(
    client: &impl GenericClient,
    mut new: NewExtraction,
    seq: u64,
    now_ms: u64,
) -> Result<IntakeOutcome, Error> {
    let (record, content) = pending(&mut new, seq, now_ms)?;
    if insert_new(client, &record, &content).await?.is_some() {
        return Ok(IntakeOutcome { created: true, record });
    }
    let statement = client.prepare_cached(EXISTING).await.map_err(pg("cannot read the existing extraction"))?;
    match client.query_opt(&statement, &[&record.id.as_bytes().as_slice()]).await {
        Ok(Some(row)) => Ok(IntakeOutcome { created: false, record: decode_record(row.get(0))? }),
        Ok(None) => Err(erased(&record.id)),
        Err(e) => Err(pg("cannot read the existing extraction")(e)),
    }
}

/// One intake on its own: a redelivery costs one round trip and writes nothing, a new
/// one two (the lookup that numbers it, the insert that commits it).
async fn alone(client: &impl GenericClient, new: NewExtraction, now_ms: u64) -> Result<IntakeOutcome, Error> {
    match look_up(client, &new.id).await? {
        Lookup::Known(record) => Ok(IntakeOutcome { created: false, record: *record }),
        Lookup::Fresh(seq) => insert_or_existing(client, new, seq, now_ms).await,
    }
}

struct Job {
    new: NewExtraction,
    answer: oneshot::Sender<Result<IntakeOutcome, Error>>,
}

/// The queue of intakes waiting for a committer.
#[derive(Debug, Clone)]
pub(super) struct Group {
    jobs: mpsc::UnboundedSender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("id", &self.new.id).finish_non_exhaustive()
    }
}

impl Group {
    /// Starts the committers on `pool`; they end when the last handle is dropped.
    pub(super) fn start(pool: Pool) -> Group {
        let (jobs, queue) = mpsc::unbounded_channel();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..COMMITTERS {
            tokio::spawn(committer(pool.clone(), Arc::clone(&queue)));
        }
        Group { jobs }
    }

    /// Answered once the commit that holds this intake has returned.
    pub(super) async fn intake(&self, new: NewExtraction) -> Result<IntakeOutcome, Error> {
        let (answer, answered) = oneshot::channel();
        self.jobs.send(Job { new, answer }).map_err(|_| Error::Closing)?;
        answered.await.map_err(|_| Error::Closing)?
    }
}

async fn committer(pool: Pool, queue: Arc<Mutex<mpsc::UnboundedReceiver<Job>>>) {
    loop {
        let group = {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else { return };
            let mut group = vec![first];
            while group.len() < MOST {
                match queue.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            group
        };
        commit(&pool, group).await;
    }
}

/// Answers every job of `group`.
async fn commit(pool: &Pool, group: Vec<Job>) {
    let client = match pool.get().await {
        Ok(client) => client,
        Err(e) => {
            let reason = e.to_string();
            for job in group {
                let failure = Error::Postgres { context: "no database connection", source: reason.clone().into() };
                let _ = job.answer.send(Err(failure));
            }
            return;
        }
    };
    let now_ms = clock::now_ms();
    let (mut news, answers): (Vec<NewExtraction>, Vec<_>) = group.into_iter().map(|job| (job.new, job.answer)).unzip();
    if news.len() > 1 {
        match together(&client, &mut news, now_ms).await {
            Ok(outcomes) => {
                for (answer, outcome) in answers.into_iter().zip(outcomes) {
                    let _ = answer.send(outcome);
                }
                return;
            }
            Err(e) => {
                let members = news.len();
                tracing::debug!(error = %crate::store::error_chain(&e), members, "an intake group failed; taking its members one by one");
            }
        }
    }
    for (new, answer) in news.into_iter().zip(answers) {
        let _ = answer.send(alone(&client, new, now_ms).await);
    }
}

/// One lookup and one insert for the whole group; an `Err` means the group's statements
/// failed and nothing was written. Each member's own failure (a value that does not
/// encode) is its answer alone.
async fn together(
    client: &impl GenericClient,
    news: &mut [NewExtraction],
    now_ms: u64,
) -> Result<Vec<Result<IntakeOutcome, Error>>, Error> {
    // A repeated identity within the group is looked up and inserted once.
    let mut first: HashMap<ExtractionId, usize> = HashMap::with_capacity(news.len());
    for (i, new) in news.iter().enumerate() {
        first.entry(new.id).or_insert(i);
    }
    let firsts = |i: usize, id: &ExtractionId| first.get(id) == Some(&i);
    let ids: Vec<[u8; 32]> = news.iter().enumerate().filter(|(i, n)| firsts(*i, &n.id)).map(|(_, n)| n.id.0).collect();
    let ids: Vec<&[u8]> = ids.iter().map(|id| id.as_slice()).collect();
    let statement = client.prepare_cached(LOOKUP_MANY).await.map_err(pg("cannot look identities up"))?;
    let rows = client.query(&statement, &[&ids]).await.map_err(pg("cannot look identities up"))?;
    let mut found: HashMap<ExtractionId, Result<Lookup, Error>> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let Ok(id) = <[u8; 32]>::try_from(row.get::<_, &[u8]>(0)) else { continue };
        let lookup = match (row.get::<_, Option<&[u8]>>(1), row.get::<_, Option<i64>>(2)) {
            (Some(bytes), _) => decode_record(bytes).map(|r| Lookup::Known(Box::new(r))),
            (None, Some(seq)) => Ok(Lookup::Fresh(unbig(seq))),
            (None, None) => Err(no_number()),
        };
        found.insert(ExtractionId(id), lookup);
    }
    let mut outcomes: Vec<Option<Result<IntakeOutcome, Error>>> = Vec::with_capacity(news.len());
    let mut fresh: Vec<(usize, ExtractionRecord, Vec<u8>)> = Vec::new();
    for (i, new) in news.iter_mut().enumerate() {
        if !firsts(i, &new.id) {
            outcomes.push(None);
            continue;
        }
        outcomes.push(match found.remove(&new.id) {
            None => Some(Err(no_number())),
            Some(Err(e)) => Some(Err(e)),
            Some(Ok(Lookup::Known(record))) => Some(Ok(IntakeOutcome { created: false, record: *record })),
            Some(Ok(Lookup::Fresh(seq))) => match pending(new, seq, now_ms) {
                Ok((record, content)) => {
                    fresh.push((i, record, content));
                    None
                }
                Err(e) => Some(Err(e)),
            },
        });
    }
    let inserted = insert_many(client, &fresh).await?;
    let lost: Vec<&[u8]> =
        fresh.iter().filter(|(_, r, _)| !inserted.contains(&r.id)).map(|(_, r, _)| &r.id.0[..]).collect();
    // From here on the group's rows are committed: a failure is the answer of the members
    // it concerns, never a reason to take the group again.
    let mut existing = if lost.is_empty() { Ok(HashMap::new()) } else { read_existing(client, &lost).await };
    for (i, record, _) in fresh {
        outcomes[i] = Some(if inserted.contains(&record.id) {
            Ok(IntakeOutcome { created: true, record })
        } else {
            match &mut existing {
                Ok(found) => match found.remove(&record.id) {
                    Some(read) => read.map(|record| IntakeOutcome { created: false, record }),
                    None => Err(erased(&record.id)),
                },
                Err(reason) => Err(Error::Postgres {
                    context: "cannot read the existing extraction",
                    source: reason.clone().into(),
                }),
            }
        });
    }
    // A repeat within the group is answered as a redelivery of its first occurrence,
    // which comes before it.
    let mut answers: Vec<Result<IntakeOutcome, Error>> = Vec::with_capacity(news.len());
    for (i, new) in news.iter().enumerate() {
        let at = first.get(&new.id).copied().unwrap_or(i);
        let answer = if at == i {
            outcomes[i].take().unwrap_or_else(|| Err(no_number()))
        } else {
            match answers.get(at) {
                Some(Ok(outcome)) => Ok(IntakeOutcome { created: false, record: outcome.record.clone() }),
                _ => Err(Error::Conflict { reason: format!("{} was taken in twice at once", new.id), cause: None }),
            }
        };
        answers.push(answer);
    }
    Ok(answers)
}

/// The records of identities another writer inserted first (its commit is visible now);
/// `Err` holds why they could not be read.
async fn read_existing(
    client: &impl GenericClient,
    ids: &[&[u8]],
) -> Result<HashMap<ExtractionId, Result<ExtractionRecord, Error>>, String> {
    let read = async {
        let statement = client.prepare_cached(EXISTING_MANY).await?;
        client.query(&statement, &[&ids]).await
    };
    let rows = read.await.map_err(|e| e.to_string())?;
    let mut found = HashMap::with_capacity(rows.len());
    for row in &rows {
        if let Ok(id) = <[u8; 32]>::try_from(row.get::<_, &[u8]>(0)) {
            found.insert(ExtractionId(id), decode_record(row.get(1)));
        }
    }
    Ok(found)
}

/// Inserts the group's new rows in one statement (one transaction); returns the
/// identities it inserted.
async fn insert_many(
    client: &impl GenericClient,
    fresh: &[(usize, ExtractionRecord, Vec<u8>)],
) -> Result<HashSet<ExtractionId>, Error> {
    if fresh.is_empty() {
        return Ok(HashSet::new());
    }
    let n = fresh.len();
    let (mut ids, mut seqs, mut tenants, mut schemas, mut updated) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut formats, mut records, mut contents, mut sources, mut families) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (_, record, content) in fresh {
        let bytes = encode(record)?;
        ids.push(&record.id.0[..]);
        seqs.push(big(record.seq));
        tenants.push(record.tenant.as_str());
        schemas.push(record.schema.as_str());
        updated.push(big(record.updated_at_ms));
        formats.push(i16::from(bytes[0]));
        records.push(bytes);
        contents.push(content.as_slice());
        sources.push(record.source_id.as_str());
        families.push(crate::store::rules::revision::schema_family(&record.schema));
    }
    let state = i16::from(StateName::Pending.code());
    let params: [&(dyn ToSql + Sync); 11] =
        [&ids, &seqs, &tenants, &schemas, &updated, &formats, &records, &contents, &sources, &families, &state];
    let statement = client.prepare_cached(INSERT_MANY).await.map_err(pg("cannot insert extractions"))?;
    let rows = client.query(&statement, &params).await.map_err(pg("cannot insert extractions"))?;
    let mut inserted = HashSet::with_capacity(rows.len());
    for row in &rows {
        if let Ok(id) = <[u8; 32]>::try_from(row.get::<_, &[u8]>(0)) {
            inserted.insert(ExtractionId(id));
        }
    }
    Ok(inserted)
}
