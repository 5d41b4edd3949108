"""One typed, frozen settings object, read from ``RAGWATCH_*`` environment variables.

Only ``main()`` reads the environment (``Settings.from_env(os.environ)``); everything
else receives a :class:`Settings`. Secrets are :class:`Secret` and never printed. Every
value is parsed and bounded where it is read (:mod:`ragwatch.setting_values`: a port is
1..65535, a session timeout what Kafka brokers accept, a topic prefix Kafka's characters);
a bad one is one :class:`~ragwatch.errors.ConfigError` line naming the variable.

>>> s = Settings.from_env({"RAGWATCH_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
...                        "RAGWATCH_TOPIC_PREFIX": "prod."})
>>> s.topic("gpu")
'prod.ragwatch.gpu'
>>> s.kafka_config()["bootstrap.servers"]
'k1:9092,k2:9092'
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ragwatch import setting_values as values
from ragwatch.errors import ConfigError
from ragwatch.setting_values import parse_duration as parse_duration

PREFIX = "RAGWATCH_"
# settings of earlier releases that no longer do anything: accepted (a deployment that sets
# them still starts), with a warning that says why
RETIRED = {
    "RAGWATCH_SNAPSHOT_LEGACY": "snapshots of versions 5 and 6 (pickles) are no longer read "
    "(ragwatch 0.2); a worker meeting one starts that host or service afresh",
}
log = logging.getLogger(__name__)
TOPICS = ("gpu", "requests", "events", "metrics", "alerts", "deadletter", "facts")
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


def _http_url(url: str) -> bool:
    """Whether ``url`` is ``http(s)://host[:port]...`` with a valid port and no spaces."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # a bad port raises ValueError
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and url.isprintable()
        and (not any(c.isspace() for c in url))
    )


def _url_list(v: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in v.split(",") if u.strip())
    for u in urls:
        if not _http_url(u):
            raise ValueError(f"webhook URLs must be http(s)://host..., got {mask_webhook(u)!r}")
    return urls


def _external_url(v: str) -> str:
    """Links in notifications start with it: http(s) only (a ``javascript:`` or ``file:``
    link would be followed by whoever clicks it), no credentials (every notification
    carries it), no query or fragment (``/alerts/<id>`` is appended); empty = no links."""
    if not v:
        return v
    if not _http_url(v):
        raise ValueError(f"expected an http(s)://host[:port][/path] URL, got {redact_url(v)!r}")
    parts = urlsplit(v)
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"must not hold a user or password (every notification carries it), got "
            f"{redact_url(v)!r}"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"must not have a query or fragment (links append /alerts/...), got {v!r}")
    return v


def _redis_url(v: str) -> str:
    if urlsplit(v).scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"expected redis://, rediss:// or unix:// URL, got {redact_url(v)!r}")
    span = _userinfo(v)
    if span is not None and any(c in v[span[0] : span[1]] for c in "/?#"):
        raise ValueError(  # a URL parser would take part of the password for the host
            "the user or password holds '/', '?' or '#': percent-encode them "
            f"(%2F, %3F, %23), got {redact_url(v)!r}"
        )
    parts = urlsplit(v)
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(f"bad port in {redact_url(v)!r}") from None
    db = parts.path.strip("/")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"expected unix:///path/to/redis.sock, got {redact_url(v)!r}")
    if parts.scheme != "unix" and (not parts.hostname or not (db == "" or db.isdigit())):
        raise ValueError(
            f"expected {parts.scheme}://[[user]:password@]host[:port][/db number], "
            f"got {redact_url(v)!r}"
        )
    return v


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


_TOPIC_CHAR = r"[A-Za-z0-9._-]"  # Kafka's legal characters of topic names
MAX_TOPIC_NAME = 249  # Kafka's longest topic name
_LONGEST_TOPIC = max(len(f"ragwatch.{t}") for t in TOPICS)


def mask_webhook(url: str) -> str:
    """Webhook URLs often carry their secret in the path (Slack): keep scheme and host only."""
    span = _userinfo(url)
    if span is not None:  # whatever the userinfo holds, it goes
        url = url[: span[0]] + url[span[1] + 1 :]
    parts = urlsplit(url)
    host = parts.netloc
    return f"{parts.scheme}://{host}/***" if parts.path.strip("/") else f"{parts.scheme}://{host}"


def _setting(default: Any, parse: Callable[[str], Any], doc: str, *, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={"parse": parse, "doc": doc})


@dataclass(frozen=True)
class Settings:
    """Every knob of ragwatch. Field ``foo_bar`` is read from ``RAGWATCH_FOO_BAR``."""

    kafka_bootstrap: str = _setting(
        "localhost:9092", _bootstrap, "Kafka bootstrap servers, host:port[,host:port]"
    )
    kafka_security_protocol: str = _setting(
        "PLAINTEXT", values.choice(SECURITY_PROTOCOLS), "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    )
    kafka_sasl_mechanism: str = _setting(
        "PLAIN", values.choice(SASL_MECHANISMS), "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
    )
    kafka_sasl_username: str = _setting("", values.text, "SASL username")
    kafka_sasl_password: Secret = _setting(Secret(""), Secret, "SASL password (secret)")
    kafka_ssl_cafile: Path | None = _setting(
        None, values.ca_file, "CA bundle for SSL/SASL_SSL (a file)"
    )
    kafka_session_timeout: float = _setting(
        10.0,
        values.seconds(6.0, 1800.0),
        "consumer group session timeout, seconds, 6 s..30 min (what Kafka brokers accept by "
        "default: group.min/max.session.timeout.ms)",
    )
    kafka_fetch_max_wait_ms: int = _setting(
        100,
        values.integer(1, 30_000, " ms"),
        "longest a worker's or the notifier's fetch waits for data, ms, 1..30000 (Faust's "
        "fixed 1500 delays every alert on brokers that hold a fetch for the whole wait; more "
        "than 30 s nears aiokafka's 40 s request timeout, and every alert waits that long)",
    )
    topic_prefix: str = _setting(
        "",
        values.name(
            "a topic name takes letters, digits, '.', '_' and '-' (Kafka)",
            _TOPIC_CHAR,
            MAX_TOPIC_NAME - _LONGEST_TOPIC,
            empty=True,
        ),
        f"prefix for every topic name, e.g. 'prod.' (Kafka's topic characters; at most "
        f"{MAX_TOPIC_NAME - _LONGEST_TOPIC}: topic names end at {MAX_TOPIC_NAME})",
    )
    topic_partitions: int = _setting(
        4,
        values.integer(1, 1000),
        "partitions of topics ragwatch creates, 1..1000 (the most workers that share a topic; "
        "six topics of 1000 are more partitions than Kafka advises a broker to hold)",
    )
    app_id: str = _setting(
        "ragwatch",
        values.name(
            "expected letters, digits, '.', '_' or '-' (it names a Kafka consumer group and a "
            "directory)",
            _TOPIC_CHAR,
            200,
        ),
        "Faust app id = Kafka consumer group of workers",
    )
    worker_id: str = _setting(
        "",
        values.name(
            "expected a name without spaces or control characters",
            r"[^\s\x00-\x1f\x7f]",
            253,
            empty=True,
        ),
        "a worker's name in status and /metrics (label worker); empty: the host name, a pod's "
        "name under Kubernetes. Set it apart for each of several workers on one host",
    )
    redis_url: str = _setting(
        "redis://localhost:6379/0", _redis_url, "Redis URL (redis:// or rediss://)", secret=True
    )
    redis_prefix: str = _setting(
        "ragwatch",
        values.name(
            "expected a prefix without spaces or control characters", r"[^\s\x00-\x1f\x7f]", 100
        ),
        "prefix of every Redis key",
    )
    webhook_urls: tuple[str, ...] = _setting(
        (), _url_list, "comma-separated http(s) URLs that receive alert webhooks", secret=True
    )
    webhook_timeout: float = _setting(
        5.0,
        values.seconds(0.1, 300.0),
        "webhook request timeout, seconds, 0.1 s..5 min (a receiver slower than that is down; "
        "each attempt holds the receiver's queue that long)",
    )
    webhook_max_attempts: int = _setting(
        8,
        values.integer(1, 1000),
        "webhook delivery attempts before giving up, 1..1000 (1000 are over 3 days of retries "
        "at the 5-minute backoff cap)",
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
        values.seconds(1.0, 3600.0),
        "seconds between two posts of a firing alert to Alertmanager (Prometheus' resend "
        "delay), 1 s..1 h (faster floods Alertmanager; endsAt is 4 resends ahead, so an alert "
        "of a stopped notifier would stay firing for 4 h at the most)",
    )
    rules_file: Path | None = _setting(
        None,
        values.optional_path,
        "YAML rules file (checked when read); empty = the shipped default rules",
    )
    external_url: str = _setting(
        "http://localhost:8080",
        _external_url,
        "http(s) URL of 'ragwatch serve' put in notifications (links); no credentials, query "
        "or fragment; empty = no links",
    )
    notify_file: Path | None = _setting(
        None,
        values.optional_path,
        "YAML receivers/routes/inhibit rules of 'ragwatch notify' (checked when read); empty = "
        "one webhook receiver for RAGWATCH_WEBHOOK_URLS",
    )
    webhook_hmac_secret: Secret = _setting(
        Secret(""), Secret, "signs webhook bodies (X-Ragwatch-Signature) if set (secret)"
    )
    serve_host: str = _setting(
        "127.0.0.1",
        values.bind_host,
        "bind address of 'ragwatch serve' (an IP address or host name)",
    )
    serve_port: int = _setting(8080, values.port, "port of 'ragwatch serve'")
    serve_token: Secret = _setting(
        Secret(""), Secret, "bearer token 'ragwatch serve' requires if set (secret)"
    )
    state_dir: Path = _setting(
        Path(".ragwatch"),
        values.state_dir,
        "where 'ragwatch dev up' keeps pids, ports and logs, and the worker its Faust data "
        "(not under /proc, /sys or /dev; created by the command that uses it)",
    )
    max_series: int = _setting(
        100_000,
        values.integer(1, 10_000_000),
        "cap on tracked series per worker (new ones are dropped), 1..10,000,000 (at ~3 KB a "
        "GPU series and up to ~100 KB a request series, more would not fit in memory)",
    )
    max_clock_skew: float = _setting(
        3600.0,
        values.seconds(1.0, 36500 * values.DAY),
        "envelopes stamped more than this many seconds ahead of the worker's clock are "
        "dead-lettered (event time would jump ahead), 1 s..100 years (replays of simulated "
        "data stamped ahead set years; clocks in sync differ by less than a second)",
    )
    slow_message: float = _setting(
        1.0,
        values.seconds(0.001, 1800.0),
        "seconds: processing one message (or one batch of GPU messages) for longer holds "
        "every partition of the worker; it is logged and counted (slow_messages); 1 ms..30 min "
        "(longer than the longest session timeout, the worker has left its group anyway)",
    )
    hint_wait: float = _setting(
        10.0,
        values.seconds(0.0, 300.0),
        "seconds a worker waits, at most, before it sends an alert whose hint needs another "
        "worker's facts (a host's GPUs, the services on it) until that worker has read up "
        "to the alert's time; 0: never wait (a hint may then miss the other side), 0..300 s",
    )
    score_signals: bool = _setting(
        True,
        values.boolean,
        "score every numeric signal of every series with the generic detector (its score, "
        "expected value and band in status, /metrics and `ragwatch explain`; the anomaly "
        "rules read them); false: none is scored, and rules on scores never fire",
    )
    snapshot_interval: float = _setting(
        10.0,
        values.seconds(0.1, 3600.0),
        "seconds between two state snapshots of a changing host or service in Redis "
        "(what a restarted worker resumes from), 0.1 s..1 h (committed offsets wait for "
        "snapshots: a restart re-reads up to this much)",
    )
    status_interval: float = _setting(
        5.0,
        values.seconds(0.1, 600.0),
        "seconds between two status writes of a changing host or service in Redis (what "
        "'ragwatch status', the API and the live page show; a new one is written at once), "
        "0.1 s..10 min (a status older than that no longer tells what a host is doing)",
    )
    otlp_topic: str = _setting(
        "otlp_spans",
        values.name(
            "a topic name takes letters, digits, '.', '_' and '-' (Kafka)",
            _TOPIC_CHAR,
            MAX_TOPIC_NAME,
            empty=True,
        ),
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
        values.seconds(0.1, 3600.0),
        "seconds of event time after a trace's newest span before its requests are emitted "
        "(spans of one trace arrive in several messages), 0.1 s..1 h (the worker holds every "
        "open trace that long, and its requests' signals wait for it)",
    )
    otlp_stage_patterns: str = _setting(
        "",
        _stage_patterns,
        "stage=regex pairs separated by ';' mapping custom span names to stages, checked "
        "before the semantic conventions, e.g. 'retriever=^vector_search'",
    )
    log_level: str = _setting(
        "INFO", values.choice(("DEBUG", "INFO", "WARNING", "ERROR")), "log level of ragwatch"
    )
    explicit: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Build settings from ``RAGWATCH_*`` variables; ``ConfigError`` names the bad one."""
        parsed: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if "parse" not in f.metadata:
                continue
            name = PREFIX + f.name.upper()
            if name in env:
                raw = env[name] if f.type == "Secret" else env[name].strip()
                try:
                    parsed[f.name] = f.metadata["parse"](raw)
                except ValueError as exc:
                    raise ConfigError(f"{name}: {exc}") from None
        names = env_names()
        unknown = sorted(
            k for k in env if k.startswith(PREFIX) and k not in names and k not in RETIRED
        )
        for k in sorted(RETIRED.keys() & env.keys()):
            log.warning("%s has no effect any more: %s", k, RETIRED[k])
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        return cls(**parsed, explicit=frozenset(parsed)).validated()

    def validated(self) -> Settings:
        """The checks that involve several settings (ConfigError names the variable)."""
        if self.kafka_security_protocol.startswith("SASL") and not self.kafka_sasl_username:
            raise ConfigError(
                "RAGWATCH_KAFKA_SASL_USERNAME: required when the security protocol is SASL_*"
            )
        otlp = self.otlp_topic_name()
        if otlp is not None and len(otlp) > MAX_TOPIC_NAME:
            raise ConfigError(
                f"RAGWATCH_OTLP_TOPIC: with the topic prefix {len(otlp)} characters, more than "
                f"Kafka's {MAX_TOPIC_NAME}"
            )
        if otlp in {self.topic(t) for t in TOPICS}:
            raise ConfigError(f"RAGWATCH_OTLP_TOPIC: {otlp!r} is one of ragwatch's own topics")
        return self

    def state_subdir(self, *parts: str) -> Path:
        """``state_dir/parts...``, created if missing, for a command that writes there; a
        ConfigError (one line) if it cannot be created or written."""
        path = self.state_dir.joinpath(*parts)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"RAGWATCH_STATE_DIR: cannot create {path}: {exc.strerror or exc}"
            ) from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"RAGWATCH_STATE_DIR: {path} is not writable by this user")
        return path

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
        """Every setting as ``RAGWATCH_NAME -> printable value``: a secret that is set as
        ``**********``, one that is not as ``""`` (like every unset value), passwords in
        URLs and webhook paths masked."""
        out = {}
        for f in dataclasses.fields(self):
            if "parse" not in f.metadata:
                continue
            v = getattr(self, f.name)
            if isinstance(v, Secret):
                v = "**********" if v else ""  # empty: not set
            elif isinstance(v, tuple):
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
