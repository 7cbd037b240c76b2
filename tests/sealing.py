"""The session's token cipher, for tests that write or read stored tokens themselves
(tests/conftest.py puts its key in the environment before any test module is imported)."""

from __future__ import annotations

from batch.crypto import TokenCipher

CIPHER = TokenCipher.from_env()


def seal(token: str) -> str:
    """``token`` as the database stores it."""
    return CIPHER.encrypt(token)
