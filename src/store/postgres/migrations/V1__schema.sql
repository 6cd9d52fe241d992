-- The commitpoint store on PostgreSQL, schema version 1.
--
-- Every stored value keeps the store's own encoding (a format byte, then bincode) in a
-- bytea `record` column, with that format byte repeated in `format` so a migration can
-- find old rows with SQL. The plain columns beside it are what queries select, order,
-- lock and check on; the store writes both in the same statement.

CREATE TABLE meta (
    key text PRIMARY KEY,
    value bytea NOT NULL
);

CREATE SEQUENCE extraction_seq AS bigint MINVALUE 1;

CREATE TABLE extractions (
    -- The 32-byte identity: a second intake of the same identity conflicts here.
    id bytea PRIMARY KEY CHECK (octet_length(id) = 32),
    seq bigint NOT NULL UNIQUE,
    tenant text NOT NULL,
    schema_name text NOT NULL,
    state_code smallint NOT NULL,
    -- The lease token (claimed) or batch key (submitted, ready) a result must present.
    fence text,
    lease_expires_at_ms bigint,
    committed_at_ms bigint,
    updated_at_ms bigint NOT NULL,
    format smallint NOT NULL,
    record bytea NOT NULL,
    content bytea NOT NULL
);

-- Claims: pending work in intake order (per schema, and overall), expired leases first.
CREATE INDEX extractions_pending_by_schema ON extractions (schema_name, seq) WHERE state_code = 1;
CREATE INDEX extractions_by_state ON extractions (state_code, seq);
CREATE INDEX extractions_leases ON extractions (lease_expires_at_ms, seq) WHERE state_code = 2;
CREATE INDEX extractions_by_tenant ON extractions (tenant, seq);
CREATE INDEX extractions_commits ON extractions (tenant, committed_at_ms, seq) WHERE committed_at_ms IS NOT NULL;

CREATE TABLE findings (
    extraction_seq bigint NOT NULL REFERENCES extractions (seq),
    key bytea NOT NULL CHECK (octet_length(key) = 32),
    format smallint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (extraction_seq, key)
);

CREATE TABLE results (
    extraction_seq bigint PRIMARY KEY REFERENCES extractions (seq),
    format smallint NOT NULL,
    record bytea NOT NULL
);

CREATE SEQUENCE ledger_seq AS bigint MINVALUE 1;

CREATE TABLE ledger (
    seq bigint PRIMARY KEY,
    tenant text NOT NULL,
    at_ms bigint NOT NULL,
    extraction_seq bigint NOT NULL,
    provider text NOT NULL,
    request_id text,
    replay boolean NOT NULL,
    cost_micros bigint NOT NULL,
    format smallint NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX ledger_by_tenant ON ledger (tenant, at_ms, seq);
CREATE INDEX ledger_by_extraction ON ledger (extraction_seq, seq);

-- Spend per tenant and UTC day, updated in the transaction that writes the entry.
CREATE TABLE spend (
    tenant text NOT NULL,
    day bigint NOT NULL,
    micros bigint NOT NULL,
    PRIMARY KEY (tenant, day)
);

CREATE SEQUENCE outbox_seq AS bigint MINVALUE 1;

CREATE TABLE outbox (
    seq bigint PRIMARY KEY,
    event_id text NOT NULL,
    sink text NOT NULL,
    -- 1 pending, 2 delivered, 3 dead.
    state_code smallint NOT NULL,
    next_attempt_at_ms bigint NOT NULL,
    format smallint NOT NULL,
    record bytea NOT NULL,
    UNIQUE (event_id, sink)
);
CREATE INDEX outbox_due ON outbox (next_attempt_at_ms, seq) WHERE state_code = 1;
CREATE INDEX outbox_dead ON outbox (seq) WHERE state_code = 3;

CREATE TABLE sink_disabled (
    sink text PRIMARY KEY
);

-- A webhook delivery id is unique across every instance that takes intake.
CREATE TABLE webhook_deliveries (
    endpoint text NOT NULL,
    delivery_id text NOT NULL,
    extraction_seq bigint NOT NULL REFERENCES extractions (seq),
    PRIMARY KEY (endpoint, delivery_id)
);

CREATE SEQUENCE batch_seq AS bigint MINVALUE 1;

CREATE TABLE batches (
    seq bigint PRIMARY KEY,
    batch_key text NOT NULL UNIQUE,
    provider text NOT NULL,
    state_code smallint NOT NULL,
    job_id text,
    next_action_at_ms bigint NOT NULL,
    created_at_ms bigint NOT NULL,
    format smallint NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX batches_open ON batches (provider, next_action_at_ms);

CREATE TABLE batch_members (
    batch_seq bigint NOT NULL REFERENCES batches (seq),
    extraction_seq bigint NOT NULL REFERENCES extractions (seq),
    PRIMARY KEY (batch_seq, extraction_seq)
);

-- A provider's raw answers, staged until they are committed.
CREATE TABLE staged (
    extraction_seq bigint PRIMARY KEY REFERENCES extractions (seq),
    format smallint NOT NULL,
    record bytea NOT NULL
);

CREATE TABLE provider_pause (
    provider text PRIMARY KEY,
    paused boolean NOT NULL
);

-- Which instance drives a provider's batches: one holder at a time, and an epoch that
-- grows with every change of holder, so a paused instance's writes can be fenced out.
CREATE TABLE provider_leases (
    provider text PRIMARY KEY,
    holder text NOT NULL,
    epoch bigint NOT NULL,
    expires_at_ms bigint NOT NULL
);
