-- The consent lifecycle (batch/lifecycle.py): per-week counters, the start mark of a claim,
-- and dead assets found on detail calls (never called again on schedule).
ALTER TABLE consents ADD COLUMN IF NOT EXISTS counters_week DATE;
ALTER TABLE consents ADD COLUMN IF NOT EXISTS started_at TIMESTAMPTZ;
-- Counters and progress written before this version belong to the consent's due week
-- (once: not a scan of every consent at each start).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM schema_migrations WHERE version = 3) THEN
        UPDATE consents SET counters_week = due_week
        WHERE counters_week IS NULL
          AND (attempts > 0 OR unknown_attempts > 0 OR pending_items IS NOT NULL);
    END IF;
END $$;

CREATE TABLE IF NOT EXISTS dead_assets (
    consent_id BIGINT NOT NULL,  -- no foreign key, like call_outcomes
    item_id    TEXT NOT NULL,
    since      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consent_id, item_id)
);

INSERT INTO schema_migrations (version) VALUES (3) ON CONFLICT DO NOTHING;
