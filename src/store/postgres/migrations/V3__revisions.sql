-- The revisions of each source on PostgreSQL, schema version 3 (the redb store's
-- `revisions` table): a commit finds its source's other revisions by (tenant, source_id,
-- schema name without its version), and `latest=true` leaves out superseded ones.

-- Rows written before version 3 get `source_id` from their record when the store is
-- opened (`postgres/revisions.rs`: the id is inside the encoded record only).
ALTER TABLE extractions ADD COLUMN source_id text;
ALTER TABLE extractions ADD COLUMN schema_family text;
-- The newer revision that superseded this one (its 32-byte id), as in the record.
ALTER TABLE extractions ADD COLUMN superseded_by bytea CHECK (octet_length(superseded_by) = 32);
UPDATE extractions SET schema_family = split_part(schema_name, '@', 1);
CREATE INDEX extractions_revisions ON extractions (tenant, source_id, schema_family, seq);
