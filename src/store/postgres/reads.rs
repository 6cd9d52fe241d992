//! Reads of extractions on PostgreSQL: each one statement (one snapshot) where redb uses
//! one read transaction.

use super::rows::{big, decode_record, unbig};
use super::{Error, PgStore, pg};
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::StateName;
use crate::store::codec::decode;
use crate::store::records::{FindingRecord, ResultRecord};
use crate::store::{ExtractionRecord, ListFilter, ListPage, StateCount};

impl PgStore {
    pub(super) async fn get(&self, id: ExtractionId) -> Result<Option<ExtractionRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT record FROM extractions WHERE id = $1", &[&id.as_bytes().as_slice()])
            .await
            .map_err(pg("cannot read an extraction"))?;
        row.map(|r| decode_record(r.get(0))).transpose()
    }

    /// A page in intake order after the cursor; `next` is set only when more follow.
    pub(super) async fn list(&self, filter: ListFilter) -> Result<ListPage, Error> {
        let client = self.client().await?;
        let state = filter.state.map(|s| i16::from(s.code()));
        let fetch = big(filter.limit as u64).saturating_add(1);
        let rows = client
            .query(
                "SELECT record FROM extractions WHERE seq > $1 AND ($2::text IS NULL OR tenant = $2) \
                 AND ($3::smallint IS NULL OR state_code = $3) ORDER BY seq LIMIT $4",
                &[&big(filter.after), &filter.tenant, &state, &fetch],
            )
            .await
            .map_err(pg("cannot list extractions"))?;
        let more = rows.len() > filter.limit;
        let records = rows.iter().take(filter.limit).map(|r| decode_record(r.get(0))).collect::<Result<Vec<_>, _>>()?;
        let next = if more { records.last().map(|r| r.seq) } else { None };
        Ok(ListPage { records, next })
    }

    pub(super) async fn get_by_seq(&self, seq: u64) -> Result<Option<ExtractionRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT record FROM extractions WHERE seq = $1", &[&big(seq)])
            .await
            .map_err(pg("cannot read an extraction"))?;
        row.map(|r| decode_record(r.get(0))).transpose()
    }

    pub(super) async fn delivered(
        &self,
        endpoint: String,
        delivery_id: String,
    ) -> Result<Option<ExtractionRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT e.record FROM webhook_deliveries d JOIN extractions e ON e.seq = d.extraction_seq \
                 WHERE d.endpoint = $1 AND d.delivery_id = $2",
                &[&endpoint, &delivery_id],
            )
            .await
            .map_err(pg("cannot read a webhook delivery"))?;
        row.map(|r| decode_record(r.get(0))).transpose()
    }

    pub(super) async fn findings(&self, id: ExtractionId) -> Result<Option<Vec<FindingRecord>>, Error> {
        Ok(self.findings_page(id, None, usize::MAX).await?.map(|(findings, _)| findings))
    }

    /// Findings in key order after `after`; `true` when more follow.
    pub(super) async fn findings_page(
        &self,
        id: ExtractionId,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Option<(Vec<FindingRecord>, bool)>, Error> {
        let client = self.client().await?;
        let Some(row) = client
            .query_opt("SELECT seq FROM extractions WHERE id = $1", &[&id.as_bytes().as_slice()])
            .await
            .map_err(pg("cannot read an extraction"))?
        else {
            return Ok(None);
        };
        let seq: i64 = row.get(0);
        let after: Vec<u8> = after.map(|a| a.to_vec()).unwrap_or_default();
        // One more than asked: whether more follow, without a count.
        let fetch = big(limit as u64).saturating_add(1);
        let rows = client
            .query(
                "SELECT record FROM findings WHERE extraction_seq = $1 AND key > $2 ORDER BY key LIMIT $3",
                &[&seq, &after, &fetch],
            )
            .await
            .map_err(pg("cannot read findings"))?;
        let more = rows.len() > limit;
        let findings = rows.iter().take(limit).map(|r| decode(r.get(0))).collect::<Result<Vec<_>, _>>()?;
        Ok(Some((findings, more)))
    }

    pub(super) async fn result(&self, id: ExtractionId) -> Result<Option<ResultRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT r.record FROM extractions e JOIN results r ON r.extraction_seq = e.seq WHERE e.id = $1",
                &[&id.as_bytes().as_slice()],
            )
            .await
            .map_err(pg("cannot read a result"))?;
        row.map(|r| decode(r.get(0))).transpose()
    }

    /// How many extractions are in each state, and when the first of each (in intake
    /// order, as on redb) entered it; every count from one statement.
    pub(super) async fn counts_by_state(&self) -> Result<Vec<StateCount>, Error> {
        let client = self.client().await?;
        let codes: Vec<i16> = StateName::ALL.iter().map(|s| i16::from(s.code())).collect();
        let rows = client
            .query(
                "SELECT c.code, (SELECT count(*) FROM extractions WHERE state_code = c.code), \
                 (SELECT updated_at_ms FROM extractions WHERE state_code = c.code ORDER BY seq LIMIT 1) \
                 FROM unnest($1::smallint[]) AS c(code)",
                &[&codes],
            )
            .await
            .map_err(pg("cannot count extractions"))?;
        let mut counts = Vec::with_capacity(rows.len());
        for row in rows {
            let code: i16 = row.get(0);
            let Some(state) = StateName::from_code(code.into()) else {
                continue;
            };
            let (count, oldest): (i64, Option<i64>) = (row.get(1), row.get(2));
            counts.push(StateCount { state, count: unbig(count), oldest_since_ms: oldest.map(unbig) });
        }
        Ok(counts)
    }

    pub(super) async fn provider_paused(&self, provider: String) -> Result<bool, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT paused FROM provider_pause WHERE provider = $1", &[&provider])
            .await
            .map_err(pg("cannot read a provider's pause"))?;
        Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
    }

    pub(super) async fn set_provider_paused(&self, provider: String, paused: bool) -> Result<(), Error> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO provider_pause (provider, paused) VALUES ($1, $2) \
                 ON CONFLICT (provider) DO UPDATE SET paused = excluded.paused",
                &[&provider, &paused],
            )
            .await
            .map_err(pg("cannot record a provider's pause"))?;
        Ok(())
    }

    /// A round trip to the database: proof that it still answers.
    pub(super) async fn ping_writer(&self) -> Result<(), Error> {
        let client = self.client().await?;
        client.execute("SELECT 1", &[]).await.map_err(pg("the database does not answer"))?;
        Ok(())
    }
}
