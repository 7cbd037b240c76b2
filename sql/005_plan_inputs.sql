-- What a plan was made from, so `run` re-plans a plan made under other settings or before
-- consents or institutions were loaded again; consents of an earlier week (overdue) per
-- provider and day; the reason a run failed.
ALTER TABLE plan_days ADD COLUMN IF NOT EXISTS overdue BIGINT NOT NULL DEFAULT 0;
ALTER TABLE plan_days ADD COLUMN IF NOT EXISTS limits_key TEXT;
ALTER TABLE plan_days ADD COLUMN IF NOT EXISTS load_generation BIGINT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS error TEXT;

CREATE TABLE IF NOT EXISTS load_marks (
    what        TEXT PRIMARY KEY,
    loaded_at   TIMESTAMPTZ NOT NULL,
    generation  BIGINT NOT NULL
);

INSERT INTO schema_migrations (version) VALUES (5) ON CONFLICT DO NOTHING;
