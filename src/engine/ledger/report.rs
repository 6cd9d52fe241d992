//! Cost reports: a tenant's entries over a time range, split into fresh work, replays,
//! validation failures and unusable answers, optionally grouped by day, model or provider.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use crate::store::{ChargeKind, CostSource, LedgerRecord, store_day_ms};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    Day,
    Model,
    Provider,
}

#[derive(Debug, Clone)]
pub struct CostQuery {
    pub tenant: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub group_by: Option<GroupBy>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Bucket {
    pub attempts: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: u64,
    /// Paid attempts no price row priced and no provider reported a cost for: booked at
    /// $0, so `cost_micros` is short of the bill by their real cost.
    pub unpriced_attempts: u64,
}

impl Bucket {
    fn add(&mut self, entry: &LedgerRecord) {
        self.attempts += 1;
        if entry.kind != ChargeKind::Replay && entry.cost_source == CostSource::Unpriced {
            self.unpriced_attempts += 1;
        }
        self.input_tokens = self.input_tokens.saturating_add(entry.usage.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(entry.usage.output_tokens);
        self.cost_micros = self.cost_micros.saturating_add(entry.cost_micros);
    }
}

/// The ways an entry counts. Everything but `replay` costs money.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Split {
    pub fresh: Bucket,
    pub replay: Bucket,
    pub failed_validation: Bucket,
    /// Paid answers that were truncated or refused, never committed.
    pub unusable: Bucket,
    /// Trials of evaluations (docs/EVALUATIONS.md): paid, committed only if promoted.
    pub evaluation: Bucket,
}

impl Split {
    fn add(&mut self, entry: &LedgerRecord) {
        match entry.kind {
            ChargeKind::Fresh => self.fresh.add(entry),
            ChargeKind::Replay => self.replay.add(entry),
            ChargeKind::FailedValidation => self.failed_validation.add(entry),
            ChargeKind::Unusable => self.unusable.add(entry),
            ChargeKind::Evaluation => self.evaluation.add(entry),
        }
    }

    /// Paid attempts of every kind that were booked at $0 for want of a price.
    pub fn unpriced_attempts(&self) -> u64 {
        self.fresh.unpriced_attempts
            + self.failed_validation.unpriced_attempts
            + self.unusable.unpriced_attempts
            + self.evaluation.unpriced_attempts
    }

    pub fn charged_micros(&self) -> u64 {
        self.fresh
            .cost_micros
            .saturating_add(self.failed_validation.cost_micros)
            .saturating_add(self.unusable.cost_micros)
            .saturating_add(self.evaluation.cost_micros)
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CostReport {
    pub tenant: String,
    pub from_ms: u64,
    pub to_ms: u64,
    #[serde(flatten)]
    pub totals: Split,
    /// Fresh, failed-validation, unusable and evaluation cost: what the tenant is charged.
    pub charged_micros: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<BTreeMap<String, Split>>,
    #[serde(skip)]
    group_by: Option<GroupBy>,
    /// Charges on the range's UTC days whose ledger entries a tenant erasure removed: not in
    /// `charged_micros`, still billed.
    pub erased_micros: u64,
}

impl CostReport {
    pub fn new(query: &CostQuery) -> Self {
        Self {
            tenant: query.tenant.clone(),
            from_ms: query.from_ms,
            to_ms: query.to_ms,
            groups: query.group_by.map(|_| BTreeMap::new()),
            group_by: query.group_by,
            ..Self::default()
        }
    }

    pub fn add(&mut self, entry: &LedgerRecord) {
        self.totals.add(entry);
        self.charged_micros = self.totals.charged_micros();
        if let (Some(groups), Some(by)) = (&mut self.groups, self.group_by) {
            let key = match by {
                GroupBy::Day => day_label(entry.at_ms),
                GroupBy::Model => entry.usage.model.clone(),
                GroupBy::Provider => entry.provider.clone(),
            };
            groups.entry(key).or_default().add(entry);
        }
    }
}

/// `YYYY-MM-DD` of the UTC day holding `at_ms`.
pub(super) fn day_label(at_ms: u64) -> String {
    let day_start = at_ms - at_ms % store_day_ms();
    let text = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(day_start)).to_string();
    text.chars().take(10).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::batch::Usage;
    use crate::domain::identity::ExtractionId;

    fn entry(kind: ChargeKind, at_ms: u64, model: &str, cost: u64) -> LedgerRecord {
        LedgerRecord {
            seq: 1,
            tenant: "acme".into(),
            extraction_id: ExtractionId([1; 32]),
            extraction_seq: 1,
            attempt: 1,
            kind,
            provider: "openai".into(),
            job_id: None,
            usage: Usage { model: model.into(), input_tokens: 10, output_tokens: 5, ..Usage::default() },
            latency_ms: None,
            cost_micros: cost,
            list_cost_micros: cost,
            cost_source: CostSource::PriceTable,
            at_ms,
        }
    }

    #[test]
    fn unpriced_paid_attempts_are_counted_and_unpriced_replays_are_not() {
        let query = CostQuery { tenant: "acme".into(), from_ms: 0, to_ms: u64::MAX, group_by: Some(GroupBy::Model) };
        let mut report = CostReport::new(&query);
        let unpriced = |kind| LedgerRecord { cost_source: CostSource::Unpriced, ..entry(kind, 5, "new-model", 0) };
        report.add(&unpriced(ChargeKind::Fresh));
        report.add(&unpriced(ChargeKind::Unusable));
        report.add(&unpriced(ChargeKind::Replay));
        report.add(&entry(ChargeKind::Fresh, 5, "priced", 100));
        assert_eq!(report.totals.fresh.unpriced_attempts, 1);
        assert_eq!(report.totals.unusable.unpriced_attempts, 1);
        assert_eq!(report.totals.replay.unpriced_attempts, 0, "a replay costs nothing, priced or not");
        assert_eq!(report.totals.unpriced_attempts(), 2);
        let groups = report.groups.as_ref().unwrap();
        assert_eq!((groups["new-model"].unpriced_attempts(), groups["priced"].unpriced_attempts()), (2, 0));
    }

    #[test]
    fn splits_and_groups_add_up() {
        let query = CostQuery { tenant: "acme".into(), from_ms: 0, to_ms: u64::MAX, group_by: Some(GroupBy::Day) };
        let mut report = CostReport::new(&query);
        let day = store_day_ms();
        report.add(&entry(ChargeKind::Fresh, 5, "a", 100));
        report.add(&entry(ChargeKind::Replay, 6, "a", 0));
        report.add(&entry(ChargeKind::FailedValidation, day + 1, "b", 40));
        assert_eq!(
            report.totals.fresh,
            Bucket { attempts: 1, input_tokens: 10, output_tokens: 5, cost_micros: 100, unpriced_attempts: 0 }
        );
        assert_eq!(report.totals.replay.attempts, 1);
        assert_eq!(report.totals.replay.cost_micros, 0);
        assert_eq!(report.charged_micros, 140);
        let groups = report.groups.as_ref().unwrap();
        assert_eq!(groups.keys().cloned().collect::<Vec<_>>(), vec!["1970-01-01", "1970-01-02"]);
        assert_eq!(groups["1970-01-02"].failed_validation.cost_micros, 40);
        assert_eq!(report.totals.unpriced_attempts(), 0);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["fresh"]["cost_micros"], 100);
        assert_eq!(json["failed_validation"]["attempts"], 1);
    }
}
