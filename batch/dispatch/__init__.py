"""The dispatcher: per provider, per minute, 600 slices of 100 ms at the planned rate."""

from __future__ import annotations
