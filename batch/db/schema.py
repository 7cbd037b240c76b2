"""The tables, declared once for SQLAlchemy Core; ``sql/001_init.sql`` is the PostgreSQL twin."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, on every backend.

    PostgreSQL keeps TIMESTAMPTZ; SQLite stores naive UTC text that sorts correctly.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; use aware datetimes")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# BIGSERIAL on PostgreSQL; SQLite needs plain INTEGER PRIMARY KEY to autoincrement.
BigId = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()

schema_migrations = Table(
    "schema_migrations", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", UTCDateTime, nullable=False, server_default=text("CURRENT_TIMESTAMP")),
)

settings = Table(
    "settings", metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)

institutions = Table(
    "institutions", metadata,
    Column("org_code", String(10), primary_key=True),
    Column("industry", Text, nullable=False),
    Column("base_url", Text, nullable=False),
    Column("windows", Text, nullable=False),
    Column("calls_per_second", Float, nullable=False),
    Column("max_concurrency", Integer, nullable=False),
    Column("options", Text, nullable=False, server_default="{}"),
    Column("updated_at", UTCDateTime, nullable=False),
    # set by `load institutions --retire-missing`: never planned or run while set
    Column("retired_at", UTCDateTime),
    CheckConstraint("calls_per_second > 0"),
    CheckConstraint("max_concurrency > 0"),
)

consents = Table(
    "consents", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("user_id", Text, nullable=False),
    Column("org_code", String(10), ForeignKey("institutions.org_code"), nullable=False),
    Column("access_token", Text, nullable=False),
    Column("refresh_token", Text),
    Column("consented_at", UTCDateTime, nullable=False),
    Column("last_scheduled_at", UTCDateTime),
    Column("status", Text, nullable=False, server_default="active"),
    Column("due_week", Date, nullable=False),
    Column("not_before", UTCDateTime, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("unknown_attempts", Integer, nullable=False, server_default="0"),
    Column("week_result", Text),
    # JSON: where this week's transfer stopped (batch.client.Progress), for the next attempt
    Column("pending_items", Text),
    # the week attempts, unknown_attempts and pending_items belong to (another: read as none)
    Column("counters_week", Date),
    # set just before a claim's first call starts: only a started claim can be "unknown"
    Column("started_at", UTCDateTime),
    Column("last_error", Text),
    Column("lease_owner", Text),
    Column("lease_until", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("user_id", "org_code"),
    CheckConstraint("status IN ('active', 'dead', 'revoked')"),
    # room on each page for the new row versions of claims (HOT updates)
    postgresql_with={"fillfactor": 85},
)
Index(
    "consents_due_idx", consents.c.org_code, consents.c.due_week, consents.c.id,
    postgresql_where=consents.c.status == "active",
    sqlite_where=consents.c.status == "active",
)
# No index covers the lease columns: a claim must stay a HOT update (sql/002_hot_leases.sql).

usage_daily = Table(
    "usage_daily", metadata,
    Column("org_code", String(10), ForeignKey("institutions.org_code"), primary_key=True),
    Column("day", Date, primary_key=True),
    Column("user_calls", BigInteger, nullable=False),
    CheckConstraint("user_calls >= 0"),
)

plan_days = Table(
    "plan_days", metadata,
    Column("org_code", String(10), ForeignKey("institutions.org_code"), primary_key=True),
    Column("day", Date, primary_key=True),
    Column("week_start", Date, nullable=False),
    Column("forecast_user_calls", BigInteger, nullable=False),
    Column("batch_quota", BigInteger, nullable=False),
    Column("capacity", BigInteger, nullable=False),
    Column("unplaceable", BigInteger, nullable=False, server_default="0"),
    Column("created_at", UTCDateTime, nullable=False),
    # what the plan was made from (sql/005): consents of an earlier week levelled in,
    # the provider's limits (windows, rate, calls per consent) and the loads seen then
    Column("overdue", BigInteger, nullable=False, server_default="0"),
    Column("limits_key", Text),
    Column("load_generation", BigInteger),
)

plan_minutes = Table(
    "plan_minutes", metadata,
    Column("org_code", String(10), ForeignKey("institutions.org_code"), primary_key=True),
    Column("day", Date, primary_key=True),
    Column("minute", SmallInteger, primary_key=True, autoincrement=False),
    Column("target", Integer, nullable=False),
    CheckConstraint("minute >= 0 AND minute < 1440"),
    CheckConstraint("target >= 0"),
)

runs = Table(
    "runs", metadata,
    Column("run_id", Text, primary_key=True),
    Column("day", Date, nullable=False),
    Column("worker_id", Text, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    Column("status", Text, nullable=False, server_default="running"),
    Column("summary", Text),
    Column("error", Text),
)

# When consents and institutions were last loaded (sql/005): a plan made before is stale.
load_marks = Table(
    "load_marks", metadata,
    Column("what", Text, primary_key=True),
    Column("loaded_at", UTCDateTime, nullable=False),
    Column("generation", BigInteger, nullable=False),
)

call_outcomes = Table(
    "call_outcomes", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("run_id", Text, nullable=False),
    Column("consent_id", BigInteger, nullable=False),
    Column("org_code", String(10), nullable=False),
    Column("day", Date, nullable=False),
    Column("tran_id", String(25)),
    Column("kind", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("rsp_code", Text),
    Column("calls", Integer, nullable=False, server_default="0"),
    Column("elapsed_ms", Integer, nullable=False, server_default="0"),
    Column("at", UTCDateTime, nullable=False),
)
Index("call_outcomes_day_idx", call_outcomes.c.org_code, call_outcomes.c.day)
Index("call_outcomes_run_idx", call_outcomes.c.run_id)

dead_assets = Table(
    "dead_assets", metadata,
    # no foreign key (like call_outcomes): loading or truncating consents stays as it was
    Column("consent_id", BigInteger, primary_key=True, autoincrement=False),
    Column("item_id", Text, primary_key=True),
    Column("since", UTCDateTime, nullable=False),
)

dead_letters = Table(
    "dead_letters", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("consent_id", BigInteger, ForeignKey("consents.id"), nullable=False),
    Column("org_code", String(10), nullable=False),
    Column("week_start", Date, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("last_error", Text),
    Column("entered_at", UTCDateTime, nullable=False),
    Column("requeued_at", UTCDateTime),
)
Index(
    "dead_letters_open_idx", dead_letters.c.org_code,
    postgresql_where=dead_letters.c.requeued_at.is_(None),
    sqlite_where=dead_letters.c.requeued_at.is_(None),
)

# sql/004_nodes.sql: the processes that send calls; node_id is their tran-id node number.
nodes = Table(
    "nodes", metadata,
    Column("node_id", BigId, primary_key=True, autoincrement=True),
    Column("worker_id", Text, nullable=False),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("run_id", Text),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    Column("stopped_at", UTCDateTime),
    # cluster mode (sql/008_workers.sql): the worker registry
    Column("cluster", Boolean, nullable=False, server_default=false()),
    Column("heartbeat_timeout", Float, nullable=False, server_default="30"),
    Column("dead_seen_at", UTCDateTime),
    sqlite_autoincrement=True,  # never hand out a number twice, even after a delete
)

# One row per provider per minute of a run, written by the run's observability (batch/observe/):
# what `check` and the dashboard's run-health section read. sql/007_run_minutes.sql's twin.
run_minutes = Table(
    "run_minutes", metadata,
    Column("run_id", Text, primary_key=True),
    Column("org_code", String(10), primary_key=True),
    Column("minute_at", UTCDateTime, primary_key=True),
    Column("planned", Integer, nullable=False, server_default="0"),
    Column("started", Integer, nullable=False, server_default="0"),
    Column("calls", Integer, nullable=False, server_default="0"),
    Column("success", Integer, nullable=False, server_default="0"),
    Column("fault", Integer, nullable=False, server_default="0"),
    Column("timeout", Integer, nullable=False, server_default="0"),
    Column("throttled", Integer, nullable=False, server_default="0"),
    Column("consent", Integer, nullable=False, server_default="0"),
    Column("client", Integer, nullable=False, server_default="0"),
    Column("rejected", Integer, nullable=False, server_default="0"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("retried", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False, server_default="0"),
    Column("latency_p99_ms", Float),
    Column("lateness_p99_ms", Float),
    Column("breaker_state", Text, nullable=False, server_default="closed"),
    Column("breaker_open_seconds", Float, nullable=False, server_default="0"),
)
Index("run_minutes_at_idx", run_minutes.c.org_code, run_minutes.c.minute_at)
Index("nodes_alive_idx", nodes.c.stopped_at, nodes.c.heartbeat_at)

# The cluster circuit's history: the coordinator's opens and closes and the operators'
# overrides (batch/cluster/circuit_events.py). sql/009_circuit_events.sql's twin.
circuit_events = Table(
    "circuit_events", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("org_code", String(10), nullable=False),
    Column("state", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("actor", Text, nullable=False, server_default=""),
    Column("generation", BigInteger),
    Column("failure_rate", Float),
    Column("slow_rate", Float),
    Column("calls", Integer),
)
Index("circuit_events_org_idx", circuit_events.c.org_code, circuit_events.c.at)

SCHEMA_VERSION = 10
