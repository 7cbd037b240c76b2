"""The session's token key and cipher, for tests that write or read stored tokens themselves
(tests/conftest.py puts the key in the environment before any test module is imported)."""

from __future__ import annotations

import os

from batch.crypto import KEYS_ENV, TokenCipher

KEY = os.environ[KEYS_ENV]
CIPHER = TokenCipher.from_texts([KEY])


def seal(token: str) -> str:
    """``token`` as the database stores it."""
    return CIPHER.encrypt(token)
