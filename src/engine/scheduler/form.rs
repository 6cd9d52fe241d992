//! Forming batches: pending work becomes submit intents, sized by the provider's limits,
//! its batch wait and, where it has one, its minimum job size.

use super::{Scheduler, foreign_work_look};
use crate::domain::clock;
use crate::store::{self, IntentOutcome, IntentRequest};

/// Per schema: what the last look for a batch found, so the next look waits for enough new
/// work or for the wait to end.
#[derive(Debug, Clone, Copy)]
pub(super) struct WaitingWork {
    due_at_ms: u64,
    members: usize,
    arrivals_seen: u64,
    looked_at_ms: u64,
}

impl Scheduler {
    /// Turns waiting work into submit intents and submits them right away.
    pub(super) async fn form_batches(&mut self) -> Result<Option<u64>, store::Error> {
        // Wake when a timed pause or hold ends (an operator's pause has no end: resuming wakes).
        if let Some(until) = self.health.paused_until(clock::now_ms(), true) {
            return Ok((until != u64::MAX).then_some(until));
        }
        let router = &self.router;
        router.refresh_holds(self.store.as_ref(), clock::now_ms()).await?;
        let accept = router.filter_for(self.provider.name());
        let mut next = None;
        let schemas: Vec<String> = self.registry.names().map(str::to_string).collect();
        for schema in schemas {
            if let Some(due) = self.still_waiting(&schema) {
                next = Some(next.map_or(due, |n: u64| n.min(due)));
                continue;
            }
            let estimate = self.member_estimate(&schema);
            loop {
                // Checked again for every intent: an operator may pause while this runs.
                if self.health.paused_until(clock::now_ms(), true).is_some() {
                    return Ok(next);
                }
                let arrivals_seen = self.signals.arrivals();
                let request = IntentRequest {
                    provider: self.provider.name().to_string(),
                    schema: schema.clone(),
                    accept: accept.clone(),
                    max_size: self.settings.batch_max_size,
                    max_content_bytes: self.settings.batch_max_content_bytes,
                    max_wait_ms: self.settings.batch_max_wait.as_millis() as u64,
                    minimum: self.minimum(),
                    estimate: estimate.clone(),
                };
                match self.store.create_intent(request).await? {
                    IntentOutcome::Created(batch) => {
                        self.waiting.remove(&schema);
                        self.health.update(|h| h.waiting_for_minimum = None);
                        if batch.provider != self.provider.name() {
                            self.handed_over(&batch);
                            continue;
                        }
                        tracing::info!(batch_key = %batch.batch_key, members = batch.members.len(), %schema, "batch formed");
                        super::traces::formed(&batch);
                        self.health.update(|h| h.batches_formed += 1);
                        self.formed_here.insert(batch.seq);
                        // A pause that came while the intent was formed holds it unsent:
                        // open intents are not driven while submissions are paused.
                        if self.health.paused_until(clock::now_ms(), true).is_some() {
                            break;
                        }
                        if let Some(at) = self.submit(*batch).await? {
                            next = Some(next.map_or(at, |n: u64| n.min(at)));
                        }
                    }
                    IntentOutcome::Waiting { due_at_ms, members } => {
                        self.note_waiting_for_minimum(&schema, members, due_at_ms);
                        let looked_at_ms = clock::now_ms();
                        self.waiting
                            .insert(schema.clone(), WaitingWork { due_at_ms, members, arrivals_seen, looked_at_ms });
                        next = Some(next.map_or(due_at_ms, |n: u64| n.min(due_at_ms)));
                        break;
                    }
                    IntentOutcome::Nothing => {
                        self.waiting.remove(&schema);
                        self.health.update(|h| h.waiting_for_minimum = None);
                        break;
                    }
                }
            }
        }
        Ok(next)
    }

    /// What a member of `schema` is reserved at when its batch is formed here.
    fn member_estimate(&self, schema: &str) -> Option<crate::store::MemberEstimate> {
        let profile = self.settings.profile.as_ref()?;
        let instructions = self.registry.get(schema).ok()?.instructions().len() as u64;
        crate::engine::ledger::estimate::member_estimate(profile, move |_| instructions, &self.router.prices())
    }

    /// When the last look found too little work for `schema` and not enough has arrived
    /// since to fill a batch, the time it falls due; `None` when it is worth looking now.
    fn still_waiting(&self, schema: &str) -> Option<u64> {
        let waiting = self.waiting.get(schema)?;
        let now = clock::now_ms();
        let arrived = self.signals.arrivals().saturating_sub(waiting.arrivals_seen);
        // Under the provider's minimum, reaching it is enough to look again.
        let enough = if waiting.members < self.settings.min_batch_size {
            self.settings.min_batch_size
        } else {
            self.settings.batch_max_size
        };
        let could_fill = waiting.members as u64 + arrived >= enough as u64;
        // Other instances' arrivals are not counted here: look again now and then.
        let others_may_have_added =
            self.store.commits().is_none() && now >= waiting.looked_at_ms + foreign_work_look(&self.settings);
        (now < waiting.due_at_ms && !could_fill && !others_may_have_added).then_some(waiting.due_at_ms)
    }

    /// The provider's minimum job as intents are formed to it, if it has one.
    fn minimum(&self) -> Option<store::Minimum> {
        (self.settings.min_batch_size > 1).then_some(store::Minimum {
            size: self.settings.min_batch_size,
            wait_ms: self.settings.min_batch_wait.as_millis() as u64,
            fallback: self.settings.min_batch_fallback.clone(),
        })
    }

    /// An intent under the minimum was bound to the fallback provider
    /// (`rules::intent::bound_to`): its scheduler submits it, so it is only woken here.
    fn handed_over(&self, batch: &store::BatchRecord) {
        tracing::info!(
            batch_key = %batch.batch_key, members = batch.members.len(), schema = %batch.schema, fallback = %batch.provider,
            "work under the provider's minimum job size handed to its fallback (min_batch_fallback)"
        );
        crate::domain::failpoint::hit("after-hand-over-before-fallback-submit");
        self.health.update(|h| h.batches_handed_over += 1);
        self.signals.wake_all();
    }

    /// Says in the provider's health when work waits only because it is under the
    /// provider's minimum job size, and what happens to it, and when, if no more arrives.
    fn note_waiting_for_minimum(&self, schema: &str, members: usize, due_at_ms: u64) {
        let note = (members < self.settings.min_batch_size).then(|| {
            let then = match &self.settings.min_batch_fallback {
                Some(fallback) => format!("sent to {fallback} at {}", clock::format_ms(due_at_ms)),
                None => format!("failed at {}", clock::format_ms(due_at_ms)),
            };
            format!(
                "{members} extractions of {schema} wait for a job of at least {} (the provider's minimum); \
                 sent once enough arrive, {then} unless they do (min_batch_wait)",
                self.settings.min_batch_size,
            )
        });
        self.health.update(|h| h.waiting_for_minimum = note);
    }
}
