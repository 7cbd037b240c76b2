"""Access and refresh tokens encrypted at rest: AES-256-GCM, keys rotated through a list.

Tokens are credentials to people's financial data, so the database never holds them in
plain text. A stored token reads ``v1.<key id>.<nonce + ciphertext, urlsafe base64>``; the
key id (the first 8 hex digits of the key's SHA-256) names which key sealed it, so a
rotation list decrypts old rows with old keys while new rows are sealed with the first.

Keys come from the environment, never from a file in the repository:

    MYDATA_TOKEN_KEYS       comma-separated keys, the first one seals (encrypts)
    MYDATA_TOKEN_KEY_FILE   a file with one key a line, the first one seals

A key is 32 random bytes in urlsafe base64 (``mydata-batch keys generate``). Rotation: put
the new key first, keep the old ones after it, run ``mydata-batch keys rotate`` (re-seals
every stored token with the first key), then drop the old keys.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from batch.errors import ConfigError, describe

KEYS_ENV = "MYDATA_TOKEN_KEYS"
KEY_FILE_ENV = "MYDATA_TOKEN_KEY_FILE"
VERSION = "v1"
_NONCE = 12
#: ``v1.<key id>.`` at the start of every sealed token (what ``stored_key_id`` reads)
SEALED_PREFIX_LEN = len(VERSION) + 1 + 8 + 1
_SEALED_PREFIX = re.compile(rf"{VERSION}\.([0-9a-f]{{8}})\.")
#: urlsafe base64 from the faster ``binascii`` encoder
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_NO_KEY = (f"no token encryption key: set {KEYS_ENV} or {KEY_FILE_ENV} "
           "(make one with `mydata-batch keys generate`)")


class TokenKeyError(ConfigError):
    """A token key is missing, malformed, or cannot open a stored token."""


def generate_key() -> str:
    """A new random key, as the text to put in MYDATA_TOKEN_KEYS."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii")


def _decode_key(text: str, where: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text.strip().encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raw = b""
    if len(raw) != 32:
        raise TokenKeyError(f"{where}: a key must be 32 bytes in urlsafe base64 (44 "
                            "characters; make one with `mydata-batch keys generate`)")
    return raw


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


def stored_key_id(stored: str) -> str | None:
    """The id of the key that sealed ``stored``; None if it is not a sealed token."""
    m = _SEALED_PREFIX.match(stored)
    return m.group(1) if m else None


class TokenCipher:
    """Seals tokens with the first key; opens them with whichever key sealed them."""

    __slots__ = ("_by_id", "_prefix", "_primary", "_primary_id")

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise TokenKeyError(_NO_KEY)
        self._by_id: dict[str, AESGCM] = {}
        for k in keys:
            if len(k) != 32:
                raise TokenKeyError("a token key must be 32 bytes")
            self._by_id.setdefault(key_id(k), AESGCM(k))
        self._primary_id = key_id(keys[0])
        self._primary = self._by_id[self._primary_id]
        self._prefix = f"{VERSION}.{self._primary_id}."

    @classmethod
    def from_texts(cls, texts: Sequence[str], *, where: str = KEYS_ENV) -> TokenCipher:
        keys = [t for t in (s.strip() for s in texts) if t and not t.startswith("#")]
        return cls([_decode_key(t, where) for t in keys])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TokenCipher:
        """The cipher the environment configures; one clear TokenKeyError if none."""
        env = os.environ if environ is None else environ
        inline = env.get(KEYS_ENV, "").strip()
        if inline:
            return cls.from_texts(inline.split(","), where=KEYS_ENV)
        path = env.get(KEY_FILE_ENV, "").strip()
        if path:
            try:
                lines = Path(path).read_text(encoding="ascii").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenKeyError(f"{KEY_FILE_ENV} {path}: cannot read: "
                                    f"{describe(exc)}") from None
            return cls.from_texts(lines, where=f"{KEY_FILE_ENV} {path}")
        raise TokenKeyError(_NO_KEY)

    @property
    def primary_id(self) -> str:
        """The id of the key that seals (the first)."""
        return self._primary_id

    @property
    def key_ids(self) -> frozenset[str]:
        """The ids of every key that opens (the first and the older ones)."""
        return frozenset(self._by_id)

    def __repr__(self) -> str:  # key ids only, never a key
        return f"TokenCipher(primary={self._primary_id}, keys={sorted(self._by_id)})"

    def encrypt(self, token: str) -> str:
        """``token`` sealed with the first key, under a fresh random 96-bit nonce."""
        # os.urandom per call (no nonce pool: nothing a fork or a thread could repeat);
        # binascii + translate is the fast form of urlsafe_b64encode (a million-row load
        # seals two million tokens).
        nonce = os.urandom(_NONCE)
        sealed = self._primary.encrypt(nonce, token.encode("utf-8"), None)
        body = binascii.b2a_base64(nonce + sealed, newline=False).translate(_URLSAFE)
        return self._prefix + body.decode("ascii").rstrip("=")

    def encrypt_optional(self, token: str | None) -> str | None:
        """A refresh token is optional: None stays None."""
        return None if token is None else self.encrypt(token)

    def decrypt_optional(self, stored: str | None) -> str | None:
        return None if stored is None else self.decrypt(stored)

    def decrypt(self, stored: str) -> str:
        parts = stored.split(".", 2)
        if len(parts) != 3 or parts[0] != VERSION:
            raise TokenKeyError("a stored token is not encrypted (or was written by an "
                                "unknown version): run `mydata-batch keys rotate` to seal it")
        aead = self._by_id.get(parts[1])
        if aead is None:
            raise TokenKeyError(f"a stored token was sealed with key {parts[1]}, which is not "
                                f"in {KEYS_ENV}/{KEY_FILE_ENV} (wrong key, or an old key "
                                "dropped before `keys rotate`)")
        try:
            raw = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4))
            return aead.decrypt(raw[:_NONCE], raw[_NONCE:], None).decode("utf-8")
        except (InvalidTag, binascii.Error, ValueError):
            raise TokenKeyError(f"a stored token sealed with key {parts[1]} does not open: "
                                "the row is corrupt or the key is not the one that sealed "
                                "it") from None

    def is_current(self, stored: str) -> bool:
        """True if ``stored`` is sealed with the first key (nothing to rotate)."""
        return stored.startswith(self._prefix)

    def reseal(self, stored: str) -> str:
        """``stored`` sealed with the first key; a plain-text legacy token is sealed."""
        if self.is_current(stored):
            return stored
        if not stored.startswith(f"{VERSION}."):
            return self.encrypt(stored)
        return self.encrypt(self.decrypt(stored))
