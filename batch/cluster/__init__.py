"""Cluster mode: many workers against one PostgreSQL and one Redis."""
