"""The operator's dashboard: a week's load per day, today's plan vs done, run health.

``data`` reads a :class:`~batch.dashboard.data.Snapshot`, ``figures`` derives the numbers,
``render`` writes the self-contained HTML page, ``server`` serves it live.
"""
