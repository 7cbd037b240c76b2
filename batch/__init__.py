"""mydata-batch: weekly scheduled MyData transfers, spread flat, through one resilient chain."""

from __future__ import annotations

__version__ = "0.1.0"
