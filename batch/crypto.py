"""Access and refresh tokens encrypted at rest: AES-256-GCM, keys rotated through a list,
each token bound to its consent row and column.

Tokens are credentials to people's financial data, so the database never holds them in
plain text. A stored token reads ``v2.<key id>.<nonce + ciphertext, urlsafe base64>``; the
key id (the first 8 hex digits of the key's SHA-256) names which key sealed it, so a
rotation list decrypts old rows with old keys while new rows are sealed with the first.

A ``v2`` token is sealed with associated data naming where it belongs (:class:`TokenSlot`):
the consent's unique key ``(org_code, user_id)`` and the column (``access_token`` or
``refresh_token``), encoded as ``<column>|<len(org_code)>|<org_code>|<user_id>`` (the column
is one of two fixed names, the org code is length-prefixed and the user id takes the rest,
so no two slots share an encoding). A sealed token copied onto another consent row, or from
one column to the other, does not open there: one TokenKeyError line, not a token.

``v1`` tokens (written before the binding: no associated data) still open, so an existing
database keeps working; they are not current, so ``mydata-batch keys rotate`` re-seals every
one of them as ``v2``. Until it has run, a ``v1`` token is not bound to its row.

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
import copy
import hashlib
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from batch.errors import ConfigError, describe

KEYS_ENV = "MYDATA_TOKEN_KEYS"
KEY_FILE_ENV = "MYDATA_TOKEN_KEY_FILE"
#: the stored form written now: sealed with the token's slot as associated data
VERSION = "v2"
#: the stored form before the binding (no associated data): still opens, never written
LEGACY_VERSION = "v1"
#: every stored form that opens (each prefix the same length: ``_key_of`` reads by position)
VERSIONS = (LEGACY_VERSION, VERSION)
_NONCE = 12
#: ``v2.<key id>.`` (or ``v1.``) at the start of every sealed token
SEALED_PREFIX_LEN = len(VERSION) + 1 + 8 + 1
assert all(len(v) == len(VERSION) for v in VERSIONS)
_SEALED_PREFIX = re.compile(rf"(?:{'|'.join(VERSIONS)})\.([0-9a-f]{{8}})\.")
#: how a sealed token starts, whatever its key (anything else is a plain-text legacy token)
SEALED_STARTS = tuple(f"{v}." for v in VERSIONS)
_SEALED_STARTS = frozenset(SEALED_STARTS)
#: urlsafe base64 from the faster ``binascii`` encoder
_URLSAFE = bytes.maketrans(b"+/", b"-_")
_URLSAFE_BACK = bytes.maketrans(b"-_", b"+/")
_NO_KEY = (f"no token encryption key: set {KEYS_ENV} or {KEY_FILE_ENV} "
           "(make one with `mydata-batch keys generate`)")

ACCESS_TOKEN: Final = "access_token"
REFRESH_TOKEN: Final = "refresh_token"
#: the two columns a token is stored in (part of what binds it)
TokenColumn = Literal["access_token", "refresh_token"]
_COLUMNS = frozenset((ACCESS_TOKEN, REFRESH_TOKEN))


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


def token_aad(org_code: str, user_id: str, column: str) -> bytes:
    """The associated data a ``v2`` token is sealed with: ``column|len(org)|org|user``.

    Unambiguous: ``column`` is one of two fixed names (neither a prefix of the other), the
    org code is length-prefixed, and the user id is all that follows (any text)."""
    return (column + _row_aad(org_code, user_id)).encode()


def _row_aad(org_code: str, user_id: str) -> str:
    """The row's part of a token's associated data (after its column), built once a row on
    the hot paths (:meth:`TokenCipher.seal_pair`)."""
    return f"|{len(org_code)}|{org_code}|{user_id}"


@dataclass(frozen=True, slots=True)
class TokenSlot:
    """Where a stored token belongs: its consent (the unique key ``(org_code, user_id)``)
    and its column. A ``v2`` token opens only in the slot it was sealed for."""

    org_code: str
    user_id: str
    column: TokenColumn

    def __post_init__(self) -> None:
        if self.column not in _COLUMNS:
            raise ValueError(f"a token column is access_token or refresh_token, not "
                             f"{self.column!r}")

    @property
    def aad(self) -> bytes:
        return token_aad(self.org_code, self.user_id, self.column)


class TokenCipher:
    """Seals tokens with the first key; opens them with whichever key sealed them."""

    __slots__ = ("_by_id", "_prefix", "_primary", "_primary_id", "bound_only")

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
        #: refuse ``v1`` tokens (not bound to a row): once ``keys rotate`` has bound every
        #: stored token, one that turns up is from an older copy or moved (:meth:`bound`)
        self.bound_only = False

    def bound(self) -> TokenCipher:
        """This cipher (the same keys), refusing ``v1`` tokens."""
        other = copy.copy(self)
        other.bound_only = True
        return other

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

    def encrypt(self, token: str, slot: TokenSlot) -> str:
        """``token`` sealed for ``slot`` with the first key, under a fresh random nonce."""
        return self._seal(token, slot.aad)

    def decrypt(self, stored: str, slot: TokenSlot) -> str:
        """The token ``stored`` in ``slot``; TokenKeyError (one line) if it does not open
        there: a wrong key, a corrupt row, or a token moved from another row or column."""
        return self._open(stored, slot.org_code, slot.user_id, slot.column)

    def seal_pair(self, org_code: str, user_id: str, access_token: str,
                  refresh_token: str | None = None) -> tuple[str, str | None]:
        """A consent's access and (optional) refresh token, each sealed for its column.

        The hot path (a million-row load seals two million tokens): the row's part of the
        associated data is built once, no :class:`TokenSlot` per token."""
        row = _row_aad(org_code, user_id)
        access = self._seal(access_token, (ACCESS_TOKEN + row).encode())
        if refresh_token is None:
            return access, None
        return access, self._seal(refresh_token, (REFRESH_TOKEN + row).encode())

    def open(self, stored: str, org_code: str, user_id: str, column: TokenColumn) -> str:
        """The token ``stored`` in the column ``column`` of the consent ``(org_code,
        user_id)``: :meth:`decrypt` without a :class:`TokenSlot` (the dispatcher opens one
        token a refresh this way, on the hot path)."""
        return self._open(stored, org_code, user_id, column)

    def _seal(self, token: str, aad: bytes) -> str:
        # os.urandom per call (no nonce pool: nothing a fork or a thread could repeat);
        # binascii + translate is the fast form of urlsafe_b64encode (a million-row load
        # seals two million tokens).
        nonce = os.urandom(_NONCE)
        sealed = self._primary.encrypt(nonce, token.encode("utf-8"), aad)
        body = binascii.b2a_base64(nonce + sealed, newline=False).translate(_URLSAFE)
        return self._prefix + body.decode("ascii").rstrip("=")

    def _open(self, stored: str, org_code: str, user_id: str, column: str) -> str:
        parts = stored.split(".", 2)
        if len(parts) != 3 or parts[0] not in VERSIONS:
            raise TokenKeyError("a stored token is not encrypted (or was written by an "
                                "unknown version): run `mydata-batch keys rotate` to seal it")
        aead = self._by_id.get(parts[1])
        if aead is None:
            raise TokenKeyError(f"a stored token was sealed with key {parts[1]}, which is not "
                                f"in {KEYS_ENV}/{KEY_FILE_ENV} (wrong key, or an old key "
                                "dropped before `keys rotate`)")
        bound = parts[0] == VERSION
        if not bound and self.bound_only:
            raise TokenKeyError(f"a stored {column} at {org_code} is {LEGACY_VERSION}, not "
                                "bound to its row, though `keys rotate` bound every token: "
                                "refused (put back from an older copy, or moved from "
                                "another row)")
        try:
            body = parts[2]
            # binascii + translate: the fast form of urlsafe_b64decode (as ``_seal``)
            raw = binascii.a2b_base64(
                (body + "=" * (-len(body) % 4)).encode("ascii").translate(_URLSAFE_BACK))
            aad = token_aad(org_code, user_id, column) if bound else None
            return aead.decrypt(raw[:_NONCE], raw[_NONCE:], aad).decode("utf-8")
        except (InvalidTag, binascii.Error, ValueError):  # UnicodeError is a ValueError
            if bound:
                raise TokenKeyError(
                    f"the stored {column} of a consent at {org_code} (sealed with key "
                    f"{parts[1]}) does not open: it does not belong to this row (moved "
                    "from another consent or column) or is corrupt") from None
            raise TokenKeyError(f"a stored token sealed with key {parts[1]} does not open: "
                                "the row is corrupt or the key is not the one that sealed "
                                "it") from None

    def is_current(self, stored: str) -> bool:
        """True if ``stored`` is ``v2`` sealed with the first key (nothing to rotate)."""
        return stored.startswith(self._prefix)

    def reseal(self, stored: str, slot: TokenSlot) -> str:
        """``stored`` as ``v2`` for ``slot`` with the first key: a ``v1`` token, one under an
        older key, or a plain-text legacy token is (re-)sealed; a current one is kept."""
        if self.is_current(stored):
            return stored
        if stored[:len(VERSION) + 1] not in _SEALED_STARTS:  # as ``_key_of`` tells plain
            return self.encrypt(stored, slot)
        return self.encrypt(self.decrypt(stored, slot), slot)
