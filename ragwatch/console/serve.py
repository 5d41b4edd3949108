"""``ragwatch serve``: the HTTP API, ``/metrics`` and the live status page (aiohttp).

Everything is read from Redis on each request (:mod:`ragwatch.store` knows the
keys), with a blocking client in a worker thread, so the server holds no state of its own
and any number of them can run; it writes only a test key, to find a Redis that refuses
writes (:class:`~ragwatch.console.exporter.RedisWrites`). Routes (documented in
:mod:`ragwatch.console.openapi`):

=========================  ==============================================================
``/api/v1/status``         what ``ragwatch status --json`` prints
``/api/v1/alerts``         active alerts (``?state=firing|pending``, ``?limit=``)
``/api/v1/alerts/{fp}``    one alert, active or in the history: its transitions, the
                           silences that mute it and the series that chart it; 404 unknown
``/api/v1/series``         the chart series index (``?kind=``, ``?limit=``)
``/api/v1/series/{id}``    points of one series, oldest first (``?limit=``), and for the
                           memory of a GPU or a process the GPU's total memory and
                           growth (:func:`memory_of`); 404 unknown
``/api/v1/silences``       silences (``?all=true`` with expired ones)
``/healthz``               200 if Redis answers a PING and takes writes, else 503 with
                           the reason
``/readyz``                200 if Redis answers a PING (the console can read), else 503
``/livez``                 200 while the process answers (never reads Redis)
``/metrics``               Prometheus exposition (:mod:`ragwatch.console.exporter`)
``/openapi.json``          the OpenAPI 3.0 document
``/``, ``/static/...``     the live page, its script and the vendored uPlot
``/alerts/{fp}``           the page of one alert: where notifications link to (404 page
                           for an unknown alert)
=========================  ==============================================================

With ``RAGWATCH_SERVE_TOKEN`` set, every route but the three probes, the pages and their
static files (no data in them) needs ``Authorization: Bearer <token>``, compared in
constant time. A page takes the token once from ``?token=``, keeps it in
``sessionStorage`` and drops it from the address bar. The token is never logged: the
access log (DEBUG) writes the path without the query string.

An alert's page is the same script in another mode: it draws what
``/api/v1/alerts/{fp}`` returns. Opened without a token (a link followed from Slack) it
is the bare page, and the script reads the alert with the token it holds; opened open
(no token set) or with the right token, the server reads the alert too, names it in the
page and answers 404 when there is no such alert; a wrong token is a 401.

Slow clients (slowloris) cannot starve the server: request heads and bodies have
deadlines and connections a limit below the open-file limit
(:mod:`ragwatch.console.guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import re
import resource
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cache
from html import escape
from pathlib import Path
from string import Template
from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from ragwatch.advisor import MIN_SCORE
from ragwatch.chart_ids import (
    BAND_COLUMNS,
    POINT_COLUMNS,
    alert_prefixes,
    alert_series,
    series_prefix,
)
from ragwatch.config import Settings, redact_url
from ragwatch.console.exporter import (
    METRIC_NAMES,
    METRICS,
    WRITE_PROBE_S,
    RedisCollector,
    RedisWrites,
)
from ragwatch.console.guard import (
    BODY_TIMEOUT_S,
    HEAD_TIMEOUT_S,
    LISTEN_BACKLOG,
    ConnectionGuard,
    connection_limit,
    guard_middleware,
)
from ragwatch.console.openapi import spec
from ragwatch.errors import ConfigError
from ragwatch.silences import decode_all
from ragwatch.store import (
    HISTORY_MAX,
    SERIES_POINTS,
    Keys,
    blocking_client,
    read_alerts,
    read_explained,
    read_host,
    read_series,
    read_series_index,
    read_silences,
    read_status,
)

__all__ = ["METRICS", "METRIC_NAMES", "build_app", "serve"]

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).parent / "web"
INDEX_MAX = 10_000  # series index entries per response
ALERTS_MAX = 10_000  # alerts per response
STATUS_MAX = 1000  # hosts and services (each) per status response
OFFSET_MAX = 10**9
SERIES_ID_MAX = 512  # characters
FINGERPRINT_MAX = 128  # characters
ALERT_HISTORY_MAX = 100  # transitions of one alert per response
HISTORY_CHUNK = 1000  # history entries read at a time
PUBLIC_PATHS = frozenset({"/", "/healthz", "/readyz", "/livez"})
ALERT_PAGES = "/alerts/"  # token optional: without one, the bare page
SERIES_KINDS = ("gpu", "process", "service", "engine")
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CLIENT_KEY: web.AppKey[Any] = web.AppKey("redis")  # a blocking redis.Redis
SETTINGS_KEY = web.AppKey("settings", Settings)
REGISTRY_KEY = web.AppKey("registry", CollectorRegistry)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("clock")
WRITES_KEY = web.AppKey("writes", RedisWrites)


class BadRequest(ValueError):
    """A query parameter that is unknown or out of range (400)."""


def _json(data: Any, status: int = 200) -> web.Response:
    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _params(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    query = request.query
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown query parameter(s): {', '.join(unknown)}")
    if any(len(query.getall(k)) > 1 for k in query):
        raise BadRequest("repeated query parameter")
    return {k: query[k] for k in query}


def _int(params: dict[str, str], name: str, lo: int, hi: int) -> int:
    raw = params.get(name)
    if raw is None:
        return hi
    if not re.fullmatch(r"[0-9]{1,9}", raw) or not lo <= int(raw) <= hi:
        raise BadRequest(f"{name} must be an integer in {lo}..{hi}")
    return int(raw)


def _choice(params: dict[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    raw = params.get(name)
    if raw is not None and raw not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}")
    return raw


async def _read(request: web.Request, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(client, prefix, *args)`` in a worker thread (the client is blocking)."""
    settings = request.app[SETTINGS_KEY]
    return await asyncio.to_thread(fn, request.app[CLIENT_KEY], settings.redis_prefix, *args, **kw)


# ---------------------------------------------------------------------------- one alert


def _decoded(raw: Any) -> Any:
    """A stored JSON value, or None if there is none or it does not decode."""
    try:
        return orjson.loads(raw) if raw is not None else None
    except orjson.JSONDecodeError:
        return None


def _transitions(client: Any, key: str, fingerprint: str) -> list[dict[str, Any]]:
    """The transitions of one alert in the history list, newest first."""
    needle = orjson.dumps(fingerprint)
    out: list[dict[str, Any]] = []
    seen: set[bytes] = set()  # an entry pushed between two reads moves into the next one
    for start in range(0, HISTORY_MAX, HISTORY_CHUNK):
        raw = client.lrange(key, start, start + HISTORY_CHUNK - 1)
        for r in raw:
            if needle in r and r not in seen:
                seen.add(r)
                a = _decoded(r)
                if isinstance(a, dict) and a.get("fingerprint") == fingerprint:
                    out.append(a)
        if len(raw) < HISTORY_CHUNK or len(out) >= ALERT_HISTORY_MAX:
            break
    return out[:ALERT_HISTORY_MAX]


def find_alert(client: Any, prefix: str, fingerprint: str) -> dict[str, Any] | None:
    """``{alert, active, history}``: the active alert, else its newest transition in the
    history (it resolved), with its transitions; None if it is in neither."""
    keys = Keys(prefix)
    active = _decoded(client.hget(keys.active, fingerprint))
    history = _transitions(client, keys.history, fingerprint)
    alert = active if isinstance(active, dict) else next(iter(history), None)
    if alert is None:
        return None
    return {"alert": alert, "active": isinstance(active, dict), "history": history}


def _charts(client: Any, keys: Keys, rule: str, labels: dict[str, str]) -> list[str]:
    """The series that chart an alert (:func:`alert_series`), from the series index."""
    starts = tuple(alert_prefixes(labels).values())
    if not starts:
        return []
    every = (k.decode(errors="replace") for k in client.hkeys(keys.series_index))
    ids = [i for i in every if i.startswith(starts)]
    metas = client.hmget(keys.series_index, ids) if ids else []
    index = {i: m for i, m in zip(ids, map(_decoded, metas), strict=True) if isinstance(m, dict)}
    return alert_series(rule, labels, index)


def read_alert(client: Any, prefix: str, fingerprint: str, *, now: float) -> dict[str, Any] | None:
    """:func:`find_alert` with the silences that mute the alert at wall time ``now`` and
    the series that chart it, best first."""
    found = find_alert(client, prefix, fingerprint)
    if found is None:
        return None
    keys, alert = Keys(prefix), found["alert"]
    raw = alert.get("labels")
    labels = {k: v for k, v in raw.items() if isinstance(v, str)} if isinstance(raw, dict) else {}
    silences = decode_all(client.hgetall(keys.silences))
    return {
        **found,
        "silenced_by": [s.id for s in silences if s.active(now) and s.matches(labels)],
        "series": _charts(client, keys, str(alert.get("rule", "")), labels),
    }


# ---------------------------------------------------------------------------- memory charts

MEMORY_KINDS = ("gpu", "process")
GB = 1e9  # the status' gb_per_hour


def memory_of(meta: dict[str, Any], host: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a chart of a GPU's or a process's memory draws beside its points, from its
    host's status entry: the id of the GPU's memory series, the GPU's total and used
    bytes, its growth in bytes per second, when it runs out of memory at that growth (the
    status' time to exhaustion; None when not growing) and the event time they are of
    (None for a series of another kind; the values None when the status does not have
    the GPU).

    >>> host = {"gpus": [{"index": 1, "mig": None, "fb_total_bytes": 8e10,
    ...     "fb_used_bytes": 7e10, "gb_per_hour": 3.6, "tte_h": 2.75, "ts": 100.0}]}
    >>> meta = {"kind": "process", "labels": {"host": "h", "gpu": "1", "mig": "", "pid": "7"}}
    >>> memory_of(meta, host)
    {'gpu_series': 'gpu:h:1:fb_used', 'total_bytes': 80000000000.0, \
'used_bytes': 70000000000.0, 'growth_bytes_per_s': 1000000.0, 'oom_at': 10000.0, 'ts': 100.0}
    >>> memory_of({"kind": "service", "labels": {}}, host) is None
    True
    """
    labels = meta.get("labels")
    if meta.get("kind") not in MEMORY_KINDS or not isinstance(labels, dict):
        return None
    gpu = _gpu_status(host, labels)
    growth, ts, tte_h = (_number(gpu.get(k)) for k in ("gb_per_hour", "ts", "tte_h"))
    return {
        "gpu_series": series_prefix("gpu", labels) + "fb_used",
        "total_bytes": _number(gpu.get("fb_total_bytes")),
        "used_bytes": _number(gpu.get("fb_used_bytes")),
        "growth_bytes_per_s": None if growth is None else growth * GB / 3600,
        "oom_at": None if ts is None or tte_h is None else ts + tte_h * 3600,
        "ts": ts,
    }


def _gpu_status(host: dict[str, Any] | None, labels: dict[str, Any]) -> dict[str, Any]:
    """The status entry of the GPU (and MIG instance) ``labels`` name, else ``{}``."""
    gpus = host.get("gpus") if isinstance(host, dict) else None
    mig = labels.get("mig") or None
    for g in gpus if isinstance(gpus, list) else []:
        if (
            isinstance(g, dict)
            and str(g.get("index")) == str(labels.get("gpu"))
            and (g.get("mig") or None) == mig
        ):
            return g
    return {}


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def read_chart(
    client: Any, prefix: str, series_id: str, limit: int
) -> tuple[dict[str, Any], list[list[Any]], dict[str, Any] | None] | None:
    """:func:`read_series` and, for a memory chart, :func:`memory_of` its host's status."""
    found = read_series(client, prefix, series_id, limit)
    if found is None:
        return None
    meta, points = found
    labels = meta.get("labels")
    host = labels.get("host") if isinstance(labels, dict) else None
    if meta.get("kind") not in MEMORY_KINDS or not isinstance(host, str):
        return meta, points, None
    return meta, points, memory_of(meta, read_host(client, prefix, host))


# ---------------------------------------------------------------------------- handlers


async def status(request: web.Request) -> web.Response:
    """The fleet, a page of ``limit`` hosts and services (each) from ``offset`` in name
    order: a fleet of 20,000 hosts made one response of 9.5 MB."""
    params = _params(request, ("limit", "offset"))
    limit = _int(params, "limit", 1, STATUS_MAX)
    offset = _int(params, "offset", 0, OFFSET_MAX) if "offset" in params else 0
    return _json(await _read(request, read_status, limit=limit, offset=offset))


async def alerts(request: web.Request) -> web.Response:
    params = _params(request, ("state", "limit"))
    state = _choice(params, "state", ("firing", "pending"))
    limit = _int(params, "limit", 1, ALERTS_MAX)
    active = await _read(request, read_alerts)
    if state is not None:
        active = [a for a in active if a.get("status") == state]
    return _json({"alerts": active[:limit], "total": len(active), "truncated": len(active) > limit})


def _fingerprint(request: web.Request) -> str:
    fp = request.match_info["fingerprint"]
    if len(fp) > FINGERPRINT_MAX:
        raise BadRequest(f"fingerprint longer than {FINGERPRINT_MAX} characters")
    return fp


async def alert(request: web.Request) -> web.Response:
    _params(request, ())
    fp = _fingerprint(request)
    found = await _read(request, read_alert, fp, now=request.app[CLOCK_KEY]())
    if found is None:
        return _error(404, f"no alert {fp!r}: not active, not in the last {HISTORY_MAX} changes")
    return _json(found)


async def explain_route(request: web.Request) -> web.Response:
    """The anomaly advisor (:func:`ragwatch.advisor.explain`) on an alert
    (``fingerprint``), a ``host`` or a ``service``."""
    params = _params(request, ("fingerprint", "host", "service", "min_score"))
    named = {k: params[k] for k in ("fingerprint", "host", "service") if k in params}
    if not named:
        raise BadRequest("name an alert's fingerprint, a host or a service")
    if any(len(v) > FINGERPRINT_MAX for v in named.values()):
        raise BadRequest(f"names longer than {FINGERPRINT_MAX} characters")
    min_score = MIN_SCORE
    if "min_score" in params:
        try:
            min_score = float(params["min_score"])
        except ValueError:
            min_score = math.nan
        if not 0.0 <= min_score <= 1.0:
            raise BadRequest("min_score must be a number in 0..1")
    try:
        found = await _read(request, read_explained, **named, min_score=min_score)
    except LookupError as exc:
        return _error(404, str(exc.args[0]))
    return _json(found)


async def series_index(request: web.Request) -> web.Response:
    params = _params(request, ("kind", "limit"))
    kind = _choice(params, "kind", SERIES_KINDS)
    limit = _int(params, "limit", 1, INDEX_MAX)
    index = await _read(request, read_series_index)
    ids = sorted(i for i, m in index.items() if kind is None or m.get("kind") == kind)
    entries = [{**index[i], "id": i} for i in ids[:limit]]
    return _json({"series": entries, "total": len(ids), "truncated": len(ids) > limit})


async def series(request: web.Request) -> web.Response:
    params = _params(request, ("limit",))
    limit = _int(params, "limit", 1, SERIES_POINTS)
    sid = request.match_info["id"]
    if len(sid) > SERIES_ID_MAX:
        raise BadRequest(f"series id longer than {SERIES_ID_MAX} characters")
    found = await _read(request, read_chart, sid, limit)
    typed = request.raw_path.partition("?")[0].removeprefix("/api/v1/series/")
    if found is None and typed != sid and len(typed) <= SERIES_ID_MAX:
        # an id typed as it is (names' ':' escaped as %3A in it), not URL-encoded
        sid, found = typed, await _read(request, read_chart, typed, limit)
    if found is None:
        return _error(404, f"no series {request.match_info['id']!r}")
    meta, points, memory = found
    columns = BAND_COLUMNS if meta.get("band") else POINT_COLUMNS
    return _json(
        {
            **meta,
            "id": sid,
            "columns": list(columns),
            "points": [[*p, None, None, None, None][: len(columns)] for p in points],
            **({"memory": memory} if memory is not None else {}),
        }
    )


async def silences(request: web.Request) -> web.Response:
    params = _params(request, ("all",))
    every = _choice(params, "all", ("true", "false", "1", "0")) in ("true", "1")
    now = request.app[CLOCK_KEY]()
    found = await _read(request, read_silences, now=now, include_expired=every)
    return _json({"silences": found})


async def _redis_answers(request: web.Request) -> web.Response | None:
    """None if Redis answers a PING, else the 503 naming the kind of failure."""
    from redis.exceptions import RedisError

    try:
        await asyncio.to_thread(request.app[CLIENT_KEY].ping)
    except RedisError as exc:
        return _json({"status": "unavailable", "reason": f"redis: {type(exc).__name__}"}, 503)
    return None


async def healthz(request: web.Request) -> web.Response:
    """503 unless Redis answers a PING and took the last test write (:class:`RedisWrites`),
    with the kind of failure only: Redis's words go to the log, once per change."""
    if (down := await _redis_answers(request)) is not None:
        return down
    writable = request.app[WRITES_KEY].state
    if writable is not None and writable.ok is False:
        return _json(
            {"status": "unavailable", "reason": f"redis refuses writes: {writable.reason}"}, 503
        )
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 while Redis answers (the console can read it, even while it refuses writes)."""
    return await _redis_answers(request) or _json({"status": "ok"})


async def livez(request: web.Request) -> web.Response:
    """200 while the process answers HTTP: never depends on Redis."""
    return _json({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    _params(request, ())
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = await asyncio.to_thread(encoder, request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": content_type})


async def openapi(request: web.Request) -> web.Response:
    _params(request, ())
    doc = spec(
        series_points=SERIES_POINTS,
        index_max=INDEX_MAX,
        alerts_max=ALERTS_MAX,
        status_max=STATUS_MAX,
        fingerprint_max=FINGERPRINT_MAX,
    )
    return _json(doc)


async def page(request: web.Request) -> web.FileResponse:
    """The page; its script reads ``?token=`` itself (the server ignores the query)."""
    return web.FileResponse(WEB_DIR / "index.html")


@cache
def _alert_template() -> Template:
    return Template((WEB_DIR / "alert.html").read_text(encoding="utf-8"))


def _alert_html(status: int, heading: str, note: str = "") -> web.Response:
    text = _alert_template().substitute(
        title=escape(f"ragwatch: {heading}"), heading=escape(heading), note=escape(note)
    )
    return web.Response(text=text, status=status, content_type="text/html")


async def alert_page(request: web.Request) -> web.Response:
    """An alert's page, drawn by the script from ``/api/v1/alerts/{fp}``. Without the
    token (when one is set) the bare page: the server reads nothing."""
    fp = request.match_info["fingerprint"]
    token = request.app[SETTINGS_KEY].serve_token.get()
    if token and not _authorized(request, token.encode()):
        return _alert_html(200, "alert")
    found = None
    if len(fp) <= FINGERPRINT_MAX:
        found = await _read(request, find_alert, fp)
    if found is None:
        note = (
            f"It is not active and not among the last {HISTORY_MAX:,} alert changes: "
            "the link is wrong, or the alert ended long ago."
        )
        return _alert_html(404, f"no alert {fp[:FINGERPRINT_MAX]}", note)
    a = found["alert"]
    return _alert_html(200, f"{a.get('rule')} ({a.get('status')})")


# ---------------------------------------------------------------------------- middleware


def _authorized(request: web.Request, token: bytes) -> bool:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    # aiohttp hands undecodable header bytes over as surrogates: they are a wrong token
    given = credentials.strip().encode("utf-8", "surrogateescape")
    return scheme.lower() == "bearer" and hmac.compare_digest(given, token)


def auth_middleware(token: str) -> Any:
    expected = token.encode()

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        public = request.path in PUBLIC_PATHS or request.path.startswith("/static/")
        # an alert's page opened without credentials (a link followed): the bare page
        bare = request.path.startswith(ALERT_PAGES) and "Authorization" not in request.headers
        if expected and not (public or bare) and not _authorized(request, expected):
            resp = _error(401, "missing or wrong bearer token")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="ragwatch"'
            return resp
        return await handler(request)

    return auth


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """JSON errors for the API, security headers everywhere."""
    from redis.exceptions import RedisError

    try:
        resp = await handler(request)
    except BadRequest as exc:
        resp = _error(400, str(exc))
    except RedisError as exc:
        url = redact_url(request.app[SETTINGS_KEY].redis_url)
        resp = _error(503, f"cannot read from Redis at {url}: {exc}")
    except web.HTTPException as exc:
        if not request.path.startswith("/api/"):
            raise
        resp = _error(exc.status, exc.reason)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "no-referrer")
    if request.path == "/" or request.path.startswith(ALERT_PAGES):
        resp.headers["Content-Security-Policy"] = PAGE_CSP
        resp.headers["Cache-Control"] = "no-store"
    elif not request.path.startswith("/static/"):
        resp.headers.setdefault("Cache-Control", "no-store")
    return resp


class WithholdRequestDetails(logging.Filter):
    """aiohttp logs a request it cannot parse (a NUL in a header, say) at ERROR with the
    parser's message, which quotes the offending line: ``Authorization: Bearer <token>``
    included. On ``aiohttp.server`` only the kind of error is kept, as a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        record.msg = (
            "unusable request from a client (%s); details withheld: they may hold credentials"
        )
        record.args = (type(exc).__name__ if exc else "error",)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class AccessLogger(AbstractAccessLogger):
    """One DEBUG line per request: method, path without the query (no token), status."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.debug(
            "%s %s %d %.1fms", request.method, request.path, response.status, time * 1000
        )


# ---------------------------------------------------------------------------- app and run


def build_app(
    settings: Settings,
    client: Any,
    *,
    clock: Callable[[], float] = time.time,
    guard: ConnectionGuard | None = None,
) -> web.Application:
    """The aiohttp application over one blocking Redis client (``redis.Redis``); ``clock``
    is the wall clock that decides which silences are active; ``guard`` the listening
    socket's. While it runs, Redis is probed for writes every ``WRITE_PROBE_S``."""
    outer = [guard_middleware(guard)] if guard is not None else []
    app = web.Application(
        middlewares=[*outer, errors_middleware, auth_middleware(settings.serve_token.get())],
        client_max_size=64 * 1024,  # GET only: no body worth reading
    )
    writes = RedisWrites(client, settings.redis_prefix, redact_url(settings.redis_url))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisCollector(client, settings.redis_prefix, writes))
    app[CLIENT_KEY] = client
    app[SETTINGS_KEY] = settings
    app[REGISTRY_KEY] = registry
    app[CLOCK_KEY] = clock
    app[WRITES_KEY] = writes
    app.cleanup_ctx.append(_probing)
    app.router.add_get("/", page)
    app.router.add_get(ALERT_PAGES + "{fingerprint}", alert_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/api/v1/status", status)
    app.router.add_get("/api/v1/alerts", alerts)
    app.router.add_get("/api/v1/alerts/{fingerprint}", alert)
    app.router.add_get("/api/v1/explain", explain_route)
    app.router.add_get("/api/v1/series", series_index)
    app.router.add_get("/api/v1/series/{id:.+}", series)
    app.router.add_get("/api/v1/silences", silences)
    app.router.add_static("/static/", WEB_DIR, follow_symlinks=False)
    return app


def serve(settings: Settings, *, host: str | None = None, port: int | None = None) -> int:
    """Serve until SIGINT or SIGTERM; 0 when stopped, ``ConfigError`` if it cannot listen."""
    host = host or settings.serve_host
    port = settings.serve_port if port is None else port
    if not 0 < port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {port}")
    return asyncio.run(_serve(settings, host, port))


async def _probing(app: web.Application) -> AsyncIterator[None]:
    """Probe Redis for writes while the app runs (an aiohttp cleanup context)."""
    task = asyncio.create_task(app[WRITES_KEY].run(WRITE_PROBE_S))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _serve(settings: Settings, host: str, port: int) -> int:
    client = blocking_client(settings.redis_url, connect_s=3)
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    guard = ConnectionGuard(connection_limit(open_files), HEAD_TIMEOUT_S)
    runner = web.AppRunner(
        build_app(settings, client, guard=guard),
        access_log_class=AccessLogger,
        keepalive_timeout=HEAD_TIMEOUT_S,  # the next head after a response (see the guard)
        lingering_time=BODY_TIMEOUT_S,
    )
    withhold = WithholdRequestDetails()
    logging.getLogger("aiohttp.server").addFilter(withhold)
    await runner.setup()
    listener: asyncio.AbstractServer | None = None
    try:
        assert runner.server is not None  # set up
        try:  # as web.TCPSite listens, with guarded protocols
            listener = await asyncio.get_running_loop().create_server(
                guard.factory(runner.server), host, port, backlog=LISTEN_BACKLOG
            )
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        auth = "bearer token required" if settings.serve_token else "no token (open)"
        log.info("serving on http://%s:%d/ (API /api/v1, /metrics; %s)", host, port, auth)
        log.info("at most %d connections (open-file limit %s); request heads within %gs, "
                 "bodies within %gs", guard.limit, "unlimited" if open_files < 0 else open_files,
                 HEAD_TIMEOUT_S, BODY_TIMEOUT_S)  # fmt: skip
        if not settings.serve_token and host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("no RAGWATCH_SERVE_TOKEN: anyone who reaches %s reads the status", host)
        await stop.wait()
        log.info("stopping")
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()
        client.close()
        logging.getLogger("aiohttp.server").removeFilter(withhold)
    return 0
