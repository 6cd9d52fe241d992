//! What retention keeps and drops, the same on both backends: how long after its commit
//! each kind of data stays, and which `RETIRED_*` bits are due for a record. The redb store
//! (`retention.rs`) and the PostgreSQL store (`postgres/retention.rs`) apply this rule to
//! the candidates they find and again under their write lock, and keep the same marks.

use crate::domain::lifecycle::State;
use crate::store::records::ExtractionRecord;

/// Retention's marks on a committed extraction, one bit for each kind of data dropped.
pub const RETIRED_CONTENT: u8 = 1;
pub const RETIRED_RAW_RESULT: u8 = 2;

/// How long after its commit each kind of data is kept; `None` keeps it for ever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    pub content_after_ms: Option<u64>,
    pub raw_results_after_ms: Option<u64>,
}

impl RetentionPolicy {
    pub fn keeps_everything(&self) -> bool {
        self.content_after_ms.is_none() && self.raw_results_after_ms.is_none()
    }

    /// Every bit this policy ever drops: a record that has them all needs no look.
    pub(in crate::store) fn all_bits(&self) -> u8 {
        let content = if self.content_after_ms.is_some() { RETIRED_CONTENT } else { 0 };
        let results = if self.raw_results_after_ms.is_some() { RETIRED_RAW_RESULT } else { 0 };
        content | results
    }

    /// The `RETIRED_*` bits due for a record at `now_ms`, beyond those `already` dropped.
    pub(in crate::store) fn due(&self, record: &ExtractionRecord, already: u8, now_ms: u64) -> u8 {
        let State::Committed { at_ms } = record.state else { return 0 };
        let expired = |after: Option<u64>| after.is_some_and(|after| now_ms >= at_ms.saturating_add(after));
        let mut bits = 0;
        if expired(self.content_after_ms) {
            bits |= RETIRED_CONTENT;
        }
        if expired(self.raw_results_after_ms) {
            bits |= RETIRED_RAW_RESULT;
        }
        bits & !already
    }

    /// Whether a record that already lost `already` may have more to lose: one that lost
    /// every kind this policy drops is passed over without being read.
    pub(in crate::store) fn may_drop_more(&self, already: u8) -> bool {
        already & self.all_bits() != self.all_bits()
    }

    /// What to drop of a record (checked again under the write lock: it may have been
    /// retried or erased since it was found); `None` when nothing is due.
    pub(in crate::store) fn plan(&self, record: &ExtractionRecord, already: u8, now_ms: u64) -> Option<Retirement> {
        let bits = self.due(record, already, now_ms);
        (bits != 0).then_some(Retirement {
            content: bits & RETIRED_CONTENT != 0,
            raw_result: bits & RETIRED_RAW_RESULT != 0,
            marks: already | bits,
        })
    }
}

/// What retention drops of one record, and the marks it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) struct Retirement {
    pub content: bool,
    pub raw_result: bool,
    /// Every `RETIRED_*` bit of the record once this is dropped.
    pub marks: u8,
}

impl RetentionStep {
    /// Counts what one record's drop removed (a kind already gone removes nothing).
    pub(in crate::store) fn count(&mut self, content_dropped: bool, raw_result_dropped: bool) {
        self.contents_dropped += u64::from(content_dropped);
        self.raw_results_dropped += u64::from(raw_result_dropped);
    }
}

/// What one step of the sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionStep {
    pub contents_dropped: u64,
    pub raw_results_dropped: u64,
    /// Where the next step starts; `None` once the committed extractions are all seen.
    pub next_after: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rules::fixtures::record;

    #[test]
    fn only_committed_work_expires_and_each_kind_on_its_own_clock() {
        let policy = RetentionPolicy { content_after_ms: Some(1000), raw_results_after_ms: Some(5000) };
        let committed = record(State::Committed { at_ms: 10_000 });
        assert_eq!(policy.due(&committed, 0, 10_999), 0, "not yet");
        assert_eq!(policy.due(&committed, 0, 11_000), RETIRED_CONTENT);
        assert_eq!(policy.due(&committed, RETIRED_CONTENT, 14_999), 0, "already dropped");
        assert_eq!(policy.due(&committed, RETIRED_CONTENT, 15_000), RETIRED_RAW_RESULT);
        assert_eq!(policy.due(&record(State::Pending), 0, u64::MAX), 0, "uncommitted work keeps everything");
        assert_eq!(RetentionPolicy::default().due(&committed, 0, u64::MAX), 0, "the default keeps everything");
        assert!(RetentionPolicy::default().keeps_everything());
        let content_only = RetentionPolicy { content_after_ms: Some(0), raw_results_after_ms: None };
        assert_eq!(content_only.all_bits(), RETIRED_CONTENT);
        assert_eq!(content_only.due(&committed, 0, u64::MAX), RETIRED_CONTENT, "raw results kept for ever");
    }

    #[test]
    fn a_drop_names_each_due_kind_and_keeps_the_marks_already_there() {
        let policy = RetentionPolicy { content_after_ms: Some(1000), raw_results_after_ms: Some(5000) };
        let committed = record(State::Committed { at_ms: 10_000 });
        assert_eq!(policy.plan(&committed, 0, 10_999), None);
        let content = Retirement { content: true, raw_result: false, marks: RETIRED_CONTENT };
        assert_eq!(policy.plan(&committed, 0, 11_000), Some(content));
        let both = Retirement { content: false, raw_result: true, marks: RETIRED_CONTENT | RETIRED_RAW_RESULT };
        assert_eq!(policy.plan(&committed, RETIRED_CONTENT, 15_000), Some(both));
        assert!(policy.may_drop_more(RETIRED_CONTENT));
        assert!(!policy.may_drop_more(RETIRED_CONTENT | RETIRED_RAW_RESULT));
        let mut step = RetentionStep::default();
        step.count(true, false);
        step.count(true, true);
        assert_eq!((step.contents_dropped, step.raw_results_dropped), (2, 1));
    }
}
