"""A deterministic synthetic population: providers, consents and user-call history.

Everything comes from one ``numpy.random.default_rng(seed)`` and the given ``today``, so the
same arguments write byte-identical files. The files are the loaders' own formats and are
loaded through the same validated path as an operator's files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.ext.asyncio import AsyncEngine

from batch.clock import KST
from batch.config import ORG_CODE_RE
from batch.config import load_institutions as read_institutions_file
from batch.crypto import TokenCipher
from batch.db.loaders import load_consents, load_institutions, load_usage
from batch.db.tokens import check_tokens
from batch.seed_usage import usage_series
from planning.calendar import week_start
from planning.windows import MINUTES_PER_DAY, Window, day_minutes, parse_windows

#: Industry of the i-th provider (cycled), with the org-code prefix it gets.
INDUSTRIES = ("bank", "card", "invest", "insu", "capital", "efin", "telecom", "ginsu", "p2p",
              "bond", "usury")
_PREFIX = {"bank": "BANK", "card": "CARD", "invest": "INVS", "insu": "INSU",
           "capital": "CAPT", "efin": "EFIN", "telecom": "TELC", "ginsu": "GINS",
           "p2p": "P2PL", "bond": "BOND", "usury": "USRY"}
#: Shares of consents: never fetched yet (new), last fetched two or more weeks ago.
NEW_SHARE = 0.05
BACKLOG_SHARE = 0.03
#: Share of consents already fetched this week, per day of the week already past: a steady
#: state, the regular consents (neither new nor in the backlog) fetched a seventh a day. On a
#: Saturday the week's last day holds a seventh of them, not three quarters (0.04 a day
#: before: the demo's two-minute window could not hold a Saturday's work, and it failed).
DONE_PER_DAY = (1.0 - NEW_SHARE - BACKLOG_SHARE) / 7
_DAY = 86_400
_HALF_HOUR = 30


@dataclass(frozen=True, slots=True)
class SeedParams:
    """What to generate; ``today`` is the KST date the population is 'as of'."""

    today: date
    providers: int = 5
    consents: int = 20_000
    weeks: int = 8
    seed: int = 42
    base_port: int = 19001
    operator_org_code: str = "OPERATOR01"

    def __post_init__(self) -> None:
        if not 1 <= self.providers <= 999_999:
            raise ValueError("providers must be between 1 and 999999")
        if not 0 <= self.consents <= 50_000_000:
            raise ValueError("consents must be between 0 and 50000000")
        if not 1 <= self.weeks <= 520:
            raise ValueError("weeks must be between 1 and 520")
        if not (self.base_port >= 1 and self.base_port + self.providers - 1 <= 65535):
            raise ValueError("base_port + providers must stay within 1..65535")
        if not ORG_CODE_RE.match(self.operator_org_code):
            raise ValueError("operator_org_code must be exactly 10 letters or digits")


@dataclass(frozen=True, slots=True)
class SeedProvider:
    """One generated provider and how its consents stand this week."""

    org_code: str
    industry: str
    base_url: str
    windows: tuple[str, ...]
    calls_per_second: int
    max_concurrency: int
    consents: int = 0
    due_this_week: int = 0
    never_fetched: int = 0
    backlog: int = 0


@dataclass(frozen=True, slots=True)
class SeedFiles:
    """The three files written, in the loaders' formats."""

    institutions: Path
    consents: Path
    usage: Path


@dataclass(frozen=True, slots=True)
class SeedResult:
    """What was written: the files and per-provider figures for the summary."""

    files: SeedFiles
    providers: tuple[SeedProvider, ...]
    consents: int
    usage_rows: int
    first_usage_day: date
    last_usage_day: date


def _windows(rng: np.random.Generator) -> tuple[str, ...]:
    """1-3 windows in 30-minute steps, >= 6 h together: a long night one plus short extras."""
    while True:
        k = int(rng.choice([1, 2, 3], p=[0.35, 0.45, 0.20]))
        start = int(rng.integers(-4, 4)) * _HALF_HOUR            # 22:00 .. 01:30
        steps = int(rng.integers(12, 17)) if k == 1 else int(rng.integers(7, 12))
        spans = [(start % MINUTES_PER_DAY, (start + steps * _HALF_HOUR) % MINUTES_PER_DAY)]
        slots = [(12 * 60, 16 * 60), (17 * 60, 20 * 60)]        # afternoon, early evening
        for lo, hi in slots[: k - 1]:
            s = lo + int(rng.integers(0, (hi - lo) // _HALF_HOUR)) * _HALF_HOUR
            spans.append((s, min(hi, s + int(rng.integers(2, 5)) * _HALF_HOUR)))
        texts = tuple(str(Window(s, e or MINUTES_PER_DAY)) for s, e in spans)
        try:
            parse_windows(texts)
        except ValueError:
            continue
        return texts


def make_providers(rng: np.random.Generator, params: SeedParams) -> list[SeedProvider]:
    out = []
    for i in range(params.providers):
        industry = INDUSTRIES[i % len(INDUSTRIES)]
        out.append(SeedProvider(
            org_code=f"{_PREFIX[industry]}{i + 1:06d}",
            industry=industry,
            base_url=f"http://127.0.0.1:{params.base_port + i}",
            windows=_windows(rng),
            calls_per_second=int(rng.integers(5, 31)) * 10,
            max_concurrency=int(rng.integers(20, 61)),
        ))
    return out


def _iso(seconds: NDArray[np.int64]) -> NDArray[np.str_]:
    """KST wall-clock seconds since 1970-01-01 as 'YYYY-MM-DDTHH:MM:SS+09:00'."""
    text = np.datetime_as_string(seconds.astype("datetime64[s]"), unit="s")
    return np.char.add(text, "+09:00")


def _local_seconds(day: date) -> int:
    return (day - date(1970, 1, 1)).days * _DAY


def write_consents(rng: np.random.Generator, params: SeedParams,
                   providers: list[SeedProvider], path: Path) -> list[SeedProvider]:
    """Write the consents CSV; returns the providers with their consent figures filled in."""
    n = params.consents
    weights = 1.0 / np.arange(1, len(providers) + 1) ** 0.9
    counts = rng.multinomial(n, rng.permutation(weights / weights.sum()))
    n_users = max(1, math.ceil(n / 1.7), math.ceil(int(counts.max(initial=0)) * 1.25))
    today0 = _local_seconds(params.today)
    week0 = _local_seconds(week_start(params.today))
    days_past = (today0 - week0) // _DAY
    done_share = DONE_PER_DAY * days_past
    tokens = rng.bytes(n * 40).hex()
    out: list[SeedProvider] = []
    row = 0
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write("user_id,org_code,access_token,consented_at,last_scheduled_at,refresh_token\n")
        for p, count in zip(providers, counts.tolist(), strict=True):
            users = np.sort(rng.choice(n_users, size=count, replace=False))
            minutes = np.asarray(day_minutes(parse_windows(p.windows)), dtype=np.int64)
            u = rng.random(count)
            new = u < NEW_SHARE
            backlog = (u >= NEW_SHARE) & (u < NEW_SHARE + BACKLOG_SHARE)
            done = (u >= NEW_SHARE + BACKLOG_SHARE) & (u < NEW_SHARE + BACKLOG_SHARE
                                                        + done_share)
            # Day of the last transfer, relative to this week's Sunday; time inside a window.
            day = rng.integers(-7, 0, size=count)                      # last week: due now
            day = np.where(backlog, rng.integers(-35, -13, size=count), day)
            day = np.where(done, rng.integers(0, max(days_past, 1), size=count), day)
            at = (week0 + day * _DAY + rng.choice(minutes, size=count) * 60
                  + rng.integers(0, 60, size=count))
            consented = at - rng.integers(_DAY, 400 * _DAY, size=count)
            fresh = today0 - rng.integers(3600, 3 * _DAY, size=count)
            consented = np.where(new, fresh, consented)
            c_text = _iso(consented).tolist()
            l_text = np.where(new, "", _iso(at)).tolist()
            code = p.org_code
            lines = []
            for i, uid in enumerate(users.tolist()):
                k = (row + i) * 80
                lines.append(f"U{uid:08d},{code},AT{tokens[k:k + 40]},{c_text[i]},{l_text[i]},"
                             f"RT{tokens[k + 40:k + 80]}\n")
            f.writelines(lines)
            row += count
            out.append(SeedProvider(
                org_code=p.org_code, industry=p.industry, base_url=p.base_url,
                windows=p.windows, calls_per_second=p.calls_per_second,
                max_concurrency=p.max_concurrency, consents=count,
                due_this_week=count - int(done.sum()), never_fetched=int(new.sum()),
                backlog=int(backlog.sum()),
            ))
    return out


def write_institutions(params: SeedParams, providers: list[SeedProvider], path: Path) -> None:
    parts = ["# Synthetic providers written by `mydata-batch seed`.\n",
             f"operator_org_code = {json.dumps(params.operator_org_code)}\n"]
    for p in providers:
        parts.append(
            f"\n[[providers]]\norg_code = {json.dumps(p.org_code)}\n"
            f"industry = {json.dumps(p.industry)}\nbase_url = {json.dumps(p.base_url)}\n"
            f"windows = [{', '.join(json.dumps(w) for w in p.windows)}]\n"
            f"calls_per_second = {p.calls_per_second}\nmax_concurrency = {p.max_concurrency}\n")
    path.write_text("".join(parts), encoding="utf-8")


def write_usage(rng: np.random.Generator, params: SeedParams, providers: list[SeedProvider],
                path: Path) -> tuple[int, date, date]:
    """Daily user calls for ``weeks`` weeks up to yesterday; returns rows, first, last day."""
    first = params.today - timedelta(days=7 * params.weeks)
    days = [first + timedelta(days=i) for i in range(7 * params.weeks)]
    rows = 0
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write("org_code,date,user_calls\n")
        for p in providers:
            calls = usage_series(rng, p.industry, p.consents, days)
            f.writelines(f"{p.org_code},{d.isoformat()},{c}\n"
                         for d, c in zip(days, calls.tolist(), strict=True))
            rows += len(days)
    return rows, days[0], days[-1]


def write_seed(params: SeedParams, out_dir: str | Path) -> SeedResult:
    """Generate the population and write the three files into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = SeedFiles(out / "institutions.toml", out / "consents.csv", out / "usage.csv")
    rng = np.random.default_rng(params.seed)
    providers = make_providers(rng, params)
    write_institutions(params, providers, files.institutions)
    providers = write_consents(rng, params, providers, files.consents)
    rows, first, last = write_usage(rng, params, providers, files.usage)
    return SeedResult(files=files, providers=tuple(providers), consents=params.consents,
                      usage_rows=rows, first_usage_day=first, last_usage_day=last)


async def load_seed(engine: AsyncEngine, files: SeedFiles, *, now: datetime,
                    cipher: TokenCipher, replace: bool = False) -> tuple[int, int, int]:
    """Load the written files through the validated loaders; (institutions, consents, usage).

    ``replace``: the seed's providers take the place of those loaded before (the others are
    retired) and its operator org code replaces the stored one. The consents' tokens are
    stored sealed with ``cipher`` (the CSV holds them plain, as an operator's file does).
    """
    await check_tokens(engine, cipher)  # a wrong key: refused before the institutions load
    insts = read_institutions_file(files.institutions)
    n_inst = await load_institutions(engine, insts, now=now, retire_missing=replace,
                                     change_operator=replace)
    n_cons = await load_consents(engine, files.consents, now=now, cipher=cipher)
    n_usage = await load_usage(engine, files.usage, now=now)
    return n_inst, n_cons, n_usage


def load_time(today: date, now: datetime) -> datetime:
    """The 'now' to load a population as of ``today``: the later of ``now`` and its start."""
    start = datetime.combine(today, time(0), KST)
    return max(now, start)
