"""``mydata-batch circuit``: the cluster circuit of each provider, and operator overrides.

    mydata-batch --redis URL circuit                       # each provider: state, why, since
    mydata-batch --redis URL circuit open ORG --reason ... # forced open (no calls, no probes)
    mydata-batch --redis URL circuit close ORG --reason ...# forced closed (never opened)
    mydata-batch --redis URL circuit auto ORG --reason ... # back to the coordinator's verdict

Overrides are written to Redis (workers apply them at their next read of the list, the
coordinator respects them) and recorded in ``circuit_events`` with the reason and who.
"""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime
from typing import Any

import click

from batch.cli import Settings, main, run_async
from batch.clock import KST
from batch.errors import DatabaseError, InputError, describe

_FORCE = {"open": "forced_open", "close": "forced_closed"}


def _redis_url(settings: Settings) -> str:
    if not settings.redis_url:
        raise click.UsageError("the cluster circuit lives in Redis: give --redis URL "
                               "(env MYDATA_REDIS_URL)")
    return settings.redis_url


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).astimezone(KST).strftime("%Y-%m-%d %H:%M:%S")


async def _rows(settings: Settings) -> dict[str, Any]:
    """Each provider's cluster state (known providers first), the coordinator, overrides."""
    from redis.asyncio import Redis

    from batch.cluster.circuit import CircuitSettings
    from batch.cluster.circuit_redis import CircuitStore
    from batch.db.engine import make_engine
    from batch.db.loaders import read_institutions
    from batch.errors import ConfigError

    engine = make_engine(settings.db_url)
    try:
        try:
            known = [p.org_code for p in (await read_institutions(engine)).providers]
        except ConfigError:
            known = []
    finally:
        await engine.dispose()
    r = Redis.from_url(_redis_url(settings), socket_connect_timeout=3, socket_timeout=3)
    try:
        store = CircuitStore(r, settings=CircuitSettings())
        view = await store.read_view()
    except Exception as exc:
        raise DatabaseError(f"Redis unreachable: {describe(exc)}") from None
    finally:
        await r.aclose()
    providers = []
    for org in [*known, *sorted(set(view.states) | set(view.forced) - set(known))]:
        s = view.states.get(org)
        f = view.forced.get(org)
        state = str(f.state) if f else str(s.state) if s else "closed"
        reason = (f"forced by {f.actor or 'operator'}: {f.reason}" if f
                  else s.reason if s else "no calls seen yet")
        since = f.since if f else s.since if s else None
        providers.append({
            "org_code": org, "state": state, "reason": reason,
            "since": _when(since) if since is not None else None,
            "failure_rate": s.failure_rate if s else None,
            "slow_rate": s.slow_rate if s else None,
            "calls_in_window": s.calls if s else None})
    beat_age = round(view.now - view.beat_at, 1) if view.beat_at is not None else None
    return {"coordinator": view.leader, "beat_age_s": beat_age, "providers": providers}


@main.group("circuit", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def circuit_cmd(ctx: click.Context, as_json: bool) -> None:
    """The cluster circuit: each provider's state, why and since when (KST).

    Subcommands force one provider open or closed, or back to automatic, with a reason.
    """
    if ctx.invoked_subcommand is not None:
        return
    settings: Settings = ctx.obj
    doc = run_async(_rows(settings))
    if as_json:
        click.echo(json.dumps(doc))
        return
    leader = doc["coordinator"]
    age = doc["beat_age_s"]
    click.echo(f"coordinator: {leader.split(':', 1)[-1] if leader else 'none'}"
               + (f" (generation {leader.split(':', 1)[0]}, last tick {age} s ago)"
                  if leader and age is not None else ""))
    for p in doc["providers"]:
        rate = (f"  failures {p['failure_rate'] * 100:.0f}% of {p['calls_in_window']}"
                if p["calls_in_window"] else "")
        click.echo(f"{p['org_code']:<10}  {p['state']:<13}  since {p['since'] or '-':<19}"
                   f"  {p['reason']}{rate}")


async def _force(settings: Settings, org_code: str, state: str | None, reason: str,
                 actor: str) -> str:
    from redis.asyncio import Redis

    from batch.cluster.circuit import CircuitSettings, CircuitState, Forced
    from batch.cluster.circuit_events import CircuitEvent, record_events
    from batch.cluster.circuit_redis import CircuitStore
    from batch.db.engine import make_engine
    from batch.db.loaders import read_institutions

    engine = make_engine(settings.db_url)
    try:
        known = {p.org_code for p in (await read_institutions(engine)).providers}
        if org_code not in known:
            raise InputError(f"unknown org_code {org_code!r} (known: "
                             f"{', '.join(sorted(known))})")
        r = Redis.from_url(_redis_url(settings), socket_connect_timeout=3, socket_timeout=3)
        try:
            store = CircuitStore(r, settings=CircuitSettings())
            now = await store.server_time()
            if state is None:
                released = await store.release_force(org_code)
                what = "back to automatic" if released else "was not forced; nothing changed"
            else:
                await store.force(org_code, Forced(CircuitState(state), reason, now, actor))
                what = state.replace("_", " ")
        except InputError:
            raise
        except Exception as exc:
            raise DatabaseError(f"Redis unreachable: {describe(exc)}") from None
        finally:
            await r.aclose()
        await record_events(engine, [CircuitEvent(
            at=datetime.fromtimestamp(now, UTC), org_code=org_code,
            state=state or "auto", reason=reason, source="operator", actor=actor)])
    finally:
        await engine.dispose()
    return f"{org_code}: {what} ({reason})"


def _actor() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "operator"


def _force_command(name: str, state: str | None, help_text: str) -> None:
    @circuit_cmd.command(name, help=help_text)
    @click.argument("org_code")
    @click.option("--reason", required=True, help="Why (recorded, shown by `circuit`).")
    @click.option("--by", "actor", default=None, help="Who (default: the login name).")
    @click.pass_obj
    def cmd(settings: Settings, org_code: str, reason: str, actor: str | None) -> None:
        if not reason.strip():
            raise click.UsageError("--reason must say why")
        click.echo(run_async(_force(settings, org_code, state, reason.strip(),
                                    actor or _actor())))


_force_command("open", _FORCE["open"],
               "Force ORG_CODE's circuit open: no calls and no probes until `auto`.")
_force_command("close", _FORCE["close"],
               "Force ORG_CODE's circuit closed: the coordinator never opens it until `auto`.")
_force_command("auto", None,
               "Release an override: the coordinator decides ORG_CODE's circuit again.")
