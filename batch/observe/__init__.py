"""Observability of a run: what the chain and the dispatchers did, as metrics, per-minute
rows, log lines and alerts (issue 11).

- ``recorder``: the chain listener that counts (plain ints on the hot path, no locks)
- ``logbook``: the listener that logs breaker transitions, throttling and budget exhaustion
- ``collector``: the Prometheus collector that reads the recorder, the dispatchers' stats
  and the database state at collection time
- ``state``: the SQL behind the database gauges (dead letters, overdue, last good run)
- ``minutes``: the ``run_minutes`` rows (one per provider per minute)
- ``exposition``: the textfile (node exporter) and the 127.0.0.1 port
- ``session``: :class:`Observability`, the one object a run starts and closes
- ``thresholds`` / ``health``: what ``mydata-batch check`` evaluates
"""
