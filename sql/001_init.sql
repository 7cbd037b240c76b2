-- mydata-batch PostgreSQL schema, version 1. The single source of truth for production;
-- batch/db/schema.py declares the same tables for SQLite (a test keeps them in step).

CREATE TABLE IF NOT EXISTS schema_migrations (
    version     INTEGER PRIMARY KEY,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS settings (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);

-- Provider institutions, their registered windows (JSON list of "hhmm:hhmm") and limits.
CREATE TABLE IF NOT EXISTS institutions (
    org_code          CHAR(10) PRIMARY KEY,
    industry          TEXT NOT NULL,
    base_url          TEXT NOT NULL,
    windows           TEXT NOT NULL,
    calls_per_second  DOUBLE PRECISION NOT NULL CHECK (calls_per_second > 0),
    max_concurrency   INTEGER NOT NULL CHECK (max_concurrency > 0),
    options           TEXT NOT NULL DEFAULT '{}',
    updated_at        TIMESTAMPTZ NOT NULL
);

-- One row per (user, provider) standing transfer request. due_week is the Sunday of the
-- week in which the consent is next due: backlog (< this week) sorts first in the keyset.
CREATE TABLE IF NOT EXISTS consents (
    id                 BIGSERIAL PRIMARY KEY,
    user_id            TEXT NOT NULL,
    org_code           CHAR(10) NOT NULL REFERENCES institutions (org_code),
    access_token       TEXT NOT NULL,
    refresh_token      TEXT,
    consented_at       TIMESTAMPTZ NOT NULL,
    last_scheduled_at  TIMESTAMPTZ,
    status             TEXT NOT NULL DEFAULT 'active'
                       CHECK (status IN ('active', 'dead', 'revoked')),
    due_week           DATE NOT NULL,
    not_before         TIMESTAMPTZ NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    unknown_attempts   INTEGER NOT NULL DEFAULT 0,
    week_result        TEXT,
    pending_items      TEXT,
    last_error         TEXT,
    lease_owner        TEXT,
    lease_until        TIMESTAMPTZ,
    updated_at         TIMESTAMPTZ NOT NULL,
    UNIQUE (user_id, org_code)
);
-- The producer's keyset scan: per provider, due weeks up to this one, in (due_week, id) order.
CREATE INDEX IF NOT EXISTS consents_due_idx
    ON consents (org_code, due_week, id) WHERE status = 'active';
CREATE INDEX IF NOT EXISTS consents_lease_idx
    ON consents (lease_until) WHERE lease_owner IS NOT NULL;

-- Daily user-initiated calls per provider (the usage history the planner learns from).
CREATE TABLE IF NOT EXISTS usage_daily (
    org_code    CHAR(10) NOT NULL REFERENCES institutions (org_code),
    day         DATE NOT NULL,
    user_calls  BIGINT NOT NULL CHECK (user_calls >= 0),
    PRIMARY KEY (org_code, day)
);

-- The saved plan: per provider and day, and per minute of the day (minute of day, KST).
CREATE TABLE IF NOT EXISTS plan_days (
    org_code             CHAR(10) NOT NULL REFERENCES institutions (org_code),
    day                  DATE NOT NULL,
    week_start           DATE NOT NULL,
    forecast_user_calls  BIGINT NOT NULL,
    batch_quota          BIGINT NOT NULL,
    capacity             BIGINT NOT NULL,
    unplaceable          BIGINT NOT NULL DEFAULT 0,
    created_at           TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (org_code, day)
);

CREATE TABLE IF NOT EXISTS plan_minutes (
    org_code  CHAR(10) NOT NULL REFERENCES institutions (org_code),
    day       DATE NOT NULL,
    minute    SMALLINT NOT NULL CHECK (minute >= 0 AND minute < 1440),
    target    INTEGER NOT NULL CHECK (target >= 0),
    PRIMARY KEY (org_code, day, minute)
);

-- One row per `run` invocation.
CREATE TABLE IF NOT EXISTS runs (
    run_id       TEXT PRIMARY KEY,
    day          DATE NOT NULL,
    worker_id    TEXT NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    finished_at  TIMESTAMPTZ,
    status       TEXT NOT NULL DEFAULT 'running',
    summary      TEXT
);

-- One row per refresh outcome (a consent's whole call sequence).
CREATE TABLE IF NOT EXISTS call_outcomes (
    id          BIGSERIAL PRIMARY KEY,
    run_id      TEXT NOT NULL,
    consent_id  BIGINT NOT NULL,
    org_code    CHAR(10) NOT NULL,
    day         DATE NOT NULL,
    tran_id     CHAR(25),
    kind        TEXT NOT NULL,
    action      TEXT NOT NULL,
    rsp_code    TEXT,
    calls       INTEGER NOT NULL DEFAULT 0,
    elapsed_ms  INTEGER NOT NULL DEFAULT 0,
    at          TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS call_outcomes_day_idx ON call_outcomes (org_code, day);
CREATE INDEX IF NOT EXISTS call_outcomes_run_idx ON call_outcomes (run_id);

-- Consents whose attempts this week are exhausted; `requeue` sends them back.
CREATE TABLE IF NOT EXISTS dead_letters (
    id           BIGSERIAL PRIMARY KEY,
    consent_id   BIGINT NOT NULL REFERENCES consents (id),
    org_code     CHAR(10) NOT NULL,
    week_start   DATE NOT NULL,
    attempts     INTEGER NOT NULL,
    last_error   TEXT,
    entered_at   TIMESTAMPTZ NOT NULL,
    requeued_at  TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS dead_letters_open_idx ON dead_letters (org_code) WHERE requeued_at IS NULL;

INSERT INTO schema_migrations (version) VALUES (1) ON CONFLICT DO NOTHING;
