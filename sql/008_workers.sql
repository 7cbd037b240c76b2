-- Cluster mode (issue 10): the nodes table is the worker registry. A worker heartbeats
-- (heartbeat_at, the database server's clock), is dead once it misses the timeout it
-- registered with, and marks stopped_at when it leaves cleanly. dead_seen_at: when a live
-- worker saw it dead and expired its leases (its claims due again at once); cluster: it ran
-- with --redis (many workers on one database).
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS cluster BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS heartbeat_timeout DOUBLE PRECISION NOT NULL DEFAULT 30;
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS dead_seen_at TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS nodes_alive_idx ON nodes (stopped_at, heartbeat_at);

INSERT INTO schema_migrations (version) VALUES (8) ON CONFLICT DO NOTHING;
