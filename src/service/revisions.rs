//! The revisions of a source and the findings diff between two of them. The store keeps
//! the links (`superseded_by`, written by the commit); this is where the schemas are known,
//! so a diff across schema versions is offered here when their identity fields agree.

use super::{Error, Service, check_tenant, invalid};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::State;
use crate::store::{ExtractionRecord, FindingsDiff, findings_diff, schema_family};

/// A source's revisions under one schema name, oldest intake first.
#[derive(Debug, Clone)]
pub struct Source {
    /// The revision with the newest intake, whatever its state.
    pub current: ExtractionRecord,
    pub revisions: Vec<ExtractionRecord>,
}

impl Source {
    /// The committed revision nothing superseded: what `latest=true` exports.
    pub fn latest_committed(&self) -> Option<&ExtractionRecord> {
        self.revisions.iter().rev().find(|r| matches!(r.state, State::Committed { .. }) && r.superseded_by.is_none())
    }
}

/// Which revision a diff compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Against {
    /// The newest committed revision of the same source with an older intake.
    Previous,
    Id(ExtractionId),
}

/// Two revisions' findings compared by canonical identity, `from` the older.
#[derive(Debug, Clone)]
pub struct RevisionDiff {
    pub from: ExtractionRecord,
    pub to: ExtractionRecord,
    pub diff: FindingsDiff,
}

impl Service {
    /// The revisions of `source_id` for `tenant` under `schema` (a name; a version, if
    /// given, is ignored: every version of the name is one list).
    pub async fn source(&self, tenant: &str, source_id: &str, schema: &str) -> Result<Source, Error> {
        check_tenant(tenant)?;
        let family = schema_family(schema);
        if family.is_empty() {
            return Err(invalid("schema", "must name a schema"));
        }
        let revisions = self.store.revisions(tenant.into(), source_id.into(), family.into()).await?;
        let current = revisions.last().cloned().ok_or_else(|| Error::UnknownSource {
            tenant: tenant.into(),
            source_id: source_id.into(),
            schema: family.into(),
        })?;
        Ok(Source { current, revisions })
    }

    /// The findings diff of committed extraction `id` against `against`.
    pub async fn revision_diff(&self, id: ExtractionId, against: Against) -> Result<RevisionDiff, Error> {
        let to = self.get(id).await?;
        let committed = |r: &ExtractionRecord| matches!(r.state, State::Committed { .. });
        if !committed(&to) {
            return Err(Error::NotComparable(format!("extraction {id} is not committed")));
        }
        let from =
            match against {
                Against::Id(other) => {
                    let from = self.get(other).await?;
                    if from.tenant != to.tenant
                        || from.source_id != to.source_id
                        || schema_family(&from.schema) != schema_family(&to.schema)
                    {
                        return Err(Error::NotComparable(format!(
                            "extraction {other} is not a revision of the same source and schema name"
                        )));
                    }
                    if !committed(&from) {
                        return Err(Error::NotComparable(format!("extraction {other} is not committed")));
                    }
                    from
                }
                Against::Previous => {
                    let source = self.source(&to.tenant, &to.source_id, &to.schema).await?;
                    source.revisions.into_iter().rev().find(|r| r.seq < to.seq && committed(r)).ok_or_else(|| {
                        Error::NotComparable(format!("extraction {id} has no older committed revision"))
                    })?
                }
            };
        if from.schema != to.schema {
            let (a, b) = (self.registry().get(&from.schema)?, self.registry().get(&to.schema)?);
            if a.identity_pointers() != b.identity_pointers() {
                return Err(Error::NotComparable(format!(
                    "{} and {} identify findings by different fields ({:?}, {:?}): a re-extraction, not comparable",
                    from.schema,
                    to.schema,
                    a.identity_pointers(),
                    b.identity_pointers()
                )));
            }
        }
        let (old, new) = (self.findings(from.id).await?, self.findings(to.id).await?);
        let diff = findings_diff(
            old.iter().map(|f| f.canonical_identity.as_str()),
            new.iter().map(|f| f.canonical_identity.as_str()),
        );
        Ok(RevisionDiff { from, to, diff })
    }
}
