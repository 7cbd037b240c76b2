-- Leasing a consent must be a HOT update: no index may cover the columns a claim writes
-- (lease_owner, lease_until, unknown_attempts), and pages keep room for the new versions.
-- Measured on 10,000,000 consents: every claim otherwise wrote to all four indexes.
DROP INDEX IF EXISTS consents_lease_idx;
ALTER TABLE consents SET (fillfactor = 85);

INSERT INTO schema_migrations (version) VALUES (2) ON CONFLICT DO NOTHING;
