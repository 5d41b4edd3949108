"""``ragwatch status``: hosts, GPUs, memory, slopes and alerts, read from Redis only."""

from __future__ import annotations

import math
from typing import Any, TextIO

import orjson

from ragwatch.config import Settings, redact_url
from ragwatch.errors import ConfigError

GB = 1e9


def fetch_status(settings: Settings) -> dict[str, Any]:
    import redis
    from redis.exceptions import RedisError

    from ragwatch.streams.state import read_status

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        return read_status(client, settings.redis_prefix)
    except RedisError as exc:
        raise ConfigError(
            f"cannot read status from Redis at {redact_url(settings.redis_url)}: {exc}"
        ) from None
    finally:
        client.close()


def _gb(v: float | None) -> str:
    return "-" if v is None else f"{v / GB:.1f}"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _hours(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.1f}h"


def render_text(status: dict[str, Any]) -> str:
    lines = ["HOST            GPU  MEM USED/TOTAL GB  GB/H    OOM IN   UTIL%  TOP PROCESS"]
    for host in status["hosts"]:
        for g in host["gpus"]:
            top = max(g["procs"], key=lambda p: p.get("gb_per_hour") or 0.0, default=None)
            top_s = (
                f"{top['name']} pid {top['pid']} ({_rate(top.get('gb_per_hour'))} GB/h)"
                if top
                else "-"
            )
            gpu = str(g["index"]) + (f"/{g['mig']}" if g.get("mig") else "")
            util = "-" if g.get("gpu_util") is None else f"{g['gpu_util']:.0f}"
            lines.append(
                f"{host['host']:<15} {gpu:<4} {_gb(g.get('fb_used_bytes')):>6}/"
                f"{_gb(g.get('fb_total_bytes')):<10} {_rate(g.get('gb_per_hour')):>6}"
                f"  {_hours(g.get('tte_h')):>7}  {util:>5}  {top_s}"
            )
    if not status["hosts"]:
        lines.append("(no hosts reported yet: is a worker running and an agent publishing?)")
    lines.append("")
    alerts = status["alerts"]
    lines.append(
        f"ALERTS ({sum(a['status'] == 'firing' for a in alerts)} firing, "
        f"{sum(a['status'] == 'pending' for a in alerts)} pending)"
    )
    for a in alerts:
        lab = a["labels"]
        where = " ".join(f"{k}={lab[k]}" for k in ("host", "gpu", "pid", "process") if k in lab)
        lines.append(f"  {a['status'].upper():<8} {a['severity']:<9} {a['rule']}  {where}")
        if a["annotations"].get("summary"):
            lines.append(f"           {a['annotations']['summary']}")
    for wid, w in sorted(status["workers"].items()):
        lines.append(
            f"worker {wid}: messages={w.get('messages', 0)} "
            f"deadletter={w.get('deadletter', 0)} series={w.get('series', 0)} "
            f"webhook sent={w.get('webhook_sent', 0)} failed={w.get('webhook_failed', 0)}"
        )
    return "\n".join(lines)


def show_status(settings: Settings, *, as_json: bool, out: TextIO) -> int:
    status = fetch_status(settings)
    if as_json:
        out.write(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.write(render_text(status) + "\n")
    return 0
