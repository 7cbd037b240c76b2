-- One row per provider per minute of a run (batch/observe/): planned vs started, outcome
-- classes, attempts and retries, p99 latency and slice lateness, the breaker's state. What
-- `mydata-batch check` and the dashboard's run-health section read.
CREATE TABLE IF NOT EXISTS run_minutes (
    run_id TEXT NOT NULL,
    org_code VARCHAR(10) NOT NULL,
    minute_at TIMESTAMPTZ NOT NULL,
    planned INTEGER NOT NULL DEFAULT 0,
    started INTEGER NOT NULL DEFAULT 0,
    calls INTEGER NOT NULL DEFAULT 0,
    success INTEGER NOT NULL DEFAULT 0,
    fault INTEGER NOT NULL DEFAULT 0,
    timeout INTEGER NOT NULL DEFAULT 0,
    throttled INTEGER NOT NULL DEFAULT 0,
    consent INTEGER NOT NULL DEFAULT 0,
    client INTEGER NOT NULL DEFAULT 0,
    rejected INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    retried INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 0,
    latency_p99_ms DOUBLE PRECISION,
    lateness_p99_ms DOUBLE PRECISION,
    breaker_state TEXT NOT NULL DEFAULT 'closed',
    breaker_open_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, org_code, minute_at)
);
CREATE INDEX IF NOT EXISTS run_minutes_at_idx ON run_minutes (org_code, minute_at);

INSERT INTO schema_migrations (version) VALUES (7) ON CONFLICT DO NOTHING;
