-- The fair pick and budget reservations on PostgreSQL, schema version 4 (the redb store's `pending_queue`):
-- pending work by (schema, tenant) in intake order, so the pick finds the tenants with
-- pending work by a loose index scan, one probe per tenant, and reads each tenant's
-- oldest work without walking the rest of the queue.
CREATE INDEX extractions_pending_by_tenant ON extractions (schema_name, tenant, seq) WHERE state_code = 1;

-- Budget reservations (the redb store's `reservations`): what a batch member in flight
-- is reserved at against its tenant's budget; cleared by the update that moves it out
-- of submitted or ready (`rows::transition`), so a reservation never outlives its work.
ALTER TABLE extractions ADD COLUMN reserved_micros bigint;
CREATE INDEX extractions_reserved ON extractions (tenant) WHERE reserved_micros IS NOT NULL;
