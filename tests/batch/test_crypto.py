from __future__ import annotations

from pathlib import Path

import pytest

from batch.crypto import (
    KEY_FILE_ENV,
    KEYS_ENV,
    TokenCipher,
    TokenKeyError,
    generate_key,
    stored_key_id,
)


def test_a_sealed_token_opens_and_never_contains_the_plain_text() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = c.encrypt("tok-secret-123")
    assert "tok-secret-123" not in sealed
    assert c.decrypt(sealed) == "tok-secret-123"
    assert c.encrypt("tok-secret-123") != sealed  # a fresh nonce each time


def test_rotation_opens_old_rows_and_reseals_them_with_the_first_key() -> None:
    old, new = generate_key(), generate_key()
    sealed_old = TokenCipher.from_texts([old]).encrypt("t1")
    both = TokenCipher.from_texts([new, old])
    assert both.decrypt(sealed_old) == "t1"
    assert not both.is_current(sealed_old)
    resealed = both.reseal(sealed_old)
    assert both.is_current(resealed)
    assert TokenCipher.from_texts([new]).decrypt(resealed) == "t1"


def test_reseal_seals_a_plain_text_legacy_token() -> None:
    c = TokenCipher.from_texts([generate_key()])
    assert c.decrypt(c.reseal("legacy-plain")) == "legacy-plain"


def test_a_wrong_key_is_one_clear_error_naming_the_key_id() -> None:
    sealed = TokenCipher.from_texts([generate_key()]).encrypt("t")
    other = TokenCipher.from_texts([generate_key()])
    with pytest.raises(TokenKeyError, match=r"sealed with key [0-9a-f]{8}, which is not in"):
        other.decrypt(sealed)


def test_a_tampered_token_does_not_open() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = c.encrypt("token")
    flipped = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    with pytest.raises(TokenKeyError, match="does not open"):
        c.decrypt(flipped)


def test_plain_text_is_refused_on_read() -> None:
    with pytest.raises(TokenKeyError, match="not encrypted"):
        TokenCipher.from_texts([generate_key()]).decrypt("plain-token")


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
    assert c.is_current(c.encrypt("x"))
    assert TokenCipher.from_texts([k1]).decrypt(c.encrypt("x")) == "x"


def test_the_stored_form_names_its_key_and_the_cipher_shows_no_key() -> None:
    old, new = generate_key(), generate_key()
    c = TokenCipher.from_texts([new, old])
    sealed = c.encrypt("tok")
    assert stored_key_id(sealed) == c.primary_id == TokenCipher.from_texts([new]).primary_id
    assert stored_key_id("plain-token") is None and stored_key_id("v1.nothex!.x") is None
    assert c.key_ids == {c.primary_id, TokenCipher.from_texts([old]).primary_id}
    assert new not in repr(c) and old not in repr(c) and c.primary_id in repr(c)
    assert c.encrypt_optional(None) is None and c.decrypt_optional(None) is None
    assert c.decrypt_optional(c.encrypt_optional("r")) == "r"


def test_every_seal_of_the_same_token_is_different() -> None:
    c = TokenCipher.from_texts([generate_key()])
    sealed = {c.encrypt("same") for _ in range(1000)}
    assert len(sealed) == 1000 and {c.decrypt(s) for s in sealed} == {"same"}
