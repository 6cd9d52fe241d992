-- Retention and tenant erasure on PostgreSQL, schema version 2: the marks the redb store
-- keeps for them (its `retired` and `erased_spend` tables), as tables of the same shape.

-- Retention drops a committed extraction's content: the column is emptied (NULL), the
-- row and its identity stay, so a redelivery is still a duplicate.
ALTER TABLE extractions ALTER COLUMN content DROP NOT NULL;

-- What retention dropped from a committed extraction (the store's RETIRED_* bits:
-- 1 content, 2 raw result). No row: nothing was dropped.
CREATE TABLE retired (
    extraction_seq bigint PRIMARY KEY REFERENCES extractions (seq),
    bits smallint NOT NULL
);

-- Per tenant and UTC day, what the ledger entries a tenant erasure removed had charged.
-- The `spend` totals are left as they were, so budgets and invoices still add up.
CREATE TABLE erased_spend (
    tenant text NOT NULL,
    day bigint NOT NULL,
    micros bigint NOT NULL,
    PRIMARY KEY (tenant, day)
);
