"""``python -m batch.cli``: the same as the ``mydata-batch`` console script."""

from __future__ import annotations

from batch.cli import main

main()
