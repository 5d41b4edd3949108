"""One typed, frozen settings object, read from ``RAGWATCH_*`` environment variables.

Only ``main()`` reads the environment (``Settings.from_env(os.environ)``); everything
else receives a :class:`Settings`. Secrets are :class:`Secret` and never printed.

>>> s = Settings.from_env({"RAGWATCH_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
...                        "RAGWATCH_TOPIC_PREFIX": "prod."})
>>> s.topic("gpu")
'prod.ragwatch.gpu'
>>> s.kafka_config()["bootstrap.servers"]
'k1:9092,k2:9092'
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ragwatch.errors import ConfigError

PREFIX = "RAGWATCH_"
TOPICS = ("gpu", "requests", "events", "metrics", "alerts", "deadletter")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HOSTPORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:(\d{1,5})$")


class Secret:
    """A string that never shows itself in ``repr``/``str`` (like pydantic's SecretStr)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')" if self._value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)


def _userinfo(url: str) -> tuple[int, int] | None:
    """Where the userinfo of ``scheme://userinfo@host...`` lies (start, end), taking the
    last ``@`` as its end: a password with an unescaped ``/``, ``?``, ``#`` or ``@``
    (common in base64) is all userinfo to us, whatever a URL parser makes of it."""
    start = url.find("://")
    end = url.rfind("@")
    return (start + 3, end) if start >= 0 and end > start + 3 else None


def redact_url(url: str) -> str:
    """Mask passwords in a URL, in the userinfo and in a ``password=`` query parameter,
    whatever characters the password holds.

    >>> redact_url("redis://user:pw@host:6379/0?password=x&db=1")
    'redis://user:***@host:6379/0?password=***&db=1'
    >>> redact_url("redis://:a/b#c?d@host:6379/0")
    'redis://:***@host:6379/0'
    """
    span = _userinfo(url)
    if span is not None:
        user, colon, _ = url[span[0] : span[1]].partition(":")
        garbled = any(c in user for c in "/?#")  # a password with no ':' before it
        if colon or garbled:
            url = f"{url[: span[0]]}{'' if garbled else user}:***{url[span[1] :]}"
    parts = urlsplit(url)
    query = "&".join(
        f"{kv.split('=', 1)[0]}=***" if kv.split("=", 1)[0].lower() == "password" else kv
        for kv in parts.query.split("&")
    )
    return url if query == parts.query else urlunsplit(parts._replace(query=query))


def _bootstrap(v: str) -> str:
    servers = [s.strip() for s in v.split(",") if s.strip()]
    matches = [_HOSTPORT.match(s) for s in servers]
    if not servers or not all(m and 1 <= int(m.group(1)) <= 65535 for m in matches):
        raise ValueError(f"expected host:port[,host:port...], got {v!r}")
    return ",".join(servers)


def _url_list(v: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in v.split(",") if u.strip())
    for u in urls:
        if urlsplit(u).scheme not in ("http", "https") or not urlsplit(u).netloc:
            raise ValueError(f"webhook URLs must be http(s)://host..., got {mask_webhook(u)!r}")
    return urls


def _redis_url(v: str) -> str:
    if urlsplit(v).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"expected redis://, rediss:// or unix:// URL, got {redact_url(v)!r}")
    span = _userinfo(v)
    if span is not None and any(c in v[span[0] : span[1]] for c in "/?#"):
        raise ValueError(  # a URL parser would take part of the password for the host
            "the user or password holds '/', '?' or '#': percent-encode them "
            f"(%2F, %3F, %23), got {redact_url(v)!r}"
        )
    return v


def _positive_float(v: str) -> float:
    f = float(v)
    if not (f > 0 and math.isfinite(f)):
        raise ValueError(f"must be > 0, got {v!r}")
    return f


def _positive_int(v: str) -> int:
    i = int(v)
    if i <= 0:
        raise ValueError(f"must be > 0, got {v!r}")
    return i


def _bool(v: str) -> bool:
    low = v.lower()
    if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise ValueError(f"must be true or false, got {v!r}")
    return low in ("true", "1", "yes", "on")


def _port(v: str) -> int:
    i = int(v)
    if not 0 < i < 65536:
        raise ValueError(f"must be a port in 1..65535, got {v!r}")
    return i


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v.upper() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {v!r}")
        return v.upper()

    return parse


OTLP_ENCODINGS = ("auto", "otlp_proto", "otlp_json")


def _otlp_encoding(v: str) -> str:
    v = v.strip().lower()
    if v not in OTLP_ENCODINGS:
        raise ValueError(f"expected one of {', '.join(OTLP_ENCODINGS)}, got {v!r}")
    return v


def parse_stage_patterns(spec: str) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """``stage=regex;stage=regex`` as (stage, compiled regex) pairs; ValueError names the
    bad pair.

    >>> [(s, p.pattern) for s, p in parse_stage_patterns("retriever=^search; llm=generate")]
    [('retriever', '^search'), ('llm', 'generate')]
    """
    pairs = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        stage, sep, rx = part.partition("=")
        if not sep or not stage.strip() or not rx:
            raise ValueError(f"expected stage=regex, got {part!r}")
        try:
            pairs.append((stage.strip(), re.compile(rx)))
        except re.error as exc:
            raise ValueError(f"{part!r}: bad regular expression: {exc}") from None
    return tuple(pairs)


def _stage_patterns(v: str) -> str:
    parse_stage_patterns(v)
    return v


def _opt_path(v: str) -> Path | None:
    return Path(v) if v else None


def mask_webhook(url: str) -> str:
    """Webhook URLs often carry their secret in the path (Slack): keep scheme and host only."""
    span = _userinfo(url)
    if span is not None:  # whatever the userinfo holds, it goes
        url = url[: span[0]] + url[span[1] + 1 :]
    parts = urlsplit(url)
    host = parts.netloc
    return f"{parts.scheme}://{host}/***" if parts.path.strip("/") else f"{parts.scheme}://{host}"


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(v: str | float) -> float:
    """Seconds from ``"90"``, ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"`` or a number.

    >>> parse_duration("10m"), parse_duration(5)
    (600.0, 5.0)
    """
    if isinstance(v, int | float) and not isinstance(v, bool):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"duration must be finite and >= 0, got {v!r}")
        return float(v)
    m = _DURATION.match(str(v).strip())
    if not m:
        raise ValueError(f"bad duration {v!r} (use e.g. 30s, 10m, 2h)")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]


def _setting(default: Any, parse: Callable[[str], Any], doc: str, *, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={"parse": parse, "doc": doc})


@dataclass(frozen=True)
class Settings:
    """Every knob of ragwatch. Field ``foo_bar`` is read from ``RAGWATCH_FOO_BAR``."""

    kafka_bootstrap: str = _setting(
        "localhost:9092", _bootstrap, "Kafka bootstrap servers, host:port[,host:port]"
    )
    kafka_security_protocol: str = _setting(
        "PLAINTEXT", _choice(SECURITY_PROTOCOLS), "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )
    kafka_sasl_mechanism: str = _setting(
        "PLAIN", _choice(SASL_MECHANISMS), "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
    )
    kafka_sasl_username: str = _setting("", str, "SASL username")
    kafka_sasl_password: Secret = _setting(Secret(""), Secret, "SASL password (secret)")
    kafka_ssl_cafile: Path | None = _setting(None, _opt_path, "CA bundle for SSL/SASL_SSL")
    kafka_session_timeout: float = _setting(
        10.0, _positive_float, "consumer group session timeout, seconds"
    )
    kafka_fetch_max_wait_ms: int = _setting(
        100,
        _positive_int,
        "longest a worker's or the notifier's fetch waits for data, ms (Faust's fixed 1500 "
        "delays every alert on brokers that hold a fetch for the whole wait)",
    )
    topic_prefix: str = _setting("", str, "prefix for every topic name, e.g. 'prod.'")
    topic_partitions: int = _setting(4, _positive_int, "partitions of topics ragwatch creates")
    app_id: str = _setting("ragwatch", str, "Faust app id = Kafka consumer group of workers")
    worker_id: str = _setting(
        "",
        str,
        "a worker's name in status and /metrics (label worker); empty: the host name, a pod's "
        "name under Kubernetes. Set it apart for each of several workers on one host",
    )
    redis_url: str = _setting(
        "redis://localhost:6379/0", _redis_url, "Redis URL (redis:// or rediss://)", secret=True
    )
    redis_prefix: str = _setting("ragwatch", str, "prefix of every Redis key")
    webhook_urls: tuple[str, ...] = _setting(
        (), _url_list, "comma-separated http(s) URLs that receive alert webhooks", secret=True
    )
    webhook_timeout: float = _setting(5.0, _positive_float, "webhook request timeout, seconds")
    webhook_max_attempts: int = _setting(
        8, _positive_int, "webhook delivery attempts before giving up"
    )
    alertmanager_urls: tuple[str, ...] = _setting(
        (),
        _url_list,
        "comma-separated base URLs of Alertmanagers the notifier posts alerts to (/api/v2/alerts), "
        "as Prometheus does",
        secret=True,
    )
    alertmanager_resend: float = _setting(
        60.0,
        _positive_float,
        "seconds between two posts of a firing alert to Alertmanager (Prometheus' resend delay)",
    )
    rules_file: Path | None = _setting(
        None, _opt_path, "YAML rules file; empty = the shipped default rules"
    )
    external_url: str = _setting(
        "http://localhost:8080", str, "URL of 'ragwatch serve' put in notifications (links)"
    )
    notify_file: Path | None = _setting(
        None,
        _opt_path,
        "YAML receivers/routes/inhibit rules of 'ragwatch notify'; empty = one webhook "
        "receiver for RAGWATCH_WEBHOOK_URLS",
    )
    webhook_hmac_secret: Secret = _setting(
        Secret(""), Secret, "signs webhook bodies (X-Ragwatch-Signature) if set (secret)"
    )
    serve_host: str = _setting("127.0.0.1", str, "bind address of 'ragwatch serve'")
    serve_port: int = _setting(8080, _port, "port of 'ragwatch serve'")
    serve_token: Secret = _setting(
        Secret(""), Secret, "bearer token 'ragwatch serve' requires if set (secret)"
    )
    state_dir: Path = _setting(
        Path(".ragwatch"),
        Path,
        "where 'ragwatch dev up' keeps pids, ports and logs, and the worker its Faust data",
    )
    max_series: int = _setting(
        100_000, _positive_int, "cap on tracked series per worker (new ones are dropped)"
    )
    max_clock_skew: float = _setting(
        3600.0,
        _positive_float,
        "envelopes stamped more than this many seconds ahead of the worker's clock are "
        "dead-lettered (event time would jump ahead)",
    )
    slow_message: float = _setting(
        1.0,
        _positive_float,
        "seconds: processing one message (or one batch of GPU messages) for longer holds "
        "every partition of the worker; it is logged and counted (slow_messages)",
    )
    snapshot_interval: float = _setting(
        10.0,
        _positive_float,
        "seconds between two state snapshots of a changing host or service in Redis "
        "(what a restarted worker resumes from)",
    )
    snapshot_legacy: bool = _setting(
        True,
        _bool,
        "read snapshots of the previous format (pickles) once, during a rolling upgrade; "
        "set false to never unpickle",
    )
    status_interval: float = _setting(
        5.0,
        _positive_float,
        "seconds between two status writes of a changing host or service in Redis (what "
        "'ragwatch status', the API and the live page show; a new one is written at once)",
    )
    otlp_topic: str = _setting(
        "otlp_spans",
        str,
        "topic of OTLP traces the worker reads (the OTel Collector's Kafka exporter's default; "
        "with the topic prefix); empty = none",
    )
    otlp_encoding: str = _setting(
        "auto",
        _otlp_encoding,
        "otlp_proto, otlp_json, or auto (detected per message)",
    )
    otlp_grace: float = _setting(
        30.0,
        _positive_float,
        "seconds of event time after a trace's newest span before its requests are emitted "
        "(spans of one trace arrive in several messages)",
    )
    otlp_stage_patterns: str = _setting(
        "",
        _stage_patterns,
        "stage=regex pairs separated by ';' mapping custom span names to stages, checked "
        "before the semantic conventions, e.g. 'retriever=^vector_search'",
    )
    log_level: str = _setting(
        "INFO", _choice(("DEBUG", "INFO", "WARNING", "ERROR")), "log level of ragwatch"
    )
    explicit: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from ``RAGWATCH_*`` variables; ``ConfigError`` names the bad one."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if "parse" not in f.metadata:
                continue
            name = PREFIX + f.name.upper()
            if name in env:
                raw = env[name] if f.type == "Secret" else env[name].strip()
                try:
                    values[f.name] = f.metadata["parse"](raw)
                except ValueError as exc:
                    raise ConfigError(f"{name}: {exc}") from None
        unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in env_names())
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        return cls(**values, explicit=frozenset(values)).validated()

    def validated(self) -> Settings:
        if self.kafka_security_protocol.startswith("SASL") and not self.kafka_sasl_username:
            raise ConfigError(
                "RAGWATCH_KAFKA_SASL_USERNAME: required when the security protocol is SASL_*"
            )
        return self

    def topic(self, name: str) -> str:
        """Full topic name for one of :data:`TOPICS`, with the configured prefix."""
        if name not in TOPICS:
            raise ValueError(f"unknown topic {name!r}; expected one of {TOPICS}")
        return f"{self.topic_prefix}ragwatch.{name}"

    def otlp_topic_name(self) -> str | None:
        """The OTLP traces topic, with the prefix (None: the worker reads none)."""
        return f"{self.topic_prefix}{self.otlp_topic}" if self.otlp_topic else None

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka (confluent-kafka) options (:class:`ragwatch.kafka.KafkaClient`)."""
        from ragwatch.kafka import KafkaClient

        return KafkaClient.of(self).librdkafka()

    def describe(self) -> dict[str, str]:
        """Every setting as ``RAGWATCH_NAME -> printable value`` (secrets masked)."""
        out = {}
        for f in dataclasses.fields(self):
            if "parse" not in f.metadata:
                continue
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                v = ",".join(mask_webhook(u) for u in v)
            elif f.name == "redis_url":
                v = redact_url(v)
            out[PREFIX + f.name.upper()] = "" if v is None else str(v)
        return out


def env_names() -> dict[str, str]:
    """``RAGWATCH_*`` variable name -> its documentation line."""
    return {
        PREFIX + f.name.upper(): f.metadata["doc"]
        for f in dataclasses.fields(Settings)
        if "doc" in f.metadata
    }
