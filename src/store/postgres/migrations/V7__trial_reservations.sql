-- Trials reserve against their tenant's budget as production batch members do (schema
-- version 7; redb's `trial_reservations`; docs/EVALUATIONS.md, "Budget"): one row per
-- sent trial until it is answered or failed. The tenant's headroom adds them up.
CREATE TABLE trial_reservations (
    batch bigint NOT NULL,
    idx integer NOT NULL CHECK (idx >= 0),
    evaluation text COLLATE "C" NOT NULL,
    tenant text COLLATE "C" NOT NULL,
    micros bigint NOT NULL CHECK (micros > 0),
    PRIMARY KEY (batch, idx)
);
CREATE INDEX trial_reservations_tenant ON trial_reservations (tenant);
CREATE INDEX trial_reservations_evaluation ON trial_reservations (evaluation);
