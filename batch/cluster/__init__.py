"""Cluster mode (``run --redis``): many workers on one PostgreSQL and one Redis.

PostgreSQL holds the work (claims ``FOR UPDATE SKIP LOCKED`` with leases and start marks)
and the worker registry (:mod:`batch.cluster.registry`: heartbeats, death seen by a live
worker, a dead worker's leases expired at once). Redis holds the shared counters, each one
Lua script on the server's clock (:mod:`batch.cluster.scripts`): a provider's GCRA with the
cluster-wide back-off, and a provider-minute's and provider-day's starts. A worker
reserves permits per slice (:mod:`batch.cluster.permits`) behind its local limiter, and
asks once per slice for its share of the minute's starts (:mod:`batch.cluster.allowance`).
Without Redis, each worker runs at the provider's rate divided by the live workers and
grants itself that share of each minute (:mod:`batch.cluster.session`), and says so.
``run --processes N``: :mod:`batch.cluster.processes`. The cluster circuit (coordinator,
probes) lives in ``circuit*.py`` / ``coordinator*.py`` beside these.
"""
