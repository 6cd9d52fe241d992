-- Per-state counters on PostgreSQL, schema version 6 (the redb store's `state_counts`):
-- status, `/metrics` and the readiness probe read a few rows instead of counting the
-- table state by state.
--
-- Every change of `extractions.state_code` (an insert, an update, a delete, a `COPY`)
-- adds its per-state deltas in the same transaction, by statement-level triggers over
-- the statement's transition tables, so no write path can forget them. The deltas are
-- appended, never updated: a writer takes no lock on a counter row and no intake waits
-- for another's commit (one counter row per state would serialise every intake behind
-- the previous one's fsync; counter rows sharded by sequence number would deadlock two
-- claims that touch the same shards in opposite orders). Reading the counts folds the
-- deltas into `state_counts` (`postgres/extractions.rs`); a count is always the sum of
-- both tables, so a read that finds deltas not yet folded is still exact.

CREATE TABLE state_counts (
    state_code smallint PRIMARY KEY,
    n bigint NOT NULL
);

-- No key and no index: only appended to by the triggers and emptied by the fold.
CREATE TABLE state_deltas (
    state_code smallint NOT NULL,
    delta bigint NOT NULL
);

CREATE FUNCTION state_deltas_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO state_deltas (state_code, delta) SELECT state_code, count(*) FROM added GROUP BY state_code;
    RETURN NULL;
END
$$;

-- An update that leaves every state as it was (a reservation, retention emptying the
-- content, a revision link) adds nothing.
CREATE FUNCTION state_deltas_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO state_deltas (state_code, delta)
    SELECT state_code, sum(d) FROM (
        SELECT state_code, 1 AS d FROM added UNION ALL SELECT state_code, -1 AS d FROM removed
    ) moved GROUP BY state_code HAVING sum(d) <> 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION state_deltas_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO state_deltas (state_code, delta) SELECT state_code, -count(*) FROM removed GROUP BY state_code;
    RETURN NULL;
END
$$;

-- Creating the triggers locks `extractions` against writes until this migration commits,
-- so the backfill below counts exactly the rows the triggers did not see.
CREATE TRIGGER extractions_counted_insert AFTER INSERT ON extractions
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION state_deltas_inserted();
CREATE TRIGGER extractions_counted_update AFTER UPDATE ON extractions
    REFERENCING OLD TABLE AS removed NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION state_deltas_updated();
CREATE TRIGGER extractions_counted_delete AFTER DELETE ON extractions
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION state_deltas_deleted();

INSERT INTO state_counts (state_code, n) SELECT state_code, count(*) FROM extractions GROUP BY state_code;
