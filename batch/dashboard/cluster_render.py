"""The cluster section of the page, pure: a :class:`ClusterState` in, escaped HTML out."""

from __future__ import annotations

from datetime import datetime

from batch.dashboard.cluster_data import ClusterState
from batch.dashboard.cluster_figures import probe_worker_ids, worker_lines
from batch.dashboard.render import BAD, GOOD, MUTED, WARN, esc
from planning.calendar import KST

STATE_COLOURS = {"closed": GOOD, "open": BAD, "forced_open": BAD, "forced_closed": WARN,
                 "auto": MUTED}
STATUS_COLOURS = {"live": GOOD, "dead": BAD, "stopped": MUTED}


def _t(value: object) -> str:
    if isinstance(value, datetime):
        return value.astimezone(KST).strftime("%m-%d %H:%M:%S")
    return "-"


def cluster_section(state: ClusterState) -> str:
    """Workers (live, dead, stopped; the probe workers marked) and each provider's cluster
    circuit: state, why, since when; then the latest circuit events."""
    lines = worker_lines(state)
    probes = probe_worker_ids(lines)
    parts = ['<section id="cluster"><h2>Cluster: workers and circuits</h2>']
    if not lines:
        parts.append('<p class="muted">No worker has registered yet.</p>')
    else:
        parts.append("<table><thead><tr><th>node</th><th>worker</th><th>host</th>"
                     "<th>status</th><th>started (KST)</th><th>last heartbeat</th>"
                     "</tr></thead><tbody>")
        for ln in lines:
            colour = STATUS_COLOURS.get(ln.status, MUTED)
            probe = " (probe worker)" if ln.worker_id in probes else ""
            parts.append(
                f"<tr><td>{esc(ln.node_id)}</td><td>{esc(ln.worker_id)}{esc(probe)}</td>"
                f"<td>{esc(ln.host)}</td>"
                f'<td style="color:{colour}">{esc(ln.status)}</td>'
                f"<td>{esc(_t(ln.started_at))}</td><td>{esc(f'{ln.last_seen_s:.0f}')} s ago"
                "</td></tr>")
        parts.append("</tbody></table>")
    parts.append("<h3>Cluster circuit per provider</h3>")
    if not state.circuits:
        parts.append('<p class="muted">No cluster circuit event recorded (every provider '
                     "closed, or cluster mode never ran).</p>")
    else:
        parts.append("<table><thead><tr><th>provider</th><th>state</th><th>since (KST)</th>"
                     "<th>why</th><th>by</th></tr></thead><tbody>")
        for org, e in sorted(state.circuits.items()):
            colour = STATE_COLOURS.get(e.state, MUTED)
            parts.append(f"<tr><td>{esc(org)}</td>"
                         f'<td style="color:{colour}">{esc(e.state)}</td>'
                         f"<td>{esc(_t(e.at))}</td><td>{esc(e.reason)}</td>"
                         f"<td>{esc(e.source)} {esc(e.actor)}</td></tr>")
        parts.append("</tbody></table>")
        parts.append("<h3>Latest circuit events</h3><ul>")
        for e in state.events:
            parts.append(f"<li>{esc(_t(e.at))} {esc(e.org_code)} {esc(e.state)}: "
                         f"{esc(e.reason)} ({esc(e.source)} {esc(e.actor)})</li>")
        parts.append("</ul>")
    parts.append("</section>")
    return "".join(parts)
