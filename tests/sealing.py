"""The session's token key and cipher, for tests that write or read stored tokens themselves
(tests/conftest.py puts the key in the environment before any test module is imported).

A stored token is bound to its row: seal and open it with the consent's (org_code, user_id)
and its column, as the database holds it."""

from __future__ import annotations

import base64
import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from batch.crypto import KEYS_ENV, TokenCipher, TokenColumn, TokenSlot, key_id

KEY = os.environ[KEYS_ENV]
CIPHER = TokenCipher.from_texts([KEY])


def seal(token: str, org_code: str, user_id: str,
         column: TokenColumn = "access_token") -> str:
    """``token`` as the database stores it in ``column`` of consent (org_code, user_id)."""
    return CIPHER.encrypt(token, TokenSlot(org_code, user_id, column))


def unseal(stored: str, org_code: str, user_id: str,
           column: TokenColumn = "access_token") -> str:
    """The token ``stored`` in ``column`` of consent (org_code, user_id)."""
    return CIPHER.decrypt(stored, TokenSlot(org_code, user_id, column))


def seal_v1(token: str, key: str = KEY) -> str:
    """``token`` in the old ``v1`` form (no associated data: bound to no row), as a
    database written before the binding holds it. Built here from the primitives: the
    code never writes v1."""
    raw = base64.urlsafe_b64decode(key)
    nonce = os.urandom(12)
    body = nonce + AESGCM(raw).encrypt(nonce, token.encode(), None)
    return f"v1.{key_id(raw)}." + base64.urlsafe_b64encode(body).decode().rstrip("=")
