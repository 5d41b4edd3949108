"""The OpenAPI 3.0 document of ``ragwatch serve``, written by hand (served at /openapi.json).

``tests/unit/test_openapi.py`` checks its structure and that every route of the server
is documented here.
"""

from __future__ import annotations

from typing import Any

from ragwatch import __version__
from ragwatch.chart_ids import BAND_COLUMNS


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(typ: str, **kw: Any) -> dict[str, Any]:
    return {"type": typ, "nullable": True, **kw}


def _obj(required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_NUM_MAP = {"type": "object", "additionalProperties": _nullable("number")}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


SCHEMAS: dict[str, Any] = {
    "Error": _obj(["error"], error={"type": "string"}),
    "Health": _obj(["status"], status={"type": "string", "enum": ["ok", "unavailable"]},
                   reason={"type": "string"}),
    "Alert": _obj(
        ["rule", "severity", "status", "labels", "annotations", "starts_at", "fingerprint"],
        v={"type": "integer"},
        kind={"type": "string", "enum": ["alert"]},
        rule={"type": "string"},
        severity={"type": "string", "enum": ["critical", "error", "warning", "info"]},
        status={"type": "string", "enum": ["pending", "firing", "resolved"]},
        labels=_STR_MAP,
        annotations={**_STR_MAP, "description": "summary, description, runbook, hint"},
        value={"type": "number"},
        expected=_nullable("number"),
        starts_at={"type": "number", "description": "event time, epoch seconds"},
        ends_at=_nullable("number"),
        fingerprint={"type": "string"},
        at=_nullable("number"),
    ),
    "Process": _obj(
        ["pid"],
        pid={"type": "integer"},
        name={"type": "string"},
        container={"type": "string", "description": "Kubernetes container name, else the "
                   "runtime's short container id, or none"},
        namespace={"type": "string", "description": "Kubernetes namespace, where known"},
        pod={"type": "string", "description": "Kubernetes pod, where known"},
        gpu_mem_bytes=_nullable("number"),
        gb_per_hour=_nullable("number"),
    ),
    "Gpu": _obj(
        ["index"],
        index={"type": "integer"},
        mig=_nullable("string"),
        name=_nullable("string"),
        uuid=_nullable("string"),
        fb_used_bytes=_nullable("number"),
        fb_total_bytes=_nullable("number"),
        gb_per_hour=_nullable("number"),
        mem_increase_gb=_nullable("number"),
        tte_h=_nullable("number", description="hours to exhaustion; null: unknown or never"),
        gpu_util=_nullable("number", description="percent"),
        ts=_nullable("number"),
        procs=_array(_ref("Process")),
        namespace={"type": "string", "description": "of the pod the device is allocated to"},
        pod={"type": "string"},
        container={"type": "string"},
    ),
    "TopGpu": _obj(["index"], index={"type": "integer"}, mig=_nullable("string"),
                   value=_nullable("number")),
    "Engine": _obj(["target"], target={"type": "string"}, ts={"type": "number"},
                   signals=_NUM_MAP),
    "Host": _obj(
        ["host", "gpus"],
        host={"type": "string"},
        gpus=_array(_ref("Gpu")),
        top_gpus=_obj(
            util=_array(_ref("TopGpu")),
            memory=_array(_ref("TopGpu")),
            growth=_array(_ref("TopGpu")),
        ),
        engines=_array(_ref("Engine")),
    ),
    "Instance": _obj(
        ["instance"],
        instance={"type": "string"},
        host=_nullable("string"),
        bucket_end=_nullable("number"),
        signals=_NUM_MAP,
        outlier_label=_nullable("string"),
        open_buckets={"type": "integer"},
    ),
    "Service": _obj(["service"], service={"type": "string"},
                    instances=_array(_ref("Instance"))),
    "Silence": _obj(
        ["id", "matchers", "state"],
        id={"type": "string"},
        matchers=_array(
            _obj(
                ["name", "op", "value"],
                name={"type": "string"},
                op={"type": "string", "enum": ["=", "=~"]},
                value={"type": "string"},
            )
        ),
        starts_at=_nullable("number", description="wall time, epoch seconds"),
        ends_at=_nullable("number", description="null for a recurring silence"),
        cron=_nullable("string", description="start of each window, 5 fields, UTC"),
        duration_s=_nullable("number"),
        comment={"type": "string"},
        author={"type": "string"},
        created_at=_nullable("number"),
        expired_at=_nullable("number", description="set by 'ragwatch silence expire'"),
        state={
            "type": "string",
            "enum": ["active", "pending", "expired"],
            "description": "at the time of the request; a recurring silence is pending "
            "between its windows",
        },
    ),
    "Notifier": _obj(
        ["outbox_pending", "dead_letters"],
        outbox_pending={"type": "integer"},
        dead_letters={"type": "integer"},
        counters={"type": "object", "additionalProperties": True},
        seen=_nullable("number", description="wall time the notifier last reported"),
    ),
    "Status": _obj(
        [
            "hosts",
            "services",
            "total_hosts",
            "total_services",
            "alerts",
            "history",
            "workers",
            "silences",
            "notifier",
        ],
        hosts=_array(_ref("Host")),
        services=_array(_ref("Service")),
        total_hosts={"type": "integer", "description": "hosts in all (the page holds some)"},
        total_services={"type": "integer", "description": "services in all"},
        alerts=_array(_ref("Alert")),
        history=_array(_ref("Alert")),
        workers={"type": "object", "additionalProperties": {"type": "object"}},
        silences=_array(_ref("Silence")),
        notifier=_ref("Notifier"),
    ),
    "AlertList": _obj(["alerts", "total", "truncated"], alerts=_array(_ref("Alert")),
                      total={"type": "integer"}, truncated={"type": "boolean"}),
    "AlertDetail": _obj(
        ["alert", "active", "history", "silenced_by", "series"],
        alert={**_ref("Alert"), "description": "the active alert, else its last change"},
        active={"type": "boolean", "description": "false: it resolved"},
        history=_array(_ref("Alert")) | {"description": "its changes, newest first"},
        silenced_by=_array({"type": "string"}) | {"description": "ids of active silences"},
        series=_array({"type": "string"})
        | {"description": "ids of the series that chart it, best first"},
    ),
    "SilenceList": _obj(["silences"], silences=_array(_ref("Silence"))),
    "Move": _obj(
        ["kind", "series", "signal", "score", "words"],
        kind={"type": "string", "enum": ["gpu", "process", "service", "engine"]},
        series={"type": "string", "example": "GPU 2"},
        labels=_STR_MAP,
        signal={"type": "string", "example": "power_w"},
        score={"type": "number", "description": "the highest anomaly score of the last hour"},
        score_now={"type": ["number", "null"]},
        value={"type": ["number", "null"], "description": "the value at that peak"},
        expected={"type": ["number", "null"], "description": "what was expected then"},
        change={"type": ["number", "null"], "description": "value / expected - 1"},
        at={"type": ["number", "null"], "description": "event time of the peak"},
        words={"type": "string", "example": "GPU 2 power -80 %"},
    ),
    "Explanation": _obj(
        ["moves", "summary", "window_s", "min_score"],
        alert=_obj([], fingerprint={"type": "string"}, rule={"type": "string"}),
        host={"type": ["string", "null"]},
        service={"type": ["string", "null"]},
        window_s={"type": "number"},
        min_score={"type": "number"},
        moves=_array(_ref("Move")),
        summary={"type": "string", "example": "GPU 2 power -80 %, utilisation 0 %"},
        charts=_array({"type": "string"})
        | {"description": "the small multiples: chart series ids of the host's GPUs and "
           "processes and of the service instances on it (and of the service's)"},
        requests={"type": "object", "additionalProperties": _ref("Scatter"),
                  "description": "each service's newest requests, for a scatter"},
    ),
    "Scatter": _obj(
        ["features", "points"],
        features=_array({"type": "string"}),
        points=_array(_array({"type": "number"}))
        | {"description": "[context tokens, output tokens, kind]: kind 0 in the usual "
           "clusters, 1 away from them (outliers), 2 in a new cluster flagged now"},
        clusters=_array(_array({"type": "number"})),
        flagged={"type": ["array", "null"], "items": {"type": "number"}},
        label={"type": ["string", "null"]},
    ),
    "SeriesMeta": _obj(
        ["id", "kind"],
        id={"type": "string", "example": "process:gpu-node-01:1:4011:gpu_mem"},
        kind={"type": "string", "enum": ["gpu", "process", "service", "engine"]},
        labels=_STR_MAP,
        signal={"type": "string"},
        unit={"type": "string"},
        rules=_array({"type": "string"}) | {"description": "the rules whose alerts it charts"},
        band={"type": "boolean", "description": "the generic detector's expected value, "
              "score and band: points [ts, value, expected, score, lower, upper]"},
    ),
    "SeriesIndex": _obj(["series", "total", "truncated"], series=_array(_ref("SeriesMeta")),
                        total={"type": "integer"}, truncated={"type": "boolean"}),
    "Series": {
        "allOf": [
            _ref("SeriesMeta"),
            _obj(
                ["columns", "points"],
                columns=_array({"type": "string", "enum": list(BAND_COLUMNS)})
                | {"description": "a band chart (band: true) has lower and upper too"},
                points=_array(_array(_nullable("number")))
                | {"description": "oldest first, a point a minute of event time"},
                memory={**_ref("Memory"), "description": "only on a GPU's or a process's "
                        "memory: what the page draws beside it (null values: no status)"},
            ),
        ]
    },
    "Memory": _obj(
        ["gpu_series", "total_bytes", "used_bytes", "growth_bytes_per_s", "oom_at", "ts"],
        gpu_series={"type": "string", "description": "the id of the GPU's memory series"},
        total_bytes=_nullable("number", description="the GPU's total memory"),
        used_bytes=_nullable("number", description="the GPU's used memory"),
        growth_bytes_per_s=_nullable("number", description="the GPU's memory growth"),
        oom_at=_nullable("number", description="when the GPU runs out of memory at the "
                         "current growth, event time (null: not growing)"),
        ts=_nullable("number", description="the event time of these values"),
    ),
}  # fmt: skip

_AUTH = {"401": _error("missing or wrong bearer token (when RAGWATCH_SERVE_TOKEN is set)")}
_REDIS = {"503": _error("Redis does not answer")}
_BAD = {"400": _error("a query parameter is unknown or out of range")}
_JSON_ANY = {"application/json": {"schema": {"type": "object"}}}
_HTML: dict[str, Any] = {"text/html": {"schema": {}}}
_TEXT = {"text/plain": {"schema": {"type": "string"}}}


def _query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out = {"name": name, "in": "query", "required": False, "schema": schema}
    return out | ({"description": description} if description else {})


def _path(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out = {"name": name, "in": "path", "required": True, "schema": schema}
    return out | ({"description": description} if description else {})


def _limit(maximum: int) -> dict[str, Any]:
    schema = {"type": "integer", "minimum": 1, "maximum": maximum, "default": maximum}
    return _query("limit", schema, "at most this many items")


def _op(
    summary: str,
    ok: dict[str, Any],
    params: list[dict[str, Any]] | None = None,
    errors: dict[str, Any] | None = None,
    *,
    public: bool = False,
) -> dict[str, Any]:
    """One GET operation; data operations need the token and can meet a Redis outage."""
    responses = {"200": ok, **(errors or {})}
    if not public:
        responses |= _AUTH | _REDIS
    if params and any(p["in"] == "query" for p in params):
        responses |= _BAD
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        op["parameters"] = params
    if public:
        op["security"] = []
    return {"get": op}


def _alert_page() -> dict[str, Any]:
    """Where notifications link to. The token is optional: without it, the bare page
    (its script reads the alert with the token it keeps); with it, a 404 page for an
    unknown alert."""
    op = _op(
        "The page of one alert (its script reads /api/v1/alerts/{fingerprint})",
        {"description": "HTML", "content": _HTML},
        [_path("fingerprint", {"type": "string"})],
        {"404": {"description": "HTML: no such alert (only when the token is given)",
                 "content": _HTML}},
    )  # fmt: skip
    op["get"]["security"] = [{}, {"bearerAuth": []}]
    return op


def spec(
    *,
    series_points: int,
    index_max: int,
    alerts_max: int,
    status_max: int = 1000,
    fingerprint_max: int = 128,
) -> dict[str, Any]:
    """The document, with the server's limits filled in."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "ragwatch",
            "version": __version__,
            "description": "Fleet status, alerts, chart series and silences of ragwatch, read "
            "from Redis on each request. If RAGWATCH_SERVE_TOKEN is set, every operation "
            "except /healthz, the pages and their static files needs "
            "'Authorization: Bearer <token>'.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": SCHEMAS,
        },
        "paths": {
            **_api_paths(series_points, index_max, alerts_max, status_max, fingerprint_max),
            **_page_paths(),
        },
    }


def _api_paths(
    series_points: int, index_max: int, alerts_max: int, status_max: int, fingerprint_max: int
) -> dict[str, Any]:
    """The JSON API's operations."""
    kinds = {"type": "string", "enum": ["gpu", "process", "service", "engine"]}
    series_id = {"type": "string", "maxLength": 512}
    return {
        "/api/v1/status": _op(
            "What 'ragwatch status --json' prints, a page of hosts and services at a time",
            _json(_ref("Status"), "status"),
            [
                _limit(status_max) | {"description": "at most this many hosts and services"},
                _query(
                    "offset",
                    {"type": "integer", "minimum": 0, "default": 0},
                    "skip this many hosts and services (each, in name order)",
                ),
            ],
        ),
        "/api/v1/alerts": _op(
            "Active alerts, firing first",
            _json(_ref("AlertList"), "active alerts"),
            [
                _query("state", {"type": "string", "enum": ["firing", "pending"]}),
                _limit(alerts_max),
            ],
        ),
        "/api/v1/alerts/{fingerprint}": _op(
            "One alert, active or resolved: its changes, silences and chart series",
            _json(_ref("AlertDetail"), "the alert"),
            [_path("fingerprint", {"type": "string", "maxLength": fingerprint_max})],
            {"404": _error("not active and not in the alert history")},
        ),
        "/api/v1/explain": _op(
            "The anomaly advisor: the scored signals of an alert's host and services (or of "
            "a host, or a service) ranked by their highest anomaly score of the last hour",
            _json(_ref("Explanation"), "the signals that moved, highest first"),
            [
                _query("fingerprint", {"type": "string", "maxLength": fingerprint_max}),
                _query("host", {"type": "string", "maxLength": fingerprint_max}),
                _query("service", {"type": "string", "maxLength": fingerprint_max}),
                _query("min_score", {"type": "number", "minimum": 0, "maximum": 1, "default": 0.9}),
            ],
            {"404": _error("the alert, host or service is not known")},
        ),
        "/api/v1/series": _op(
            "The index of chart series",
            _json(_ref("SeriesIndex"), "series ids and what they hold, sorted by id"),
            [_query("kind", kinds), _limit(index_max)],
        ),
        "/api/v1/series/{id}": _op(
            "Recent points of one series, oldest first",
            _json(_ref("Series"), "points [ts, value, forecast, score]"),
            [
                _path("id", series_id, "URL-encoded: ids contain ':' and may contain '/'"),
                _limit(series_points),
            ],
            {"404": _error("no such series")},
        ),
        "/api/v1/silences": _op(
            "Silences (created with 'ragwatch silence add')",
            _json(_ref("SilenceList"), "silences, oldest first"),
            [_query("all", {"type": "boolean", "default": False}, "include expired ones")],
        ),
    }


def _page_paths() -> dict[str, Any]:
    """Health, metrics, this document, the pages and their files."""
    return {
        "/healthz": _op(
            "Health: Redis answers a PING and takes writes (never needs the token)",
            _json(_ref("Health"), "Redis answers and takes writes"),
            errors={
                "503": _json(_ref("Health"), "Redis does not answer, or refuses writes: the reason")
            },
            public=True,
        ),
        "/readyz": _op(
            "Readiness: Redis answers a PING, so the console can read it (no token)",
            _json(_ref("Health"), "Redis answers"),
            errors={"503": _json(_ref("Health"), "Redis does not answer: the reason")},
            public=True,
        ),
        "/livez": _op(
            "Liveness: the process answers HTTP; never reads Redis (no token)",
            _json(_ref("Health"), "alive"),
            public=True,
        ),
        "/metrics": _op(
            "Prometheus exposition (text or OpenMetrics, by the Accept header)",
            {"description": "metrics", "content": _TEXT},
        ),
        "/openapi.json": _op("This document", {"description": "OpenAPI 3.0", "content": _JSON_ANY}),
        "/": _op(
            "The live status page (open it once as /?token=...: the page keeps the token "
            "in sessionStorage)",
            {"description": "HTML", "content": _HTML},
            public=True,
        ),
        "/alerts/{fingerprint}": _alert_page(),
        "/static/{path}": _op(
            "The page's script, style and vendored uPlot",
            {"description": "a static file", "content": {"*/*": {"schema": {}}}},
            [_path("path", {"type": "string"})],
            {"404": {"description": "no such file"}},
            public=True,
        ),
    }
