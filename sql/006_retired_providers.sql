-- A provider removed from the institutions file with `load institutions --retire-missing`
-- is retired: never planned or run again, its rows kept for history. Loading it again
-- brings it back.
ALTER TABLE institutions ADD COLUMN IF NOT EXISTS retired_at TIMESTAMPTZ;

INSERT INTO schema_migrations (version) VALUES (6) ON CONFLICT DO NOTHING;
