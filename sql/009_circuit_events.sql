-- The cluster circuit's history (batch/cluster/): every open and close the coordinator
-- decided, and every operator override (`mydata-batch circuit open|close|auto`), with its
-- reason. The current state lives in Redis; this is what `circuit` and the dashboard show
-- as "why and since when", and what stays when Redis is flushed.
CREATE TABLE IF NOT EXISTS circuit_events (
    id            BIGSERIAL PRIMARY KEY,
    at            TIMESTAMPTZ NOT NULL,
    org_code      VARCHAR(10) NOT NULL,
    state         TEXT NOT NULL,
    reason        TEXT NOT NULL,
    source        TEXT NOT NULL,
    actor         TEXT NOT NULL DEFAULT '',
    generation    BIGINT,
    failure_rate  DOUBLE PRECISION,
    slow_rate     DOUBLE PRECISION,
    calls         INTEGER
);
CREATE INDEX IF NOT EXISTS circuit_events_org_idx ON circuit_events (org_code, at);

INSERT INTO schema_migrations (version) VALUES (9) ON CONFLICT DO NOTHING;
