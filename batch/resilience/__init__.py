"""The per-provider resilience chain.

CircuitBreaker(Retry(RateLimiter(Bulkhead(timeout(call))))): one chain per provider.
"""

from __future__ import annotations
