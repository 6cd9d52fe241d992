//! The closing summary: how much of each kind of trouble the run actually produced, so a
//! pass can be read as evidence (and a quiet run noticed).

use std::sync::atomic::Ordering;
use std::time::Duration;

use commitpoint::simulator::Stats;

use crate::checker::Seen;
use crate::context::{Params, say};
use crate::health::Sampler;
use crate::workload::World;

#[derive(Debug)]
pub struct Run<'a> {
    pub params: Params,
    pub took: Duration,
    pub drained_in: Duration,
    pub stats: &'a Stats,
    pub seen: &'a Seen,
}

pub fn print(run: &Run<'_>, world: &World, sampler: &Sampler) {
    let w = &world.worker;
    let ledger = world.ledger();
    say(&format!(
        "torture: seed {} rounds {} finished in {:?} (drain {:?})\n  \
         intake: {} sent identities, {} acks ({} duplicates), {} created, {} answers lost to kills, {} abandoned, {} never acknowledged\n  \
         store: {} extractions all committed, {} findings\n  \
         provider: {} batches, {} lines completed, {} lines failed, {} 429s, {} 5xx, {} dropped creates, {} members in more than one batch, max live batches per member {}\n  \
         server counters summed over processes (lower bounds): {:?}\n  \
         worker: {} claims, {} commits, {} replays, {} invalid, {} abandoned, late posts {} accepted ({} as replays) / {} refused, {} retries\n  \
         ledger: {} entries {:?}, {} micro-dollars charged; provider lines {} billed readable + {} torn (no entry); {} worker calls charged twice\n  \
         outbox: {} events ({} committed, {} failed attempts) in {} deliveries, {} refused by the receiver, {} acknowledged more than once\n  \
         webhooks: {} delivery ids, {} sends, {} answers ({} redeliveries), {} lost to kills, {} never answered",
        run.params.seed,
        run.params.rounds,
        run.took,
        run.drained_in,
        ledger.sent.len(),
        run.seen.acks,
        run.seen.duplicate_acks,
        run.seen.created_answers,
        ledger.lost,
        ledger.abandoned,
        run.seen.unacked_sent,
        run.seen.extractions,
        run.seen.findings,
        run.stats.batches_created,
        run.stats.lines_completed,
        run.stats.lines_failed,
        run.stats.rate_limited,
        run.stats.server_errors,
        run.stats.dropped_connections,
        run.seen.resubmitted_members,
        run.stats.max_live_batches_per_custom_id,
        sampler.totals(),
        w.claims.load(Ordering::Relaxed),
        w.commits.load(Ordering::Relaxed),
        w.replays.load(Ordering::Relaxed),
        w.invalid.load(Ordering::Relaxed),
        w.abandoned.load(Ordering::Relaxed),
        w.late_accepted.load(Ordering::Relaxed),
        w.late_replayed.load(Ordering::Relaxed),
        w.late_refused.load(Ordering::Relaxed),
        w.retries.load(Ordering::Relaxed),
        run.seen.costs.entries,
        run.seen.costs.by_kind,
        run.seen.costs.charged_micros,
        run.seen.costs.billed_lines,
        run.seen.costs.torn_lines,
        run.seen.costs.double_charged_calls.len(),
        run.seen.events.events,
        run.seen.events.committed,
        run.seen.events.failed,
        run.seen.events.deliveries,
        run.seen.events.refused,
        run.seen.events.acknowledged_again,
        run.seen.hooks.deliveries,
        run.seen.hooks.sends,
        run.seen.hooks.answers,
        run.seen.hooks.redeliveries,
        run.seen.hooks.lost,
        run.seen.hooks.never_answered,
    ));
    for call in &run.seen.costs.double_charged_calls {
        say(&format!("  charged twice: {call}"));
    }
}
