//! The steps every backend takes to create and to promote an evaluation, over the
//! primitive reads and writes it implements (`seam::Evaluations`), with the decisions of
//! `rules::evaluation` in between. Each backend's `create_evaluation` and `promote` are
//! these.

use std::sync::Arc;

use super::Error;
use super::rules::evaluation::{choose, promote_chunks};
use super::seam::{EvaluationCreated, Evaluations, NewEvaluation, Promotion};

/// Times a promotion chunk is tried when it keeps losing lock races.
const PROMOTE_ROUNDS: usize = 8;

/// The pool is read first, outside the write; the write then checks the name again (two
/// creations of one name cannot both win) and that no member was erased meanwhile.
pub(crate) async fn create<B: Evaluations + ?Sized>(
    backend: &B,
    new: NewEvaluation,
) -> Result<EvaluationCreated, Error> {
    let (found, missing) = backend.selection_pool(new.clone()).await?;
    match choose(&new, found, &missing) {
        Ok(members) => backend.freeze_evaluation(new, members).await,
        Err(reason) => Ok(EvaluationCreated::Refused(reason)),
    }
}

/// In chunks, each one write: a crash midway leaves whole chunks committed, and the next
/// run finds them committed and goes on. `None` for an unknown evaluation or candidate.
pub(crate) async fn promote<B: Evaluations + ?Sized>(
    backend: &B,
    evaluation: String,
    candidate: String,
) -> Result<Option<Promotion>, Error> {
    let Some(record) = backend.evaluation(evaluation).await? else { return Ok(None) };
    if !record.has_candidate(&candidate) {
        return Ok(None);
    }
    let record = Arc::new(record);
    let mut report = Promotion::default();
    for chunk in promote_chunks(&record) {
        // A chunk that lost a lock race (a deadlock PostgreSQL broke) wrote nothing and is
        // made again.
        let mut round = 1;
        let part = loop {
            match backend.promote_chunk(Arc::clone(&record), candidate.clone(), chunk.clone()).await {
                Err(e) if e.is_conflict() && round < PROMOTE_ROUNDS => round += 1,
                other => break other?,
            }
        };
        report.add(part);
    }
    Ok(Some(report))
}
