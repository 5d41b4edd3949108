"""What ``ragwatch status`` draws: rich renderables from a status dict (pure, no Redis).

:func:`render` lays out the sections: alerts with their hints first (what needs a human,
even when ``--watch`` crops a small terminal), hosts, GPUs, service instances, silences,
the notifier and the workers. Every string comes from labels and names that agents and
services chose, so it goes through :func:`clean` (control characters, e.g. terminal
escapes, are made visible) into a :class:`~rich.text.Text`, never through rich markup.
Missing fields show as ``-``.

>>> from rich.console import Console
>>> console = Console(width=100, markup=False, highlight=False)
>>> console.print(render({"alerts": [{"rule": "X", "status": "firing"}]}, 0.0))
ragwatch status  1970-01-01 00:00 UTC
<BLANKLINE>
ALERTS (1 firing, 0 pending)
  FIRING   ?        X    since -
...
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from ragwatch.catalog import LABEL_ORDER

GB = 1e9
MAX_GPU_ROWS = 32  # beyond this, only each host's top GPUs and those with alerts get a row
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_QUANTILE = re.compile(r"^(?P<stage>[a-z0-9_]+?)_p(?P<q>95|99)_ms$")
_NOT_STAGES = ("e2e", "ttft", "queue")
_HIDDEN_LABELS = ("alertname", "severity", "uuid")


# ---------------------------------------------------------------------------- formatting


def clean(value: Any) -> str:
    """``str(value)`` with control characters shown as ``\\xNN`` (no terminal escapes)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _t(value: Any, style: str = "") -> Text:
    return Text(clean(value), style=style)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _fmt(v: Any, spec: str = ".0f", suffix: str = "") -> str:
    n = _num(v)
    return "-" if n is None or not math.isfinite(n) else f"{n:{spec}}{suffix}"


def _gb(v: Any) -> str:
    n = _num(v)
    return "-" if n is None else f"{n / GB:.1f}"


def _hours(v: Any) -> str:
    n = _num(v)
    if n is None or not math.isfinite(n):
        return "-"
    return f"{n / 24:.1f}d" if n >= 48 else f"{n:.1f}h"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.0f}s"


def _when(ts: Any) -> str:
    n = _num(ts)
    return "-" if n is None else datetime.fromtimestamp(n, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _ago(seconds: float) -> str:
    if seconds < 0:
        return "in " + _ago(-seconds).removesuffix(" ago")
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _bar(used: Any, total: Any, width: int, unicode: bool) -> Text:
    u, t = _num(used), _num(total)
    if u is None or not t:
        return Text("-")
    ratio = min(max(u / t, 0.0), 1.0)
    full = round(ratio * width)
    style = "red" if ratio >= 0.95 else "yellow" if ratio >= 0.85 else "green"
    on, off = ("█", "░") if unicode else ("#", ".")
    return Text(on * full, style=style) + Text(off * (width - full), style="dim")


def _gpu_name(g: Mapping[str, Any]) -> str:
    return f"{g.get('index', '?')}" + (f"/{g['mig']}" if g.get("mig") else "")


# ---------------------------------------------------------------------------- sections


_FREE_TEXT = ("TOP GPUS", "ENGINES", "TOP PROCESS", "MATCHERS", "WINDOW", "BY", "COMMENT")


def _table(title: str, *columns: str) -> Table:
    """A borderless table; names, ids and numbers never wrap, free text folds."""
    t = Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for c in columns:
        wrap = c in _FREE_TEXT
        t.add_column(c, no_wrap=not wrap, overflow="fold" if wrap else "ellipsis")
    return t


def _top_gpus(host: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The snapshot's ``top_gpus``, or the same computed from its GPUs (older snapshots)."""
    top = host.get("top_gpus")
    if isinstance(top, dict):
        return {k: [t for t in v if isinstance(t, dict)] for k, v in top.items() if v}
    gpus = [g for g in host.get("gpus") or [] if isinstance(g, dict)]
    out = {}
    for kind, field in (
        ("util", "gpu_util"),
        ("memory", "fb_used_bytes"),
        ("growth", "gb_per_hour"),
    ):
        ranked = sorted(
            (g for g in gpus if _num(g.get(field)) is not None), key=lambda g: -(g[field])
        )
        out[kind] = [{"index": g.get("index"), "mig": g.get("mig"), "value": g[field]}
                     for g in ranked[:3]]  # fmt: skip
    return out


def _top_text(host: Mapping[str, Any]) -> Text:
    """The host's top GPUs: growing ones, the fullest, the busiest."""
    top = _top_gpus(host)
    totals = {_gpu_name(g): _num(g.get("fb_total_bytes")) for g in host.get("gpus") or []}
    parts = []
    growing = [t for t in top.get("growth", []) if (_num(t.get("value")) or 0.0) > 0.05]
    if growing:
        parts.append("growth " + ", ".join(
            f"GPU{_gpu_name(t)} {_fmt(t.get('value'), '+.2f')} GB/h" for t in growing[:2]
        ))  # fmt: skip
    for t in top.get("memory", [])[:1]:
        total, used = totals.get(_gpu_name(t)), _num(t.get("value"))
        if total and used is not None:
            parts.append(f"mem GPU{_gpu_name(t)} {used / total:.0%}")
    for t in top.get("util", [])[:1]:
        if _num(t.get("value")) is not None:
            parts.append(f"util GPU{_gpu_name(t)} {_fmt(t.get('value'), '.0f', '%')}")
    return _t(" · ".join(parts) or "-")


def _engines_text(host: Mapping[str, Any]) -> Text:
    out = []
    for e in host.get("engines") or []:
        sig = e.get("signals") or {}
        tps = _fmt(sig.get("generation_tokens_per_s"), ",.0f")
        fc = _fmt(sig.get("tps_forecast"), ",.0f")
        waiting = _fmt(sig.get("requests_waiting"), ".0f")
        out.append(f"{e.get('target', '?')} {tps} tok/s (fc {fc}) waiting {waiting}")
    return _t("; ".join(out) or "-")


def hosts_table(status: Mapping[str, Any], unicode: bool) -> Table:
    t = _table("HOSTS", "HOST", "GPUS", "MEMORY", "USED/TOTAL GB", "UTIL", "TOP GPUS", "ENGINES")
    for h in status.get("hosts") or []:
        gpus = [g for g in h.get("gpus") or [] if isinstance(g, dict)]
        used = sum(_num(g.get("fb_used_bytes")) or 0.0 for g in gpus)
        total = sum(_num(g.get("fb_total_bytes")) or 0.0 for g in gpus)
        utils = [u for u in (_num(g.get("gpu_util")) for g in gpus) if u is not None]
        t.add_row(
            _t(h.get("host", "?"), "bold"),
            Text(str(len(gpus))),
            _bar(used, total, 10, unicode) if gpus else Text("-"),
            Text(f"{used / GB:.1f}/{total / GB:.1f}" if total else "-"),
            Text(f"{sum(utils) / len(utils):.0f}%" if utils else "-"),
            _top_text(h),
            _engines_text(h),
        )
    if not status.get("hosts"):
        t.add_row(Text("(no hosts reported yet: is a worker running and an agent publishing?)"))
    return t


def _shown_gpus(status: Mapping[str, Any]) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    rows = [
        (str(h.get("host", "?")), g)
        for h in status.get("hosts") or []
        for g in h.get("gpus") or []
        if isinstance(g, dict)
    ]
    if len(rows) <= MAX_GPU_ROWS:
        return rows, 0
    keep = {
        (str(h.get("host")), str(t.get("index")), t.get("mig") or "")
        for h in status.get("hosts") or []
        for tops in _top_gpus(h).values()
        for t in tops
    }
    for a in status.get("alerts") or []:
        lab = a.get("labels") or {}
        keep.add((str(lab.get("host")), str(lab.get("gpu")), lab.get("mig") or ""))
    shown = [(h, g) for h, g in rows if (h, str(g.get("index")), g.get("mig") or "") in keep]
    return shown, len(rows) - len(shown)


def gpus_table(status: Mapping[str, Any], unicode: bool) -> Table:
    t = _table("GPUS", "HOST", "GPU", "MEMORY", "USED/TOTAL GB", "GB/H", "OOM IN", "UTIL%",
               "TOP PROCESS")  # fmt: skip
    rows, hidden = _shown_gpus(status)
    for host, g in rows:
        procs = [p for p in g.get("procs") or [] if isinstance(p, dict)]
        top = max(procs, key=lambda p: _num(p.get("gb_per_hour")) or 0.0, default=None)
        top_s = (
            f"{top.get('name', '?')} pid {top.get('pid', '?')} "
            f"({_fmt(top.get('gb_per_hour'), '+.2f')} GB/h)"
            if top
            else "-"
        )
        growth = _num(g.get("gb_per_hour")) or 0.0
        t.add_row(
            _t(host),
            _t(_gpu_name(g)),
            _bar(g.get("fb_used_bytes"), g.get("fb_total_bytes"), 12, unicode),
            Text(f"{_gb(g.get('fb_used_bytes'))}/{_gb(g.get('fb_total_bytes'))}"),
            Text(_fmt(g.get("gb_per_hour"), "+.2f"), style="red" if growth > 0.5 else ""),
            Text(_hours(g.get("tte_h"))),
            Text(_fmt(g.get("gpu_util"))),
            _t(top_s),
        )
    if hidden:
        t.caption = f"{hidden} quieter GPUs not shown ('ragwatch status --json' lists all)"
    return t


def _stages(signals: Mapping[str, Any]) -> list[str]:
    """Stage names in the order the service reported them (retriever, reranker, llm...)."""
    found = [m.group("stage") for k in signals if (m := _QUANTILE.match(k))]
    return [s for s in dict.fromkeys(found) if s not in _NOT_STAGES]


def _vs(value: Any, forecast: Any) -> Text:
    v, f = _num(value), _num(forecast)
    if v is None:
        return Text("-")
    if f is None or not f:
        return Text(f"{v:,.0f}")
    dev = v / f - 1
    return Text(f"{v:,.0f}/{f:,.0f} {dev:+.0%}", style="red" if dev < -0.25 else "")


def services_table(status: Mapping[str, Any]) -> Table:
    t = _table("SERVICES", "SERVICE", "INSTANCE", "REQ/S", "TOK/REQ VS FC", "TOK/S VS FC",
               "STAGES P95/99", "E2E P95/99", "QUEUE", "ERR")  # fmt: skip
    t.caption = "VS FC: actual/forecast and deviation; latencies in ms; QUEUE: P95"
    t.caption_justify = "left"
    for svc in status.get("services") or []:
        for inst in svc.get("instances") or []:
            sig: Mapping[str, Any] = inst.get("signals") or {}
            stages = Text("\n").join(
                _t(f"{s} {_fmt(sig.get(f'{s}_p95_ms'))}/{_fmt(sig.get(f'{s}_p99_ms'))}")
                for s in _stages(sig)
            )
            errors = _num(sig.get("errors_ratio"))
            t.add_row(
                _t(svc.get("service", "?"), "bold"),
                _t(inst.get("instance", "?")),
                Text(_fmt(sig.get("rps"), ".1f")),
                _vs(sig.get("tokens_per_request"), sig.get("tpr_forecast")),
                _vs(sig.get("output_tokens_per_s"), sig.get("tps_forecast")),
                stages if stages.plain else Text("-"),
                Text(f"{_fmt(sig.get('e2e_p95_ms'))}/{_fmt(sig.get('e2e_p99_ms'))}"),
                Text(_fmt(sig.get("queue_p95_ms"))),
                Text("-" if errors is None else f"{errors:.1%}", style="red" if errors else ""),
            )
    return t


def _where(labels: Mapping[str, Any]) -> str:
    keys = [k for k in LABEL_ORDER if k in labels] + sorted(
        k for k in labels if k not in LABEL_ORDER and k not in _HIDDEN_LABELS
    )
    return " ".join(f"{k}={labels[k]}" for k in keys if labels[k] not in ("", None))


def alerts_section(status: Mapping[str, Any]) -> Group:
    alerts = [a for a in status.get("alerts") or [] if isinstance(a, dict)]
    firing = sum(a.get("status") == "firing" for a in alerts)
    pending = sum(a.get("status") == "pending" for a in alerts)
    lines: list[RenderableType] = [Text(f"ALERTS ({firing} firing, {pending} pending)", "bold")]
    for a in alerts:
        state = str(a.get("status", "?"))
        style = "bold red" if state == "firing" else "yellow"
        head = Text("  ") + Text(f"{state.upper():<8} ", style) + _t(f"{a.get('severity', '?'):<9}")
        head += _t(f"{a.get('rule', '?')}  ", "bold") + _t(_where(a.get("labels") or {}))
        head += Text(f"  since {_when(a.get('starts_at'))}", "dim")
        muted = a.get("silenced_by") or []
        if muted:
            head += Text(f"  SILENCED ({', '.join(clean(m) for m in muted)})", "bold magenta")
        lines.append(head)
        ann = a.get("annotations") or {}
        if ann.get("summary"):
            lines.append(Padding(_t(ann["summary"]), (0, 0, 0, 11)))
        if ann.get("hint"):
            lines.append(Padding(_t(f"hint: {ann['hint']}", "italic"), (0, 0, 0, 11)))
    return Group(*lines)


def _matchers(s: Mapping[str, Any]) -> str:
    return " ".join(
        f"{m.get('name', '?')}{m.get('op', '=')}{m.get('value', '')}"
        for m in s.get("matchers") or []
        if isinstance(m, dict)
    )


def _window(s: Mapping[str, Any], now: float) -> str:
    if s.get("cron"):
        dur = _num(s.get("duration_s"))
        return f"cron '{s['cron']}' UTC" + (f" for {_duration(dur)}" if dur else "")
    starts, ends = _num(s.get("starts_at")), _num(s.get("ends_at"))
    if starts is not None and starts > now:
        return f"starts {_ago(now - starts)}, ends {_when(ends)}"
    return "no end" if ends is None else f"ends {_ago(now - ends)} ({_when(ends)})"


def silences_table(status: Mapping[str, Any], now: float) -> Table:
    t = _table("SILENCES", "ID", "STATE", "MATCHERS", "WINDOW", "BY", "COMMENT")
    for s in status.get("silences") or []:
        t.add_row(
            _t(str(s.get("id", "?"))[:12]),
            _t(s.get("state", "?")),
            _t(_matchers(s)),
            _t(_window(s, now)),
            _t(s.get("author") or "-"),
            _t(s.get("comment") or ""),
        )
    if not status.get("silences"):
        t.add_row(Text("(none)"))
    return t


def _flatten(counters: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for k, v in sorted(counters.items()):
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}.")
        elif _num(v) is not None:
            yield f"{prefix}{k}={v:g}"


def notifier_line(status: Mapping[str, Any], now: float) -> Text:
    n: Mapping[str, Any] = status.get("notifier") or {}
    pending, dead = n.get("outbox_pending", 0), n.get("dead_letters", 0)
    seen = _num(n.get("seen"))
    text = Text("NOTIFIER ", "bold") + Text(f"outbox {pending} due, ")
    text += Text(f"{dead} dead letters", "red" if dead else "")
    text += Text(", " + ("never reported" if seen is None else f"last seen {_ago(now - seen)}"))
    counters = " ".join(_flatten(n.get("counters") or {}))
    return text + (_t(f"; {counters}") if counters else Text())


def workers_lines(status: Mapping[str, Any], now: float) -> list[Text]:
    lines = []
    for wid, w in sorted((status.get("workers") or {}).items()):
        seen = _num(w.get("seen"))
        lines.append(
            Text("WORKER ", "bold")
            + _t(
                f"{wid}: messages={w.get('messages', 0)} deadletter={w.get('deadletter', 0)} "
                f"series={w.get('series', 0)} transitions={w.get('transitions', 0)} "
                f"duplicates={w.get('duplicates', 0)} "
                f"clock_jumps_back={w.get('clock_jumps_back', 0)} "
                f"too_old={w.get('too_old', 0)} redis_errors={w.get('redis_errors', 0)}"
                + ("" if seen is None else f", last seen {_ago(now - seen)}")
            )
        )
    return lines


def render(status: Mapping[str, Any], now: float, *, unicode: bool = True) -> Group:
    """The whole view as one rich renderable."""
    parts: list[RenderableType] = [
        Text(f"ragwatch status  {_when(now)}", "bold"),
        alerts_section(status),  # first: what needs a human, even when --watch crops
        hosts_table(status, unicode),
    ]
    if any(h.get("gpus") for h in status.get("hosts") or []):
        parts.append(gpus_table(status, unicode))
    if status.get("services"):
        parts.append(services_table(status))
    parts.append(silences_table(status, now))
    parts = [p for part in parts for p in (part, Text())]
    parts += [notifier_line(status, now), *workers_lines(status, now)]
    return Group(*parts)
