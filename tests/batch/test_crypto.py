from __future__ import annotations

from pathlib import Path

import pytest

from batch.crypto import (
    KEY_FILE_ENV,
    KEYS_ENV,
    TokenCipher,
    TokenKeyError,
    TokenSlot,
    generate_key,
    stored_key_id,
    token_aad,
)
from tests.sealing import seal_v1

A = TokenSlot("BANK000001", "u1", "access_token")
R = TokenSlot("BANK000001", "u1", "refresh_token")


def test_a_sealed_token_opens_and_never_contains_the_plain_text() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = c.encrypt("tok-secret-123", A)
    assert "tok-secret-123" not in sealed
    assert sealed.startswith(f"v2.{c.primary_id}.")
    assert c.decrypt(sealed, A) == "tok-secret-123"
    assert c.encrypt("tok-secret-123", A) != sealed  # a fresh nonce each time


def test_a_token_opens_only_in_the_slot_it_was_sealed_for() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = c.encrypt("tok", A)
    for other in (R,                                            # the other column
                  TokenSlot("BANK000001", "u2", "access_token"),  # another user
                  TokenSlot("CARD000002", "u1", "access_token")):  # another provider
        with pytest.raises(TokenKeyError, match="does not belong to this row") as e:
            c.decrypt(sealed, other)
        assert "\n" not in str(e.value) and "tok" not in str(e.value).replace("token", "")
        assert other.column in str(e.value) and other.org_code in str(e.value)
    assert c.decrypt(sealed, TokenSlot("BANK000001", "u1", "access_token")) == "tok"


def test_the_associated_data_is_unambiguous() -> None:
    # an org code and user id that run into each other still name different slots
    assert token_aad("AB", "C|x", "access_token") != token_aad("AB|C", "x", "access_token")
    assert token_aad("A", "1|B", "access_token") != token_aad("A1", "B", "access_token")
    assert token_aad("A", "u", "access_token") != token_aad("A", "u", "refresh_token")
    assert token_aad("BANK000001", "u1", "access_token") == b"access_token|10|BANK000001|u1"
    c = TokenCipher.from_texts([generate_key()])
    sealed = c.encrypt("t", TokenSlot("AB", "C|x", "access_token"))
    with pytest.raises(TokenKeyError, match="does not belong"):
        c.decrypt(sealed, TokenSlot("AB|C", "x", "access_token"))
    with pytest.raises(ValueError, match="access_token or refresh_token"):
        TokenSlot("A", "u", "pending_items")  # type: ignore[arg-type]


def test_seal_pair_and_open_bind_each_token_to_its_column() -> None:
    c = TokenCipher.from_texts([generate_key()])
    access, refresh = c.seal_pair("BANK000001", "u1", "at", "rt")
    assert refresh is not None
    assert c.decrypt(access, A) == "at" and c.decrypt(refresh, R) == "rt"
    assert c.open(access, "BANK000001", "u1", "access_token") == "at"
    assert c.open(refresh, "BANK000001", "u1", "refresh_token") == "rt"
    assert c.seal_pair("BANK000001", "u1", "at")[1] is None
    with pytest.raises(TokenKeyError, match=r"refresh_token .*does not belong"):
        c.open(access, "BANK000001", "u1", "refresh_token")  # access token in refresh_token
    with pytest.raises(TokenKeyError, match=r"access_token .*does not belong"):
        c.open(access, "BANK000002", "u1", "access_token")
    with pytest.raises(TokenKeyError, match=r"access_token .*does not belong"):
        c.open(access, "BANK000001", "u2", "access_token")


def test_open_reads_the_stored_text_as_urlsafe_b64decode_does() -> None:
    """The fast decoding (binascii) opens what the sealing wrote and refuses, as one
    TokenKeyError, what urlsafe base64 refuses or what is not ASCII."""
    c = TokenCipher.from_texts([generate_key()])
    for token in ("a", "ab", "abc", "토큰-" * 7, "x" * 100):
        assert c.open(c.encrypt(token, A), "BANK000001", "u1", "access_token") == token
    access = c.encrypt("at", A)
    # padding is ignored, as urlsafe_b64decode ignores it
    assert c.open(access + "==", "BANK000001", "u1", "access_token") == "at"
    for broken in (access + "A", access[:-1], access[:-3] + "é" * 3, access[:-2] + "+/"):
        with pytest.raises(TokenKeyError, match="does not open") as e:
            c.open(broken, "BANK000001", "u1", "access_token")
        assert "\n" not in str(e.value)


def test_a_v1_token_still_opens_is_not_current_and_reseals_as_v2() -> None:
    key = generate_key()
    c = TokenCipher.from_texts([key])
    old = seal_v1("t-old", key)
    assert old.startswith(f"v1.{c.primary_id}.") and stored_key_id(old) == c.primary_id
    assert c.decrypt(old, A) == "t-old"  # no associated data: opens in any slot
    assert not c.is_current(old)
    new = c.reseal(old, A)
    assert new.startswith(f"v2.{c.primary_id}.") and c.is_current(new)
    assert c.decrypt(new, A) == "t-old"
    with pytest.raises(TokenKeyError, match="does not belong"):
        c.decrypt(new, R)
    assert c.reseal(new, A) is new  # current: kept
    tampered = old[:-2] + ("A" if old[-2] != "A" else "B") + old[-1]
    with pytest.raises(TokenKeyError, match="does not open: the row is corrupt"):
        c.decrypt(tampered, A)


def test_rotation_opens_old_rows_and_reseals_them_with_the_first_key() -> None:
    old, new = generate_key(), generate_key()
    sealed_old = TokenCipher.from_texts([old]).encrypt("t1", A)
    both = TokenCipher.from_texts([new, old])
    assert both.decrypt(sealed_old, A) == "t1"
    assert not both.is_current(sealed_old)
    resealed = both.reseal(sealed_old, A)
    assert both.is_current(resealed)
    assert TokenCipher.from_texts([new]).decrypt(resealed, A) == "t1"
    with pytest.raises(TokenKeyError, match="does not belong"):
        both.reseal(sealed_old, R)  # a moved token is not re-sealed onto its new row


def test_reseal_seals_a_plain_text_legacy_token() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = c.reseal("legacy-plain", A)
    assert c.is_current(sealed) and c.decrypt(sealed, A) == "legacy-plain"


def test_a_wrong_key_is_one_clear_error_naming_the_key_id() -> None:
    sealed = TokenCipher.from_texts([generate_key()]).encrypt("t", A)
    other = TokenCipher.from_texts([generate_key()])
    with pytest.raises(TokenKeyError, match=r"sealed with key [0-9a-f]{8}, which is not in"):
        other.decrypt(sealed, A)


def test_a_tampered_token_does_not_open() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = c.encrypt("token", A)
    flipped = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    with pytest.raises(TokenKeyError, match="does not open"):
        c.decrypt(flipped, A)


def test_plain_text_is_refused_on_read() -> None:
    with pytest.raises(TokenKeyError, match="not encrypted"):
        TokenCipher.from_texts([generate_key()]).decrypt("plain-token", A)
    with pytest.raises(TokenKeyError, match="unknown version"):
        TokenCipher.from_texts([generate_key()]).decrypt("v3.0123abcd.xyz", A)


def test_missing_and_malformed_keys_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenKeyError, match="no token encryption key") as e:
        TokenCipher.from_env({})
    assert "\n" not in str(e.value)
    with pytest.raises(TokenKeyError, match="32 bytes"):
        TokenCipher.from_env({KEYS_ENV: "short"})
    with pytest.raises(TokenKeyError, match="cannot read"):
        TokenCipher.from_env({KEY_FILE_ENV: str(tmp_path / "missing")})


def test_key_file_first_line_seals_comments_skipped(tmp_path: Path) -> None:
    k1, k2 = generate_key(), generate_key()
    f = tmp_path / "keys"
    f.write_text(f"# rotation list\n{k1}\n{k2}\n")
    c = TokenCipher.from_env({KEY_FILE_ENV: str(f)})
    assert c.is_current(c.encrypt("x", A))
    assert TokenCipher.from_texts([k1]).decrypt(c.encrypt("x", A), A) == "x"


def test_the_stored_form_names_its_key_and_the_cipher_shows_no_key() -> None:
    old, new = generate_key(), generate_key()
    c = TokenCipher.from_texts([new, old])
    sealed = c.encrypt("tok", A)
    assert stored_key_id(sealed) == c.primary_id == TokenCipher.from_texts([new]).primary_id
    assert stored_key_id("plain-token") is None and stored_key_id("v1.nothex!.x") is None
    assert stored_key_id("v2.nothex!.x") is None and stored_key_id("v3.0123abcd.x") is None
    assert c.key_ids == {c.primary_id, TokenCipher.from_texts([old]).primary_id}
    assert new not in repr(c) and old not in repr(c) and c.primary_id in repr(c)


def test_every_seal_of_the_same_token_is_different() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = {c.encrypt("same", A) for _ in range(1000)}
    assert len(sealed) == 1000 and {c.decrypt(s, A) for s in sealed} == {"same"}
