"""The run-health section of the page, pure: a :class:`RunHealth` in, escaped HTML/SVG out.

Per provider: planned vs started per minute, outcome classes per minute, the breaker's state
over time, retry and max-attempt ratios, p99 latency and slice lateness; then the dead-letter
queue with ages and the consents overdue. Inline SVG only (the page's CSP allows no script).
"""

from __future__ import annotations

from collections.abc import Sequence

from batch.dashboard.health_data import RunHealth
from batch.dashboard.health_figures import (
    ProviderHealth,
    outcome_series,
    ratio_series,
    totals,
)
from batch.dashboard.render import (
    BAD,
    BATCH_DONE,
    BATCH_PLANNED,
    GOOD,
    MUTED,
    USER,
    WARN,
    _nice_ceiling,
    esc,
    num,
    short,
)
from batch.observe.minutes import MinuteRow
from planning.calendar import KST

KIND_COLOURS = {"success": GOOD, "fault": BAD, "timeout": WARN, "throttled": "#8e44ad",
                "consent": USER, "client": "#7f1d1d", "rejected": MUTED}
STATE_COLOURS = {"closed": GOOD, "half_open": WARN, "open": BAD, "forced_open": BAD,
                 "disabled": MUTED, "metrics_only": MUTED}
Series = tuple[str, str, Sequence[float | None]]
W, H = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 16, 30


def _frame(title: str, labels: Sequence[str], ymax: float, unit: str) -> list[str]:
    plot_h = H - TOP - BOTTOM
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'viewBox="0 0 {W} {H}" role="img" aria-label="{esc(title)}" class="chart">',
             f"<title>{esc(title)}</title>"]
    for i in range(3):
        v = ymax * i / 2
        y = TOP + plot_h - plot_h * v / ymax
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#e5e7eb"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{y + 3:.1f}" '
                     f'text-anchor="end">{esc(short(v) if ymax >= 10 else f"{v:.2g}")}</text>')
    parts.append(f'<text class="axis" x="4" y="{TOP - 5}">{esc(unit)}</text>')
    if labels:
        step = max(1, len(labels) // 8)
        slot = (W - LEFT - RIGHT) / len(labels)
        for i in range(0, len(labels), step):
            parts.append(f'<text class="axis" x="{LEFT + (i + 0.5) * slot:.1f}" '
                         f'y="{H - BOTTOM + 14}" text-anchor="middle">{esc(labels[i])}</text>')
    return parts


def bars(title: str, labels: Sequence[str], stacks: Sequence[Series], unit: str, *,
         side_by_side: bool = False) -> str:
    """Bars per minute: stacked (outcome classes) or side by side (planned vs started)."""
    n = max(len(labels), 1)
    if side_by_side:
        top = max([v or 0.0 for _, _, vs in stacks for v in vs] + [0.0])
    else:
        top = max([sum(vs[i] or 0.0 for _, _, vs in stacks) for i in range(len(labels))]
                  + [0.0])
    ymax = _nice_ceiling(top * 1.05)
    parts = _frame(title, labels, ymax, unit)
    plot_h = H - TOP - BOTTOM
    slot = (W - LEFT - RIGHT) / n
    width = slot * (0.8 / len(stacks) if side_by_side else 0.8)
    for i, label in enumerate(labels):
        base = 0.0
        tip = ", ".join(f"{name} {num(vs[i])}" for name, _, vs in stacks)
        parts.append(f"<g><title>{esc(label)}: {esc(tip)}</title>")
        for j, (_name, colour, vs) in enumerate(stacks):
            v = vs[i] or 0.0
            if v <= 0:
                continue
            x = LEFT + i * slot + slot * 0.1 + (j * width if side_by_side else 0.0)
            h = plot_h * v / ymax
            y0 = TOP + plot_h - plot_h * (0.0 if side_by_side else base) / ymax
            parts.append(f'<rect x="{x:.1f}" y="{y0 - h:.1f}" width="{max(width, 1):.1f}" '
                         f'height="{h:.1f}" fill="{colour}"/>')
            base += v
        parts.append("</g>")
    parts.append(_legend_svg(stacks))
    parts.append("</svg>")
    return "".join(parts)


def lines(title: str, labels: Sequence[str], series: Sequence[Series], unit: str) -> str:
    """One polyline per series; a minute without a value breaks the line."""
    top = max([v for _, _, vs in series for v in vs if v is not None] + [0.0])
    ymax = _nice_ceiling(top * 1.1) if top >= 1 else max(0.01, round(top * 1.2, 3) or 0.01)
    parts = _frame(title, labels, ymax, unit)
    plot_h = H - TOP - BOTTOM
    slot = (W - LEFT - RIGHT) / max(len(labels), 1)
    for name, colour, vs in series:
        run: list[str] = []
        segments: list[list[str]] = [run]
        for i, v in enumerate(vs):
            if v is None:
                run = []
                segments.append(run)
                continue
            run.append(f"{LEFT + (i + 0.5) * slot:.1f},{TOP + plot_h - plot_h * v / ymax:.1f}")
        for seg in segments:
            if len(seg) == 1:
                x, y = seg[0].split(",")
                parts.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}">'
                             f"<title>{esc(name)}</title></circle>")
            elif seg:
                parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                             f'points="{" ".join(seg)}"><title>{esc(name)}</title></polyline>')
    parts.append(_legend_svg(series))
    parts.append("</svg>")
    return "".join(parts)


def state_strip(title: str, labels: Sequence[str], states: Sequence[str]) -> str:
    """The breaker's worst state in each minute, as one coloured cell per minute."""
    h = 46
    slot = (W - LEFT - RIGHT) / max(len(labels), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" '
             f'viewBox="0 0 {W} {h}" role="img" aria-label="{esc(title)}" class="chart">',
             f"<title>{esc(title)}</title>",
             f'<text class="axis" x="{LEFT - 6}" y="18" text-anchor="end">breaker</text>']
    for i, (label, state) in enumerate(zip(labels, states, strict=True)):
        parts.append(f'<rect x="{LEFT + i * slot:.1f}" y="6" width="{max(slot - 1, 1):.1f}" '
                     f'height="18" fill="{STATE_COLOURS.get(state, MUTED)}">'
                     f"<title>{esc(label)}: {esc(state)}</title></rect>")
    x = LEFT
    for state in dict.fromkeys(states):
        parts.append(f'<rect x="{x}" y="32" width="9" height="9" '
                     f'fill="{STATE_COLOURS.get(state, MUTED)}"/>'
                     f'<text x="{x + 12}" y="40">{esc(state)}</text>')
        x += 16 + 7 * len(state)
    parts.append("</svg>")
    return "".join(parts)


def _legend_svg(series: Sequence[Series]) -> str:
    x = float(LEFT)
    out = []
    for name, colour, _ in series:
        out.append(f'<rect x="{x:.0f}" y="{H - 11}" width="9" height="9" fill="{colour}"/>'
                   f'<text x="{x + 12:.0f}" y="{H - 3}">{esc(name)}</text>')
        x += 20 + 6.5 * len(name)
    return "".join(out)


def _label(row: MinuteRow) -> str:
    return row.minute_at.astimezone(KST).strftime("%H:%M")


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f} %"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:,.1f} ms"


def totals_table(rows: Sequence[ProviderHealth]) -> str:
    body = "".join(
        f"<tr><td>{esc(p.org_code)}</td><td class=n>{esc(num(p.planned))}</td>"
        f"<td class=n>{esc(num(p.started))}</td><td class=n>{esc(num(p.calls))}</td>"
        f"<td class=n>{esc(_pct(p.retry_ratio))}</td>"
        f"<td class=n>{esc(_pct(p.max_attempt_ratio))}</td>"
        f"<td class=n>{esc(num(p.timeouts))}</td><td class=n>{esc(_ms(p.p99_latency_ms))}</td>"
        f"<td class=n>{esc(_ms(p.lateness_p99_ms))}</td>"
        f"<td class=n>{esc(f'{p.open_minutes:.1f}')}</td></tr>" for p in rows)
    return ("<table id=\"run-health-totals\"><thead><tr><th>Provider</th>"
            "<th class=n>Planned</th><th class=n>Started</th><th class=n>Calls</th>"
            "<th class=n>Retried</th><th class=n>Used every attempt</th>"
            "<th class=n>Unknown outcome</th><th class=n>p99 latency (worst minute)</th>"
            "<th class=n>Slice lateness p99</th><th class=n>Breaker open (min)</th>"
            f"</tr></thead><tbody>{body}</tbody></table>")


def _figure(caption: str, chart: str) -> str:
    return (f'<figure style="margin:8px 0 4px"><figcaption class="muted">{esc(caption)}'
            f"</figcaption>{chart}</figure>")


def provider_charts(org: str, rows: Sequence[MinuteRow]) -> str:
    labels = [_label(r) for r in rows]
    retry, maxed = ratio_series(rows)
    kinds = outcome_series(rows)
    charts = [
        bars(f"{org}: planned vs started per minute", labels,
             [("planned", BATCH_PLANNED, [float(r.planned) for r in rows]),
              ("started", BATCH_DONE, [float(r.started) for r in rows])], "refreshes",
             side_by_side=True),
        bars(f"{org}: calls per minute by outcome class", labels,
             [(k, KIND_COLOURS.get(k, MUTED), [float(v) for v in vs])
              for k, vs in kinds.items()], "calls"),
        state_strip(f"{org}: breaker state per minute", labels,
                    [r.breaker_state for r in rows]),
        lines(f"{org}: retry and max-attempt ratios per minute", labels,
              [("retried", WARN, retry), ("used every attempt", BAD, maxed)], "ratio"),
        lines(f"{org}: p99 call latency per minute", labels,
              [("call p99 (ms)", USER, [r.latency_p99_ms for r in rows])], "ms"),
        lines(f"{org}: p99 slice lateness per minute", labels,
              [("slice lateness p99 (ms)", BATCH_DONE, [r.lateness_p99_ms for r in rows])],
              "ms")]
    captions = ("Planned vs started per minute", "Calls per minute by outcome class",
                "Breaker state per minute", "Retry and max-attempt ratios per minute",
                "p99 call latency per minute (end to end, all attempts)",
                "p99 slice lateness per minute (how late each 100 ms slice started)")
    return "".join([
        f'<details open class="run-health" data-provider="{esc(org)}"><summary>{esc(org)}'
        "</summary>", *(_figure(c, chart) for c, chart in zip(captions, charts, strict=True)),
        "</details>"])


def backlog_html(health: RunHealth) -> str:
    s = health.state
    orgs = sorted(set(s.dead_letters) | set(s.overdue))
    if not orgs:
        return '<p class="muted" id="backlog">No open dead letters, no consent overdue.</p>'
    body = "".join(
        f"<tr><td>{esc(org)}</td><td class=n>{esc(num(s.dead_letters.get(org, 0)))}</td>"
        f"<td class=n>{esc(_age(s.dead_letter_oldest_age.get(org)))}</td>"
        f"<td class=n>{esc(num(s.overdue.get(org, 0)))}</td></tr>" for org in orgs)
    return ('<table id="backlog"><thead><tr><th>Provider</th><th class=n>Dead letters open</th>'
            "<th class=n>Oldest age</th><th class=n>Consents overdue (past their week)</th>"
            f"</tr></thead><tbody>{body}</tbody></table>")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def run_health_section(health: RunHealth) -> str:
    """The whole section; says so plainly when no run has written minutes that day."""
    head = '<section id="run-health"><h2>Run health per provider, per minute</h2>'
    if not health.minutes:
        body = (f'<p class="muted">No run wrote per-minute health on {esc(health.day)} '
                "(<code>mydata-batch run</code> writes it once a minute).</p>")
    else:
        orgs = health.providers()
        body = "".join([
            f'<p class="muted">Run <code>{esc(health.run_id)}</code>. Times in KST.</p>',
            totals_table([totals(o, health.of(o)) for o in orgs]),
            '<div class="grid">',
            *(provider_charts(o, health.of(o)) for o in orgs),
            "</div>"])
    return "".join([head, body, "<h3>Backlog: dead letters (with ages) and overdue consents"
                    "</h3>", backlog_html(health), "</section>"])
