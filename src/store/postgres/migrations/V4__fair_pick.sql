-- The fair pick on PostgreSQL, schema version 4 (the redb store's `pending_queue`):
-- pending work by (schema, tenant) in intake order, so the pick finds the tenants with
-- pending work by a loose index scan, one probe per tenant, and reads each tenant's
-- oldest work without walking the rest of the queue.
CREATE INDEX extractions_pending_by_tenant ON extractions (schema_name, tenant, seq) WHERE state_code = 1;
