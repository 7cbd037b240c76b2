"""Pure planning: the week calendar, provider windows, the usage model, quotas, minute plans.

No I/O, no asyncio, no clock reads: time comes in as arguments.
"""

from __future__ import annotations
