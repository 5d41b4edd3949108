"""``ragwatch explain``: the anomaly advisor on an alert, a host or a service, from Redis.

Reads the alert and its neighbourhood from Redis (:func:`~ragwatch.store.read_around`:
its host and services, not the whole fleet) and ranks the
scored signals of the alert's host and services by their peak anomaly score of the last
hour (:mod:`ragwatch.advisor`): which signals moved together, which way and how far.
"""

from __future__ import annotations

from typing import Any, TextIO

import orjson

from ragwatch.advisor import MIN_SCORE
from ragwatch.config import Settings, redact_url
from ragwatch.console.status_view import clean
from ragwatch.errors import ConfigError


def show_explain(
    settings: Settings,
    *,
    fingerprint: str | None,
    host: str | None,
    service: str | None,
    as_json: bool,
    out: TextIO,
    min_score: float = MIN_SCORE,
) -> int:
    """Print the explanation; exit 1 (with a line on ``out``) when the alert, host or
    service is not known, 0 otherwise. Redis unreachable: ``ConfigError``."""
    try:
        found = _fetch(settings, fingerprint, host, service, min_score)
    except LookupError as exc:
        out.write(f"ragwatch: {exc.args[0]}\n")
        return 1
    if as_json:
        out.write(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.write(render(found))
    return 0


def render(found: dict[str, Any]) -> str:
    """The explanation as text: what was explained, then one line per move."""
    alert = found.get("alert")
    if alert:
        head = f"alert {alert.get('rule')} ({alert.get('fingerprint')}, {alert.get('status')})"
    else:
        head = " and ".join(
            f"{k} {found[k]}" for k in ("host", "service") if found.get(k) is not None
        )
    lines = [
        clean(f"{head}: signals anomalous (peak score >= {found['min_score']:.2f}) over the "
              f"last {found['window_s'] / 3600:.0f} h, highest first"),
    ]  # fmt: skip
    for m in found["moves"]:
        now = "-" if m["score_now"] is None else f"{m['score_now']:.2f}"
        lines.append(clean(f"  {m['score']:.2f} (now {now})  {m['words']}"))
    if not found["moves"]:
        lines.append("  nothing anomalous")
    return "\n".join(lines) + "\n"


def _fetch(
    settings: Settings,
    fingerprint: str | None,
    host: str | None,
    service: str | None,
    min_score: float,
) -> dict[str, Any]:
    from redis.exceptions import RedisError

    from ragwatch.store import blocking_client, read_explained

    client = blocking_client(settings.redis_url)
    try:
        return read_explained(
            client,
            settings.redis_prefix,
            fingerprint=fingerprint,
            host=host,
            service=service,
            min_score=min_score,
        )
    except RedisError as exc:
        raise ConfigError(f"cannot read Redis at {redact_url(settings.redis_url)}: {exc}") from None
    finally:
        client.close()
