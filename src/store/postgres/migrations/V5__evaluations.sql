-- Evaluations on PostgreSQL, schema version 5 (the redb store's `evaluations`, `trials`
-- and `trial_batches`; docs/EVALUATIONS.md). Nothing here is a commit: trials live apart
-- from extractions, and only a promotion writes to those. The text keys sort bytewise
-- (`COLLATE "C"`), as redb's keys and Rust's strings do, so lists come back in the same
-- order on both backends.

CREATE TABLE evaluations (
    name text COLLATE "C" PRIMARY KEY,
    created_at_ms bigint NOT NULL,
    format smallint NOT NULL,
    record bytea NOT NULL
);

-- One candidate's trial of one member (its index in the evaluation's frozen list).
CREATE TABLE trials (
    evaluation text COLLATE "C" NOT NULL REFERENCES evaluations (name),
    candidate text COLLATE "C" NOT NULL,
    idx integer NOT NULL CHECK (idx >= 0),
    format smallint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (evaluation, candidate, idx)
);

CREATE SEQUENCE trial_batch_seq AS bigint MINVALUE 1;

CREATE TABLE trial_batches (
    seq bigint PRIMARY KEY,
    evaluation text COLLATE "C" NOT NULL REFERENCES evaluations (name),
    -- Until it is closed: the evaluation driver's work list.
    open boolean NOT NULL,
    format smallint NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX trial_batches_open ON trial_batches (seq) WHERE open;
