//! A tally of what the sequences made the stores do, printed after a run (`--nocapture`),
//! so a generator that stopped reaching some path shows up as a zero.

use std::collections::BTreeMap;
use std::sync::Mutex;

use commitpoint::store::PostOutcome;

use super::view::{Answer, IntentView, LeaseView, MoveView, StateView};

static TALLY: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

fn count(what: &'static str) {
    if let Ok(mut tally) = TALLY.lock() {
        *tally.entry(what).or_default() += 1;
    }
}

pub fn note(answer: &Answer) {
    let what = match answer {
        Answer::Skipped => "skipped",
        Answer::Intake { created: true, .. } => "intake: created",
        Answer::Intake { .. } => "intake: duplicate",
        Answer::Delivery { first: None, .. } => "delivery: redelivery",
        Answer::Delivery { .. } => "delivery: first",
        Answer::Grants(g)
            if g.iter()
                .any(|(r, _)| matches!(&r.state, StateView::Claimed { token, .. } if token.claim_number > 1)) =>
        {
            "claim: a lease taken over"
        }
        Answer::Grants(g) if g.is_empty() => "claim: nothing",
        Answer::Grants(_) => "claim: granted",
        Answer::Post(p) if matches!(p.last(), Some(PostOutcome::Committed { .. })) => "post: committed",
        Answer::Post(p) if matches!(p.last(), Some(PostOutcome::Failed { .. })) => "post: failed",
        Answer::Post(p) if matches!(p.last(), Some(PostOutcome::Reasked { .. })) => "post: re-asked",
        Answer::Post(p) if matches!(p.last(), Some(PostOutcome::Replay { .. })) => "post: replay",
        Answer::Post(p) if matches!(p.last(), Some(PostOutcome::NotFound)) => "post: not found",
        Answer::Post(_) => "post: rejected",
        Answer::Intent(IntentView::Created(_)) => "intent: created",
        Answer::Intent(IntentView::Waiting { .. }) => "intent: waiting",
        Answer::Intent(IntentView::Nothing) => "intent: nothing",
        Answer::Batch(_) => "record job",
        Answer::Staged(r) => {
            for (n, what) in [
                (r.staged, "lines: staged"),
                (r.committed, "lines: committed while staging"),
                (r.failed_validation, "lines: failed validation while staging"),
                (r.requeued, "lines: requeued"),
                (r.budget_retries, "lines: retried with a larger budget"),
                (r.failed_truncated, "lines: failed truncated"),
                (r.model_refusals, "lines: model refusals"),
                (r.refused, "lines: provider refusals"),
                (r.exhausted, "lines: attempts exhausted"),
                (r.replays, "lines: replays"),
                (r.strangers, "lines: strangers"),
            ] {
                if n > 0 {
                    count(what);
                }
            }
            return;
        }
        Answer::Committed(c) if c.is_empty() => "commit ready: nothing",
        Answer::Committed(_) => "commit ready: some",
        Answer::Closed(r) if r.requeued + r.failed + r.exhausted == 0 => "close: no leftover",
        Answer::Closed(_) => "close: leftovers",
        Answer::Moved(MoveView::Moved(_)) => "retry/cancel: moved",
        Answer::Moved(MoveView::NotFound) => "retry/cancel: not found",
        Answer::Moved(MoveView::Rejected(_)) => "retry/cancel: rejected",
        Answer::Count(0) => "retry failed: none",
        Answer::Count(_) => "retry failed: some",
        Answer::Event(_) => "outbox: delivery recorded",
        Answer::Erased(r) if r.extractions > 0 => "erase: something",
        Answer::Erased(_) => "erase: nothing",
        Answer::Lease(LeaseView::Extended) => "lease: extended",
        Answer::Lease(LeaseView::NotFound) => "lease: not found",
        Answer::Lease(LeaseView::Rejected(_)) => "lease: refused",
    };
    count(what);
}

pub fn print() {
    if let Ok(tally) = TALLY.lock() {
        let lines: Vec<String> = tally.iter().map(|(what, n)| format!("  {what}: {n}")).collect();
        eprintln!("what the sequences did:\n{}", lines.join("\n"));
    }
}
