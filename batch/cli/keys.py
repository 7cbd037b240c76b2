"""``mydata-batch keys``: make a token key, and re-seal every stored token with the first."""

from __future__ import annotations

import click

from batch.cli import Settings, main, with_engine
from batch.cli.options import token_cipher
from batch.crypto import generate_key


@main.group("keys")
def keys_group() -> None:
    """Token encryption keys (access and refresh tokens are sealed at rest).

    \b
    The keys come from MYDATA_TOKEN_KEYS (comma-separated) or MYDATA_TOKEN_KEY_FILE (one
    a line); the first seals new tokens, the others still open old ones. To rotate: put a
    new key first, keep the old ones after it, run `keys rotate`, then drop the old ones.
    """


@keys_group.command("generate")
def keys_generate() -> None:
    """Print a new random key (32 bytes, urlsafe base64): put it in MYDATA_TOKEN_KEYS or a
    line of the MYDATA_TOKEN_KEY_FILE file, and keep it as safe as the database."""
    click.echo(generate_key())


@keys_group.command("rotate")
@click.option("--accept-v1", is_flag=True,
              help="Seal v1 tokens found after a rotation bound every token (refused "
                   "otherwise: put back from an older copy, or moved from another row); "
                   "only if you know they are genuine.")
@click.pass_obj
def keys_rotate(settings: Settings, accept_v1: bool) -> None:
    """Re-seal every stored token with the first key (MYDATA_TOKEN_KEYS or
    MYDATA_TOKEN_KEY_FILE), bound to its consent row and column (v2); v1 tokens (not
    bound) and tokens stored in plain text by an older version are sealed as v2 too.

    \b
    Every key that sealed a stored token must be in the list (checked first: nothing is
    written otherwise). A chunk of consents per transaction: stopped part way, run it again.
    Safe while `run` is going (a token it refreshes meanwhile is left as it saved it).
    Once every token is bound, that is recorded, and a v1 token that turns up afterwards
    is refused by every command (see --accept-v1).
    """
    from batch.db.tokens import reseal_all

    cipher = token_cipher()
    done = with_engine(settings, lambda e: reseal_all(e, cipher, accept_unbound=accept_v1))
    line = (f"re-sealed the tokens of {done.resealed} of {done.seen} consent(s) with key "
            f"{cipher.primary_id}")
    if done.skipped:
        line += (f"; {done.skipped} changed meanwhile (a running batch saved a new token): "
                 "run `keys rotate` again once it is done")
    elif done.bound:
        line += "; every token is bound to its row: a v1 token found from now on is refused"
    click.echo(line)
