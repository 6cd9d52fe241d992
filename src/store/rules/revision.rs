//! The revisions of a source, the same on both backends. Within (tenant, source_id,
//! schema name without its version) the extraction with the highest intake sequence is the
//! source's current revision. When a revision commits, the committed revision that was
//! current until then (the one committed revision of the source not yet superseded) is
//! marked `superseded_by` it if it is older; if it is newer, the committing one is born
//! superseded by it. Nothing is deleted or uncommitted, and no link is ever rewritten.
//!
//! Each backend loads the source's revisions in its commit transaction (redb: the
//! `REVISIONS` index; PostgreSQL: the rows of the source under an advisory lock), asks
//! [`previous`] whose findings the diff needs, loads them, and carries out [`plan`].

use std::collections::BTreeSet;

use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::State;
use crate::store::records::{DiffCounts, ExtractionRecord, FindingRecord, OutboxKind};

/// A schema's name without its version: `code-review@2` → `code-review`. Revisions are
/// grouped by it, so a new schema version's extraction of a source is in the same list.
pub fn schema_family(schema: &str) -> &str {
    schema.split_once('@').map_or(schema, |(name, _)| name)
}

/// The findings of two revisions compared by each finding's canonical identity (the
/// finding key differs per extraction): what the newer one introduced, what it no longer
/// has, and what both have. Each list sorted, without repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FindingsDiff {
    pub introduced: Vec<String>,
    pub resolved: Vec<String>,
    pub unchanged: Vec<String>,
}

impl FindingsDiff {
    pub fn counts(&self) -> DiffCounts {
        DiffCounts {
            introduced: self.introduced.len() as u64,
            resolved: self.resolved.len() as u64,
            unchanged: self.unchanged.len() as u64,
        }
    }
}

/// The diff from `older`'s findings to `newer`'s, both given as canonical identities.
pub fn diff<'a>(older: impl IntoIterator<Item = &'a str>, newer: impl IntoIterator<Item = &'a str>) -> FindingsDiff {
    let older: BTreeSet<&str> = older.into_iter().collect();
    let newer: BTreeSet<&str> = newer.into_iter().collect();
    let owned = |set: std::collections::btree_set::Difference<'_, &str>| set.map(|s| s.to_string()).collect();
    FindingsDiff {
        introduced: owned(newer.difference(&older)),
        resolved: owned(older.difference(&newer)),
        unchanged: older.intersection(&newer).map(|s| s.to_string()).collect(),
    }
}

/// Whether `record` belongs to the revisions of `of`'s source.
pub(in crate::store) fn same_source(of: &ExtractionRecord, record: &ExtractionRecord) -> bool {
    record.tenant == of.tenant
        && record.source_id == of.source_id
        && schema_family(&record.schema) == schema_family(&of.schema)
}

/// The source's committed revision that is current before `committing` commits: the one
/// committed revision not superseded (the newest committed, while the links are sound).
/// `revisions` are the source's records as loaded (the committing one may be among them).
pub(in crate::store) fn current_committed<'r>(
    committing: &ExtractionRecord,
    revisions: &'r [ExtractionRecord],
) -> Option<&'r ExtractionRecord> {
    revisions
        .iter()
        .filter(|r| r.seq != committing.seq && same_source(committing, r))
        .filter(|r| matches!(r.state, State::Committed { .. }) && r.superseded_by.is_none())
        .max_by_key(|r| r.seq)
}

/// The revision `committing` will supersede, whose findings the commit's diff compares
/// with: the current committed revision, if it is older.
pub(in crate::store) fn previous<'r>(
    committing: &ExtractionRecord,
    revisions: &'r [ExtractionRecord],
) -> Option<&'r ExtractionRecord> {
    current_committed(committing, revisions).filter(|c| c.seq < committing.seq)
}

/// What a commit does to the links of its source, and the events it adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct Supersession {
    /// The committing record is born superseded by this newer, already committed one.
    pub born_superseded_by: Option<ExtractionId>,
    /// This older committed revision (by sequence) gets `superseded_by` the committing one.
    pub supersede: Option<u64>,
    /// The kind of the committing record's `extraction.committed` events.
    pub committed_kind: OutboxKind,
    /// `extraction.superseded` events: about which record (by sequence), and its kind.
    pub superseded_events: Vec<(u64, OutboxKind)>,
}

impl Supersession {
    /// Writes the committing record's own link (born superseded), before its commit is
    /// written with it.
    pub(in crate::store) fn link(&self, record: &mut ExtractionRecord) {
        if let Some(by) = self.born_superseded_by {
            record.superseded_by = Some(by);
        }
    }
}

/// [`plan`] as the backends call it: the commit's findings as it writes them and the
/// canonical identities of [`previous`]'s findings as they loaded them.
pub(in crate::store) fn plan_commit(
    committing: &ExtractionRecord,
    revisions: &[ExtractionRecord],
    findings: &[FindingRecord],
    previous_findings: Option<&[String]>,
) -> Supersession {
    let previous: Option<Vec<&str>> = previous_findings.map(|p| p.iter().map(String::as_str).collect());
    let committing_findings: Vec<&str> = findings.iter().map(|f| f.canonical_identity.as_str()).collect();
    plan(committing, revisions, &committing_findings, previous.as_deref())
}

/// The one decision: given the committing record, the source's revisions as loaded in the
/// commit's transaction, and the canonical identities of the committing record's findings
/// and of [`previous`]'s (`None` when there is no previous revision), which record gets
/// `superseded_by` and which events the commit enqueues with which diff counts. The diff
/// counts are given only between two extractions of the same schema version: across
/// versions the store cannot tell whether the identity fields are the same, so the API
/// offers that diff (`GET /v1/extractions/{id}/diff`), where the schemas are known.
pub(in crate::store) fn plan(
    committing: &ExtractionRecord,
    revisions: &[ExtractionRecord],
    findings: &[&str],
    previous_findings: Option<&[&str]>,
) -> Supersession {
    let Some(current) = current_committed(committing, revisions) else {
        return Supersession {
            born_superseded_by: None,
            supersede: None,
            committed_kind: OutboxKind::Committed,
            superseded_events: Vec::new(),
        };
    };
    if current.seq > committing.seq {
        // An older revision committing late: it never becomes current.
        return Supersession {
            born_superseded_by: Some(current.id),
            supersede: None,
            committed_kind: OutboxKind::Committed,
            superseded_events: vec![(committing.seq, OutboxKind::Superseded { by: current.id })],
        };
    }
    let counts = (current.schema == committing.schema)
        .then(|| diff(previous_findings.unwrap_or_default().iter().copied(), findings.iter().copied()).counts());
    Supersession {
        born_superseded_by: None,
        supersede: Some(current.seq),
        committed_kind: OutboxKind::Revision { supersedes: current.id, diff: counts },
        superseded_events: vec![(current.seq, OutboxKind::Superseded { by: committing.id })],
    }
}

/// What `verify` finds wrong with `record`'s `superseded_by` link, given the record that
/// link names (`None`: no such extraction), the same on both backends. A link names a
/// newer committed revision of the same source, and only a committed one has a link.
/// Erasure removes a tenant's revisions together, and links never cross tenants, so a
/// link to a missing extraction is corruption, never erasure's doing.
pub(in crate::store) fn link_problem(record: &ExtractionRecord, target: Option<&ExtractionRecord>) -> Option<String> {
    let by = record.superseded_by?;
    let committed = |r: &ExtractionRecord| matches!(r.state, State::Committed { .. });
    let id = record.id;
    if !committed(record) {
        return Some(format!("{id}: superseded by {by} but {}", record.state.name().as_str()));
    }
    let Some(target) = target else {
        return Some(format!("{id}: superseded by {by}, which does not exist"));
    };
    if !same_source(record, target) {
        Some(format!("{id}: superseded by {by}, a revision of another source or schema name"))
    } else if target.seq <= record.seq {
        Some(format!("{id}: superseded by {by}, an older intake"))
    } else if !committed(target) {
        Some(format!("{id}: superseded by {by}, which is {}", target.state.name().as_str()))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rules::fixtures::record;

    fn revision(seq: u64, state: State) -> ExtractionRecord {
        ExtractionRecord { id: ExtractionId([seq as u8; 32]), seq, ..record(state) }
    }

    fn committed(seq: u64) -> ExtractionRecord {
        revision(seq, State::Committed { at_ms: seq })
    }

    #[test]
    fn the_diff_compares_canonical_identities_and_ignores_repeats() {
        let d = diff(["a", "b", "b", "c"], ["c", "d", "b"]);
        assert_eq!(d.introduced, vec!["d"]);
        assert_eq!(d.resolved, vec!["a"]);
        assert_eq!(d.unchanged, vec!["b", "c"]);
        assert_eq!(d.counts(), DiffCounts { introduced: 1, resolved: 1, unchanged: 2 });
        assert_eq!(diff([], []), FindingsDiff::default());
    }

    #[test]
    fn verify_accepts_a_link_to_a_newer_committed_revision_and_nothing_else() {
        let (r1, r2) = (committed(1), committed(2));
        let linked = ExtractionRecord { superseded_by: Some(r2.id), ..r1.clone() };
        assert_eq!(link_problem(&linked, Some(&r2)), None);
        assert_eq!(link_problem(&r1, None), None, "no link, nothing to check");
        assert!(link_problem(&linked, None).unwrap().contains("does not exist"));
        let backwards = ExtractionRecord { superseded_by: Some(r1.id), ..r2.clone() };
        assert!(link_problem(&backwards, Some(&r1)).unwrap().contains("older intake"));
        let pending = revision(2, State::Pending);
        assert!(link_problem(&linked, Some(&pending)).unwrap().contains("pending"));
        let stranger = ExtractionRecord { tenant: "u".into(), ..r2 };
        assert!(link_problem(&linked, Some(&stranger)).unwrap().contains("another source"));
    }

    #[test]
    fn schema_families_drop_the_version() {
        assert_eq!(schema_family("code-review@2"), "code-review");
        assert_eq!(schema_family("plain"), "plain");
    }

    #[test]
    fn the_first_commit_of_a_source_supersedes_nothing() {
        let r1 = revision(1, State::Claimed { worker: "w".into(), lease_token: "l".into(), expires_at_ms: 9 });
        let pending = revision(2, State::Pending);
        let plan = plan(&r1, &[r1.clone(), pending], &["a"], None);
        assert_eq!((plan.born_superseded_by, plan.supersede), (None, None));
        assert_eq!(plan.committed_kind, OutboxKind::Committed);
        assert!(plan.superseded_events.is_empty());
    }

    #[test]
    fn a_newer_commit_supersedes_the_current_one_with_the_diff_counts() {
        let (r1, r2, r3) = (committed(1), committed(2), revision(3, State::Pending));
        let old = ExtractionRecord { superseded_by: Some(r2.id), ..r1 };
        let revisions = [old, r2.clone(), r3.clone()];
        assert_eq!(previous(&r3, &revisions).map(|r| r.seq), Some(2), "the superseded r1 is not current");
        let plan = plan(&r3, &revisions, &["b", "c"], Some(&["a", "b"]));
        assert_eq!((plan.born_superseded_by, plan.supersede), (None, Some(2)));
        let counts = DiffCounts { introduced: 1, resolved: 1, unchanged: 1 };
        assert_eq!(plan.committed_kind, OutboxKind::Revision { supersedes: r2.id, diff: Some(counts) });
        assert_eq!(plan.superseded_events, vec![(2, OutboxKind::Superseded { by: r3.id })]);
    }

    #[test]
    fn an_older_revision_committing_after_a_newer_one_is_born_superseded() {
        let (r1, r3) = (revision(1, State::Pending), committed(3));
        let revisions = [r1.clone(), r3.clone()];
        assert!(previous(&r1, &revisions).is_none());
        let plan = plan(&r1, &revisions, &["a"], None);
        assert_eq!((plan.born_superseded_by, plan.supersede), (Some(r3.id), None));
        assert_eq!(plan.committed_kind, OutboxKind::Committed);
        assert_eq!(plan.superseded_events, vec![(1, OutboxKind::Superseded { by: r3.id })]);
    }

    #[test]
    fn across_schema_versions_the_commit_supersedes_without_counts_and_other_sources_do_not_count() {
        let r1 = committed(1);
        let r2 = ExtractionRecord { schema: "code-review@2".into(), ..revision(2, State::Pending) };
        let stranger = ExtractionRecord { source_id: "other".into(), ..committed(5) };
        let plan = plan(&r2, &[r1.clone(), stranger], &["a"], Some(&["a"]));
        assert_eq!(plan.committed_kind, OutboxKind::Revision { supersedes: r1.id, diff: None });
        assert_eq!(plan.supersede, Some(1));
        let other = ExtractionRecord { schema: "other@1".into(), ..r1 };
        assert_eq!(super::plan(&r2, &[other], &[], None).supersede, None, "another schema is another list");
    }
}
