-- One row per process that calls providers (a `run` today, a cluster worker later): its id
-- is the node number in every x-api-tran-id it sends (5 base-62 characters), handed out
-- here so that no two processes share one, across hosts and restarts.
CREATE TABLE IF NOT EXISTS nodes (
    node_id       BIGSERIAL PRIMARY KEY,
    worker_id     TEXT NOT NULL,
    host          TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    run_id        TEXT,
    started_at    TIMESTAMPTZ NOT NULL,
    heartbeat_at  TIMESTAMPTZ NOT NULL,
    stopped_at    TIMESTAMPTZ
);

INSERT INTO schema_migrations (version) VALUES (4) ON CONFLICT DO NOTHING;
