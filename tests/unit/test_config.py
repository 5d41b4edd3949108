"""Settings: defaults, every ``RAGWATCH_*`` variable, errors that name the variable, the
Kafka option mapping, and secrets that never show in ``repr``/``str``/``describe()``.

Settings are built from plain dicts passed to ``Settings.from_env``; the process
environment is never read or changed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from ragwatch.config import (
    PREFIX,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    TOPICS,
    Secret,
    Settings,
    env_names,
    mask_webhook,
    redact_url,
)
from ragwatch.errors import ConfigError, RagwatchError

CA_FILE = str(Path(__file__).resolve())  # any readable file stands for a CA bundle
SASL_ENV = {
    "RAGWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "RAGWATCH_KAFKA_SASL_USERNAME": "ragwatch-svc",
}


def setting_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Settings) if "parse" in f.metadata]


# ---------------------------------------------------------------- defaults


def test_empty_environment_gives_the_defaults() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert s.kafka_bootstrap == "localhost:9092"
    assert s.kafka_security_protocol == "PLAINTEXT"
    assert s.kafka_sasl_mechanism == "PLAIN"
    assert s.kafka_sasl_username == ""
    assert s.kafka_sasl_password == Secret("")
    assert not s.kafka_sasl_password
    assert s.kafka_ssl_cafile is None
    assert s.kafka_session_timeout == 10.0
    assert s.topic_prefix == ""
    assert s.topic_partitions == 4
    assert s.app_id == "ragwatch"
    assert s.redis_url == "redis://localhost:6379/0"
    assert s.redis_prefix == "ragwatch"
    assert s.webhook_urls == ()
    assert s.webhook_timeout == 5.0
    assert s.webhook_max_attempts == 8
    assert s.rules_file is None
    assert s.external_url == "http://localhost:8080"
    assert s.state_dir == Path(".ragwatch")
    assert s.max_series == 100_000
    assert s.log_level == "INFO"
    assert s.explicit == frozenset()


def test_default_kafka_config_is_plaintext_to_localhost() -> None:
    assert Settings.from_env({}).kafka_config() == {
        "bootstrap.servers": "localhost:9092",
        "security.protocol": "PLAINTEXT",
    }


def test_variables_without_the_prefix_are_ignored() -> None:
    env = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "ragwatch_kafka_bootstrap": "x",
        "KAFKA_BOOTSTRAP": "nope",
        "XRAGWATCH_FOO": "1",
    }
    assert Settings.from_env(env) == Settings()


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.app_id = "other"  # type: ignore[misc]


# ---------------------------------------------------------------- every variable

PARSED: list[tuple[str, str, str, Any]] = [
    ("RAGWATCH_KAFKA_BOOTSTRAP", "k1:9092", "kafka_bootstrap", "k1:9092"),
    (
        "RAGWATCH_KAFKA_BOOTSTRAP",
        " k1:9092 , k2.example.com:19092, ",
        "kafka_bootstrap",
        "k1:9092,k2.example.com:19092",
    ),
    (
        "RAGWATCH_KAFKA_BOOTSTRAP",
        "[::1]:9092,10.0.0.7:9093",
        "kafka_bootstrap",
        "[::1]:9092,10.0.0.7:9093",
    ),
    ("RAGWATCH_KAFKA_SECURITY_PROTOCOL", "SSL", "kafka_security_protocol", "SSL"),
    ("RAGWATCH_KAFKA_SECURITY_PROTOCOL", "ssl", "kafka_security_protocol", "SSL"),
    ("RAGWATCH_KAFKA_SECURITY_PROTOCOL", "plaintext", "kafka_security_protocol", "PLAINTEXT"),
    ("RAGWATCH_KAFKA_SASL_MECHANISM", "scram-sha-512", "kafka_sasl_mechanism", "SCRAM-SHA-512"),
    ("RAGWATCH_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256", "kafka_sasl_mechanism", "SCRAM-SHA-256"),
    ("RAGWATCH_KAFKA_SASL_USERNAME", "alice", "kafka_sasl_username", "alice"),
    ("RAGWATCH_KAFKA_SASL_PASSWORD", "s3cr3t", "kafka_sasl_password", Secret("s3cr3t")),
    ("RAGWATCH_KAFKA_SSL_CAFILE", CA_FILE, "kafka_ssl_cafile", Path(CA_FILE)),
    ("RAGWATCH_KAFKA_SSL_CAFILE", "", "kafka_ssl_cafile", None),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "45", "kafka_session_timeout", 45.0),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "6", "kafka_session_timeout", 6.0),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "10m", "kafka_session_timeout", 600.0),
    ("RAGWATCH_TOPIC_PREFIX", "prod.", "topic_prefix", "prod."),
    ("RAGWATCH_TOPIC_PARTITIONS", "12", "topic_partitions", 12),
    ("RAGWATCH_TOPIC_PARTITIONS", " 3 ", "topic_partitions", 3),
    ("RAGWATCH_APP_ID", "ragwatch-eu", "app_id", "ragwatch-eu"),
    ("RAGWATCH_WORKER_ID", "worker-eu-1", "worker_id", "worker-eu-1"),
    (
        "RAGWATCH_REDIS_URL",
        "rediss://cache.internal:6380/2",
        "redis_url",
        "rediss://cache.internal:6380/2",
    ),
    ("RAGWATCH_REDIS_URL", "redis://:pw@r:6379/0", "redis_url", "redis://:pw@r:6379/0"),
    ("RAGWATCH_REDIS_URL", "unix:///run/redis.sock", "redis_url", "unix:///run/redis.sock"),
    ("RAGWATCH_REDIS_PREFIX", "rw", "redis_prefix", "rw"),
    (
        "RAGWATCH_WEBHOOK_URLS",
        "https://hooks.example.com/a",
        "webhook_urls",
        ("https://hooks.example.com/a",),
    ),
    (
        "RAGWATCH_WEBHOOK_URLS",
        " http://a:8080/x , https://b/y ,,",
        "webhook_urls",
        ("http://a:8080/x", "https://b/y"),
    ),
    ("RAGWATCH_WEBHOOK_URLS", "", "webhook_urls", ()),
    ("RAGWATCH_WEBHOOK_TIMEOUT", "2.5", "webhook_timeout", 2.5),
    ("RAGWATCH_WEBHOOK_MAX_ATTEMPTS", "3", "webhook_max_attempts", 3),
    ("RAGWATCH_RULES_FILE", "rules/prod.yaml", "rules_file", Path("rules/prod.yaml")),
    ("RAGWATCH_RULES_FILE", "  ", "rules_file", None),
    (
        "RAGWATCH_EXTERNAL_URL",
        "https://ragwatch.example.com",
        "external_url",
        "https://ragwatch.example.com",
    ),
    ("RAGWATCH_STATE_DIR", "/var/lib/ragwatch", "state_dir", Path("/var/lib/ragwatch")),
    ("RAGWATCH_MAX_SERIES", "500", "max_series", 500),
    ("RAGWATCH_SNAPSHOT_INTERVAL", "30", "snapshot_interval", 30.0),
    ("RAGWATCH_STATUS_INTERVAL", "2.5", "status_interval", 2.5),
    ("RAGWATCH_SLOW_MESSAGE", "0.5", "slow_message", 0.5),
    ("RAGWATCH_MAX_CLOCK_SKEW", "60", "max_clock_skew", 60.0),
    ("RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS", "20", "kafka_fetch_max_wait_ms", 20),
    ("RAGWATCH_NOTIFY_FILE", "notify.yaml", "notify_file", Path("notify.yaml")),
    ("RAGWATCH_NOTIFY_FILE", "", "notify_file", None),
    ("RAGWATCH_WEBHOOK_HMAC_SECRET", "s3cr3t", "webhook_hmac_secret", Secret("s3cr3t")),
    ("RAGWATCH_SERVE_HOST", "0.0.0.0", "serve_host", "0.0.0.0"),
    ("RAGWATCH_SERVE_PORT", "9000", "serve_port", 9000),
    ("RAGWATCH_SERVE_TOKEN", "tok", "serve_token", Secret("tok")),
    ("RAGWATCH_LOG_LEVEL", "debug", "log_level", "DEBUG"),
    ("RAGWATCH_LOG_LEVEL", "WARNING", "log_level", "WARNING"),
    (
        "RAGWATCH_ALERTMANAGER_URLS",
        "http://am-1:9093, http://am-2:9093",
        "alertmanager_urls",
        ("http://am-1:9093", "http://am-2:9093"),
    ),
    ("RAGWATCH_ALERTMANAGER_RESEND", "30", "alertmanager_resend", 30.0),
    ("RAGWATCH_OTLP_TOPIC", "traces", "otlp_topic", "traces"),
    ("RAGWATCH_OTLP_TOPIC", "", "otlp_topic", ""),
    ("RAGWATCH_OTLP_ENCODING", "OTLP_JSON", "otlp_encoding", "otlp_json"),
    ("RAGWATCH_OTLP_GRACE", "5", "otlp_grace", 5.0),
    ("RAGWATCH_HINT_WAIT", "2.5", "hint_wait", 2.5),
    ("RAGWATCH_SCORE_SIGNALS", "off", "score_signals", False),
    (
        "RAGWATCH_OTLP_STAGE_PATTERNS",
        "retriever=^vector_search;reranker=rerank$",
        "otlp_stage_patterns",
        "retriever=^vector_search;reranker=rerank$",
    ),
]


@pytest.mark.parametrize(
    ("var", "raw", "field", "expected"), PARSED, ids=[f"{v}={r!r}" for v, r, _, _ in PARSED]
)
def test_each_variable_is_parsed_into_its_field(
    var: str, raw: str, field: str, expected: Any
) -> None:
    s = Settings.from_env({var: raw})
    got = getattr(s, field)
    assert got == expected
    assert type(got) is type(expected)
    assert s.explicit == frozenset({field})


def test_the_parse_table_covers_every_variable() -> None:
    assert {var for var, _, _, _ in PARSED} == set(env_names())


def test_many_variables_at_once() -> None:
    env = {
        "RAGWATCH_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
        "RAGWATCH_TOPIC_PREFIX": "staging.",
        "RAGWATCH_MAX_SERIES": "10",
        "RAGWATCH_LOG_LEVEL": "error",
        "UNRELATED": "x",
    }
    s = Settings.from_env(env)
    assert (s.kafka_bootstrap, s.topic_prefix, s.max_series, s.log_level) == (
        "k1:9092,k2:9092",
        "staging.",
        10,
        "ERROR",
    )
    assert s.explicit == {"kafka_bootstrap", "topic_prefix", "max_series", "log_level"}
    assert s.app_id == "ragwatch"  # untouched settings keep their defaults


def test_explicit_is_not_part_of_equality() -> None:
    assert Settings.from_env({"RAGWATCH_APP_ID": "ragwatch"}) == Settings.from_env({})


def test_from_env_does_not_modify_its_input() -> None:
    env = {"RAGWATCH_KAFKA_BOOTSTRAP": " k1:9092 "}
    Settings.from_env(env)
    assert env == {"RAGWATCH_KAFKA_BOOTSTRAP": " k1:9092 "}


@pytest.mark.parametrize("protocol", SECURITY_PROTOCOLS)
@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_every_protocol_and_mechanism_is_accepted(protocol: str, mechanism: str) -> None:
    s = Settings.from_env(
        {
            **SASL_ENV,
            "RAGWATCH_KAFKA_SECURITY_PROTOCOL": protocol,
            "RAGWATCH_KAFKA_SASL_MECHANISM": mechanism,
        }
    )
    assert (s.kafka_security_protocol, s.kafka_sasl_mechanism) == (protocol, mechanism)


# ---------------------------------------------------------------- bad values

BAD: list[tuple[str, str]] = [
    ("RAGWATCH_KAFKA_BOOTSTRAP", "localhost"),
    ("RAGWATCH_KAFKA_BOOTSTRAP", ""),
    ("RAGWATCH_KAFKA_BOOTSTRAP", " , "),
    ("RAGWATCH_KAFKA_BOOTSTRAP", "k1:9092,k2"),
    ("RAGWATCH_KAFKA_BOOTSTRAP", "k1:port"),
    ("RAGWATCH_KAFKA_BOOTSTRAP", "k1:123456"),
    ("RAGWATCH_KAFKA_BOOTSTRAP", "kafka://k1:9092"),
    ("RAGWATCH_KAFKA_BOOTSTRAP", "k1 k2:9092"),
    ("RAGWATCH_KAFKA_SECURITY_PROTOCOL", "TLS"),
    ("RAGWATCH_KAFKA_SECURITY_PROTOCOL", ""),
    ("RAGWATCH_KAFKA_SASL_MECHANISM", "GSSAPI"),
    ("RAGWATCH_KAFKA_SASL_MECHANISM", "OAUTHBEARER"),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "0"),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "-1"),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "nan"),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "ten"),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", ""),
    ("RAGWATCH_TOPIC_PARTITIONS", "0"),
    ("RAGWATCH_TOPIC_PARTITIONS", "-3"),
    ("RAGWATCH_TOPIC_PARTITIONS", "1.5"),
    ("RAGWATCH_TOPIC_PARTITIONS", "four"),
    ("RAGWATCH_REDIS_URL", "http://localhost:6379"),
    ("RAGWATCH_REDIS_URL", "localhost:6379"),
    ("RAGWATCH_REDIS_URL", "postgres://db/0"),
    ("RAGWATCH_REDIS_URL", ""),
    ("RAGWATCH_WEBHOOK_URLS", "ftp://hooks.example.com/x"),
    ("RAGWATCH_WEBHOOK_URLS", "hooks.example.com/x"),
    ("RAGWATCH_WEBHOOK_URLS", "http://"),
    ("RAGWATCH_WEBHOOK_URLS", "https://ok.example.com/a,mailto:ops@example.com"),
    ("RAGWATCH_WEBHOOK_TIMEOUT", "0"),
    ("RAGWATCH_WEBHOOK_TIMEOUT", "-0.1"),
    ("RAGWATCH_WEBHOOK_MAX_ATTEMPTS", "0"),
    ("RAGWATCH_WEBHOOK_MAX_ATTEMPTS", "2.0"),
    ("RAGWATCH_MAX_SERIES", "-1"),
    ("RAGWATCH_SNAPSHOT_INTERVAL", "0"),
    ("RAGWATCH_SLOW_MESSAGE", "0"),
    ("RAGWATCH_MAX_CLOCK_SKEW", "-5"),
    ("RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS", "0"),
    ("RAGWATCH_MAX_SERIES", "1e5"),
    ("RAGWATCH_SERVE_PORT", "0"),
    ("RAGWATCH_SERVE_PORT", "65536"),
    ("RAGWATCH_SERVE_PORT", "http"),
    ("RAGWATCH_LOG_LEVEL", "TRACE"),
    ("RAGWATCH_LOG_LEVEL", "verbose"),
    ("RAGWATCH_OTLP_ENCODING", "protobuf"),
    ("RAGWATCH_OTLP_GRACE", "0"),
    ("RAGWATCH_OTLP_STAGE_PATTERNS", "retriever=("),
    ("RAGWATCH_OTLP_STAGE_PATTERNS", "no-equals-sign"),
    ("RAGWATCH_ALERTMANAGER_URLS", "ftp://am:9093"),
    ("RAGWATCH_ALERTMANAGER_RESEND", "-1"),
    # issue 29, point 9: accepted silently before
    ("RAGWATCH_TOPIC_PREFIX", "a b/c"),
    ("RAGWATCH_EXTERNAL_URL", "javascript:alert(1)"),
    ("RAGWATCH_STATE_DIR", "/proc/nope"),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "100000"),
    ("RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS", "999999999"),
    ("RAGWATCH_OTLP_GRACE", "1e12"),
    ("RAGWATCH_ALERTMANAGER_RESEND", "0.001"),
    # and one refused value for every other variable that has bounds
    ("RAGWATCH_KAFKA_SASL_USERNAME", "svc\nuser"),
    ("RAGWATCH_KAFKA_SSL_CAFILE", "/"),
    ("RAGWATCH_APP_ID", "rag watch"),
    ("RAGWATCH_WORKER_ID", "worker 1"),
    ("RAGWATCH_REDIS_PREFIX", ""),
    ("RAGWATCH_SERVE_HOST", "http://0.0.0.0"),
    ("RAGWATCH_STATUS_INTERVAL", "1h"),
    ("RAGWATCH_OTLP_TOPIC", "spans/otlp"),
    ("RAGWATCH_HINT_WAIT", "301"),
    ("RAGWATCH_SCORE_SIGNALS", "maybe"),
]

# variables that take any value: secrets, and files checked when they are read
UNBOUNDED = {
    "RAGWATCH_KAFKA_SASL_PASSWORD",
    "RAGWATCH_WEBHOOK_HMAC_SECRET",
    "RAGWATCH_SERVE_TOKEN",
    "RAGWATCH_RULES_FILE",
    "RAGWATCH_NOTIFY_FILE",
}


def test_every_variable_but_secrets_and_files_has_a_refused_value() -> None:
    assert {var for var, _ in BAD} == set(env_names()) - UNBOUNDED


@pytest.mark.parametrize(("var", "raw"), BAD, ids=[f"{v}={r!r}" for v, r in BAD])
def test_bad_value_raises_config_error_naming_the_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({var: raw})
    assert str(info.value).startswith(f"{var}: ")
    assert isinstance(info.value, RagwatchError)


@pytest.mark.parametrize(
    ("var", "raw", "message"),
    [
        ("RAGWATCH_KAFKA_BOOTSTRAP", "localhost", "expected host:port[,host:port...]"),
        (
            "RAGWATCH_KAFKA_SECURITY_PROTOCOL",
            "TLS",
            "must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, got 'TLS'",
        ),
        ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "0", "expected 6 s..30 min (seconds, or a duration"),
        ("RAGWATCH_TOPIC_PARTITIONS", "-3", "expected an integer 1..1,000, got '-3'"),
        (
            "RAGWATCH_REDIS_URL",
            "http://localhost:6379",
            "expected redis://, rediss:// or unix:// URL",
        ),
        ("RAGWATCH_WEBHOOK_URLS", "ftp://hooks.example.com", "webhook URLs must be http(s)://"),
    ],
)
def test_error_message_says_what_is_expected(var: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({var: raw})
    assert message in str(info.value)


def test_first_bad_variable_is_reported_even_with_unknown_ones_present() -> None:
    with pytest.raises(ConfigError, match=r"^RAGWATCH_TOPIC_PARTITIONS: "):
        Settings.from_env({"RAGWATCH_TOPIC_PARTITIONS": "0", "RAGWATCH_NOPE": "1"})


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL", "sasl_ssl"])
@pytest.mark.parametrize("username", [None, "", "   "])
def test_sasl_without_a_username_is_refused(protocol: str, username: str | None) -> None:
    env = {"RAGWATCH_KAFKA_SECURITY_PROTOCOL": protocol, "RAGWATCH_KAFKA_SASL_PASSWORD": "pw"}
    if username is not None:
        env["RAGWATCH_KAFKA_SASL_USERNAME"] = username
    with pytest.raises(ConfigError, match=r"^RAGWATCH_KAFKA_SASL_USERNAME: required"):
        Settings.from_env(env)


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
def test_non_sasl_protocols_need_no_username(protocol: str) -> None:
    s = Settings.from_env({"RAGWATCH_KAFKA_SECURITY_PROTOCOL": protocol})
    assert s.kafka_sasl_username == ""


@pytest.mark.parametrize(
    "names",
    [
        ["RAGWATCH_KAFKA_BOOTSTRAP_SERVERS"],
        ["RAGWATCH_EXPLICIT"],  # an internal field, not a setting
        ["RAGWATCH_"],
        ["RAGWATCH_log_level"],  # names are case-sensitive
        ["RAGWATCH_ZZZ", "RAGWATCH_AAA"],
    ],
)
def test_unknown_ragwatch_variable_is_refused(names: list[str]) -> None:
    env = {"RAGWATCH_APP_ID": "ok", **{n: "1" for n in names}}
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert str(info.value) == f"unknown setting(s): {', '.join(sorted(names))}"


def test_config_error_is_not_a_value_error() -> None:
    # Settings problems stop ragwatch from starting; they are not argument checks.
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RAGWATCH_NOPE": "1"})
    assert not isinstance(info.value, ValueError)


# ---------------------------------------------------------------- topics


@pytest.mark.parametrize("name", TOPICS)
def test_topic_names_without_prefix(name: str) -> None:
    assert Settings.from_env({}).topic(name) == f"ragwatch.{name}"


@pytest.mark.parametrize("name", TOPICS)
def test_topic_prefix_is_prepended_verbatim(name: str) -> None:
    s = Settings.from_env({"RAGWATCH_TOPIC_PREFIX": "prod-eu."})
    assert s.topic(name) == f"prod-eu.ragwatch.{name}"


def test_all_seven_topics_exist() -> None:
    assert set(TOPICS) == {
        "gpu", "requests", "events", "metrics", "alerts", "deadletter", "facts"
    }  # fmt: skip


@pytest.mark.parametrize("name", ["alert", "GPU", "", "ragwatch.gpu"])
def test_unknown_topic_is_an_argument_error(name: str) -> None:
    with pytest.raises(ValueError, match="unknown topic"):
        Settings.from_env({}).topic(name)


# ---------------------------------------------------------------- kafka_config


def test_kafka_config_plaintext_has_only_bootstrap_and_protocol() -> None:
    s = Settings.from_env(
        {
            "RAGWATCH_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
            "RAGWATCH_KAFKA_SASL_USERNAME": "ignored",
            "RAGWATCH_KAFKA_SASL_PASSWORD": "ignored-pw",
        }
    )
    assert s.kafka_config() == {
        "bootstrap.servers": "k1:9092,k2:9092",
        "security.protocol": "PLAINTEXT",
    }


def test_kafka_config_sasl_ssl_with_ca_file() -> None:
    s = Settings.from_env(
        {
            "RAGWATCH_KAFKA_BOOTSTRAP": "broker.example.com:9094",
            "RAGWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "RAGWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "RAGWATCH_KAFKA_SASL_USERNAME": "ragwatch-svc",
            "RAGWATCH_KAFKA_SASL_PASSWORD": "hunter2-kafka",
            "RAGWATCH_KAFKA_SSL_CAFILE": CA_FILE,
        }
    )
    assert s.kafka_config() == {
        "bootstrap.servers": "broker.example.com:9094",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ragwatch-svc",
        "sasl.password": "hunter2-kafka",
        "ssl.ca.location": CA_FILE,
    }


def test_kafka_config_sasl_plaintext_without_ca_file() -> None:
    s = Settings.from_env(
        {
            **SASL_ENV,
            "RAGWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "RAGWATCH_KAFKA_SASL_PASSWORD": "pw",
        }
    )
    conf = s.kafka_config()
    assert conf["sasl.mechanism"] == "PLAIN"
    assert conf["sasl.password"] == "pw"
    assert "ssl.ca.location" not in conf


def test_kafka_config_ssl_with_ca_file_has_no_sasl_keys() -> None:
    s = Settings.from_env(
        {"RAGWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "RAGWATCH_KAFKA_SSL_CAFILE": CA_FILE}
    )
    assert s.kafka_config() == {
        "bootstrap.servers": "localhost:9092",
        "security.protocol": "SSL",
        "ssl.ca.location": CA_FILE,
    }


def test_kafka_config_keys_are_librdkafka_dotted_names() -> None:
    s = Settings.from_env({**SASL_ENV, "RAGWATCH_KAFKA_SSL_CAFILE": CA_FILE})
    for key in s.kafka_config():
        assert "_" not in key and "." in key and key == key.lower()


def test_kafka_config_returns_a_fresh_dict_each_call() -> None:
    s = Settings.from_env({})
    conf = s.kafka_config()
    conf["bootstrap.servers"] = "mutated:1"
    conf["client.id"] = "x"
    assert s.kafka_config() == {
        "bootstrap.servers": "localhost:9092",
        "security.protocol": "PLAINTEXT",
    }


# ---------------------------------------------------------------- secrets

SASL_PW = "kafka-pw-Zq81"
REDIS_PW = "redis-pw-Xy42"
HOOK_SECRET = "T000/B000/slacksecretXX"
HOOK_PW = "hookpw-Ab12"
HOOK_TOKEN = "tok-Cd34"
HMAC_SECRET = "hmac-Ef56"
SERVE_TOKEN = "serve-Gh78"
SECRETS = (
    SASL_PW,
    REDIS_PW,
    HOOK_SECRET,
    "slacksecretXX",
    HOOK_PW,
    HOOK_TOKEN,
    HMAC_SECRET,
    SERVE_TOKEN,
)


@pytest.fixture
def secret_settings() -> Settings:
    return Settings.from_env(
        {
            **SASL_ENV,
            "RAGWATCH_KAFKA_SASL_PASSWORD": SASL_PW,
            "RAGWATCH_WEBHOOK_HMAC_SECRET": HMAC_SECRET,
            "RAGWATCH_SERVE_TOKEN": SERVE_TOKEN,
            "RAGWATCH_REDIS_URL": f"rediss://default:{REDIS_PW}@cache.example.com:6380/1",
            "RAGWATCH_WEBHOOK_URLS": (
                f"https://hooks.slack.com/services/{HOOK_SECRET},"
                f"http://alert:{HOOK_PW}@receiver.local:9000/hook?token={HOOK_TOKEN}"
            ),
        }
    )


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked in {text!r}"


def test_secrets_are_still_available_to_the_code_that_needs_them(
    secret_settings: Settings,
) -> None:
    assert secret_settings.kafka_sasl_password.get() == SASL_PW
    assert secret_settings.kafka_config()["sasl.password"] == SASL_PW
    assert REDIS_PW in secret_settings.redis_url
    assert secret_settings.webhook_urls[0].endswith(HOOK_SECRET)


def test_secrets_never_appear_in_repr_or_str(secret_settings: Settings) -> None:
    _assert_no_secret(repr(secret_settings))
    _assert_no_secret(str(secret_settings))
    _assert_no_secret(f"{secret_settings}")
    _assert_no_secret(repr(secret_settings.kafka_sasl_password))
    _assert_no_secret(str(secret_settings.kafka_sasl_password))


def test_secrets_never_appear_in_describe(secret_settings: Settings) -> None:
    described = secret_settings.describe()
    _assert_no_secret(repr(described))
    assert described["RAGWATCH_KAFKA_SASL_PASSWORD"] == "**********"
    assert described["RAGWATCH_SERVE_TOKEN"] == described["RAGWATCH_WEBHOOK_HMAC_SECRET"]
    assert described["RAGWATCH_REDIS_URL"] == "rediss://default:***@cache.example.com:6380/1"
    assert described["RAGWATCH_WEBHOOK_URLS"] == (
        "https://hooks.slack.com/***,http://receiver.local:9000/***"
    )


def test_describe_of_redis_url_without_password_is_unchanged() -> None:
    s = Settings.from_env({"RAGWATCH_REDIS_URL": "redis://cache:6379/3"})
    assert s.describe()["RAGWATCH_REDIS_URL"] == "redis://cache:6379/3"


def test_redis_password_without_username_is_masked() -> None:
    s = Settings.from_env({"RAGWATCH_REDIS_URL": f"redis://:{REDIS_PW}@cache:6379/0"})
    assert s.describe()["RAGWATCH_REDIS_URL"] == "redis://:***@cache:6379/0"
    _assert_no_secret(repr(s))


def test_error_for_bad_webhook_url_does_not_leak_its_secret_path() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(
            {"RAGWATCH_WEBHOOK_URLS": f"ftp://user:{HOOK_PW}@hooks.example.com/{HOOK_SECRET}"}
        )
    assert str(info.value).startswith("RAGWATCH_WEBHOOK_URLS: ")
    _assert_no_secret(str(info.value))


def test_error_for_bad_redis_url_does_not_leak_its_password() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RAGWATCH_REDIS_URL": f"http://admin:{REDIS_PW}@cache:6379"})
    assert str(info.value).startswith("RAGWATCH_REDIS_URL: ")
    assert "http://admin:***@cache:6379" in str(info.value)
    _assert_no_secret(str(info.value))


def test_error_for_sasl_without_username_does_not_leak_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(
            {
                "RAGWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "RAGWATCH_KAFKA_SASL_PASSWORD": SASL_PW,
            }
        )
    _assert_no_secret(str(info.value))


def test_secret_value_object() -> None:
    s = Secret("pw")
    assert s.get() == "pw"
    assert repr(s) == str(s) == "Secret('**********')"
    assert repr(Secret("")) == "Secret('')"
    assert s == Secret("pw") and s != Secret("other") and s != "pw"
    assert hash(s) == hash(Secret("pw"))
    assert bool(s) and not Secret("")


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host", "redis://:***@host"),
        ("rediss://user:p@ss@host:1/2", "rediss://user:***@host:1/2"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        # base64 passwords hold '/', and '#' or '?' are common: a URL parser takes part of
        # them for the host or the path; the password is still all masked
        ("redis://:Zm9v/YmFy@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://u:a#b?c@host/0", "redis://u:***@host/0"),
        ("redis://Zm9v/YmFy@host/0", "redis://:***@host/0"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


@pytest.mark.parametrize("password", ["Zm9v/YmFy", "a#b", "a?b"])
def test_a_redis_password_with_reserved_characters_is_a_clear_error_that_hides_it(
    password: str,
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RAGWATCH_REDIS_URL": f"redis://:{password}@host:6379/0"})
    assert "percent-encode" in str(info.value)
    assert password not in str(info.value) and password[:2] not in str(info.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("https://hooks.slack.com/services/T/B/X", "https://hooks.slack.com/***"),
        ("http://u:pw@h:9000/hook", "http://h:9000/***"),
        ("https://h.example.com", "https://h.example.com"),
        ("https://h.example.com/", "https://h.example.com"),
        ("https://h.example.com?token=abc", "https://h.example.com"),
        ("https://u:ab/cd@h.example.com/x", "https://h.example.com/***"),
    ],
)
def test_mask_webhook(url: str, masked: str) -> None:
    assert mask_webhook(url) == masked


# ---------------------------------------------------------------- describe and env_names


def test_env_names_covers_every_setting_field() -> None:
    names = env_names()
    assert set(names) == {PREFIX + f.name.upper() for f in setting_fields()}
    assert set(names) == {
        PREFIX + f.name.upper() for f in dataclasses.fields(Settings) if f.name != "explicit"
    }
    for name, doc in names.items():
        assert name.startswith("RAGWATCH_") and name == name.upper()
        assert isinstance(doc, str) and doc.strip()


def test_every_env_name_is_accepted_by_from_env() -> None:
    # A variable listed by env_names() never trips the unknown-variable check.
    defaults = Settings.from_env({}).describe()
    for name in env_names():
        value = defaults[name] if name != "RAGWATCH_KAFKA_SASL_PASSWORD" else "pw"
        Settings.from_env({name: value})


def test_describe_lists_every_variable_in_env_names_order() -> None:
    assert list(Settings.from_env({}).describe()) == list(env_names())


def test_describe_values_are_printable_strings() -> None:
    described = Settings.from_env({}).describe()
    assert all(isinstance(v, str) for v in described.values())
    assert described["RAGWATCH_KAFKA_SSL_CAFILE"] == ""
    assert described["RAGWATCH_RULES_FILE"] == ""
    assert described["RAGWATCH_WEBHOOK_URLS"] == ""
    assert described["RAGWATCH_TOPIC_PARTITIONS"] == "4"
    assert described["RAGWATCH_STATE_DIR"] == ".ragwatch"
    assert described["RAGWATCH_KAFKA_SASL_PASSWORD"] == ""  # not set


def test_describe_of_non_secret_settings_reads_back_to_the_same_settings() -> None:
    s = Settings.from_env(
        {
            "RAGWATCH_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
            "RAGWATCH_KAFKA_SECURITY_PROTOCOL": "ssl",
            "RAGWATCH_KAFKA_SSL_CAFILE": CA_FILE,
            "RAGWATCH_TOPIC_PREFIX": "p.",
            "RAGWATCH_TOPIC_PARTITIONS": "6",
            "RAGWATCH_WEBHOOK_TIMEOUT": "1.5",
            "RAGWATCH_RULES_FILE": "r.yaml",
            "RAGWATCH_LOG_LEVEL": "debug",
        }
    )
    secret = {
        "RAGWATCH_KAFKA_SASL_PASSWORD",
        "RAGWATCH_REDIS_URL",
        "RAGWATCH_WEBHOOK_URLS",
        "RAGWATCH_WEBHOOK_HMAC_SECRET",
        "RAGWATCH_SERVE_TOKEN",
    }
    env = {k: v for k, v in s.describe().items() if k not in secret}
    assert Settings.from_env(env) == s


# ---------------------------------------------------------------- regressions of fixed bugs


def test_bug_redis_password_in_query_string_is_masked() -> None:
    s = Settings.from_env({"RAGWATCH_REDIS_URL": f"redis://cache:6379/0?password={REDIS_PW}"})
    _assert_no_secret(repr(s.describe()))


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_bug_bootstrap_port_out_of_range_is_refused(port: str) -> None:
    with pytest.raises(ConfigError, match=r"^RAGWATCH_KAFKA_BOOTSTRAP: "):
        Settings.from_env({"RAGWATCH_KAFKA_BOOTSTRAP": f"k1:{port}"})


# ---------------------------------------------------------------- bounds (issue 29, point 9)


@pytest.mark.parametrize(
    ("var", "raw", "message"),
    [
        ("RAGWATCH_SERVE_PORT", "abc", "expected a port number 1..65535, got 'abc'"),
        (
            "RAGWATCH_TOPIC_PREFIX",
            "a b/c",
            "a topic name takes letters, digits, '.', '_' and '-' (Kafka), got 'a b/c'",
        ),
        (
            "RAGWATCH_EXTERNAL_URL",
            "javascript:alert(1)",
            "expected an http(s)://host[:port][/path] URL, got 'javascript:alert(1)'",
        ),
        (
            "RAGWATCH_STATE_DIR",
            "/proc/nope",
            "'/proc/nope' is under /proc, a kernel file system: no state can be kept there",
        ),
        (
            "RAGWATCH_KAFKA_SESSION_TIMEOUT",
            "100000",
            "expected 6 s..30 min (seconds, or a duration such as 30s or 5m), got '100000'",
        ),
        (
            "RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS",
            "999999999",
            "expected an integer 1..30,000 ms, got '999999999'",
        ),
        (
            "RAGWATCH_OTLP_GRACE",
            "1e12",
            "expected 100 ms..1 h (seconds, or a duration such as 30s or 5m), got '1e12'",
        ),
        (
            "RAGWATCH_ALERTMANAGER_RESEND",
            "0.001",
            "expected 1 s..1 h (seconds, or a duration such as 30s or 5m), got '0.001'",
        ),
    ],
)
def test_the_issues_examples_are_one_line_naming_the_variable(
    var: str, raw: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({var: raw})
    assert str(info.value) == f"{var}: {message}"


@pytest.mark.parametrize(
    ("var", "lowest", "highest", "below", "above"),
    [
        ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "6", "30m", "5.9", "1801"),
        ("RAGWATCH_KAFKA_FETCH_MAX_WAIT_MS", "1", "30000", "0", "30001"),
        ("RAGWATCH_TOPIC_PARTITIONS", "1", "1000", "0", "1001"),
        ("RAGWATCH_WEBHOOK_TIMEOUT", "0.1", "300", "0.09", "301"),
        ("RAGWATCH_WEBHOOK_MAX_ATTEMPTS", "1", "1000", "0", "1001"),
        ("RAGWATCH_ALERTMANAGER_RESEND", "1s", "1h", "0.999", "3601"),
        ("RAGWATCH_MAX_SERIES", "1", "10000000", "0", "10000001"),
        ("RAGWATCH_MAX_CLOCK_SKEW", "1", "36500d", "0.5", "36501d"),
        ("RAGWATCH_SLOW_MESSAGE", "0.001", "30m", "0.0009", "31m"),
        ("RAGWATCH_SNAPSHOT_INTERVAL", "0.1", "1h", "0.05", "61m"),
        ("RAGWATCH_STATUS_INTERVAL", "0.1", "10m", "0.05", "601"),
        ("RAGWATCH_OTLP_GRACE", "100ms", "3600", "99ms", "3601"),
    ],
)
def test_numbers_are_bounded_by_what_they_mean(
    var: str, lowest: str, highest: str, below: str, above: str
) -> None:
    for ok in (lowest, highest):
        Settings.from_env({var: ok})
    for bad in (below, above, "nan", "inf", "-1", "1e400"):
        with pytest.raises(ConfigError, match=rf"^{var}: expected .*, got '{re.escape(bad)}'$"):
            Settings.from_env({var: bad})


def test_every_durations_unit_reads_as_seconds() -> None:
    s = Settings.from_env(
        {
            "RAGWATCH_OTLP_GRACE": "250ms",
            "RAGWATCH_WEBHOOK_TIMEOUT": "1.5s",
            "RAGWATCH_SNAPSHOT_INTERVAL": "2m",
            "RAGWATCH_ALERTMANAGER_RESEND": "1h",
            "RAGWATCH_MAX_CLOCK_SKEW": "1d",
            "RAGWATCH_STATUS_INTERVAL": "1e1",
        }
    )
    assert (s.otlp_grace, s.webhook_timeout, s.snapshot_interval) == (0.25, 1.5, 120.0)
    assert (s.alertmanager_resend, s.max_clock_skew, s.status_interval) == (3600.0, 86400.0, 10.0)


def test_topic_names_stay_within_kafkas_249_characters() -> None:
    longest = "p" * 230
    s = Settings.from_env({"RAGWATCH_TOPIC_PREFIX": longest})
    assert max(len(s.topic(t)) for t in TOPICS) == 249
    with pytest.raises(ConfigError, match=r"^RAGWATCH_TOPIC_PREFIX: at most 230 characters"):
        Settings.from_env({"RAGWATCH_TOPIC_PREFIX": longest + "p"})
    with pytest.raises(ConfigError, match=r"^RAGWATCH_OTLP_TOPIC: with the topic prefix 250"):
        Settings.from_env({"RAGWATCH_TOPIC_PREFIX": longest, "RAGWATCH_OTLP_TOPIC": "o" * 20})


def test_the_otlp_topic_cannot_be_one_of_ragwatchs_own() -> None:
    with pytest.raises(ConfigError, match=r"'p\.ragwatch\.requests' is one of ragwatch's own"):
        Settings.from_env(
            {"RAGWATCH_TOPIC_PREFIX": "p.", "RAGWATCH_OTLP_TOPIC": "ragwatch.requests"}
        )


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("javascript:alert(1)", "expected an http"),
        ("file:///etc/passwd", "expected an http"),
        ("ftp://ragwatch.example", "expected an http"),
        ("https://", "expected an http"),
        ("https://ragwatch example", "expected an http"),
        ("https://ragwatch.example:99999", "expected an http"),
        ("https://admin:hunter2@ragwatch.example", "must not hold a user or password"),
        ("https://ragwatch.example/?tab=alerts", "must not have a query or fragment"),
        ("https://ragwatch.example/#alerts", "must not have a query or fragment"),
    ],
)
def test_external_url_is_a_plain_http_link(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"^RAGWATCH_EXTERNAL_URL: {why}") as info:
        Settings.from_env({"RAGWATCH_EXTERNAL_URL": url})
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url", ["", "http://10.0.0.5:8080", "https://ops.example.com/ragwatch/"])
def test_external_url_accepts_http_links_and_empty_for_none(url: str) -> None:
    assert Settings.from_env({"RAGWATCH_EXTERNAL_URL": url}).external_url == url


def test_state_dir_is_checked_as_far_as_possible_without_creating_it(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for bad, why in (
        ("/proc/nope", "is under /proc, a kernel file system"),
        ("/sys/kernel/ragwatch", "is under /sys"),
        (str(a_file / "state"), f"{a_file} is a file, not a directory"),
        (str(a_file), "is a file, not a directory"),
        ("~/.ragwatch", "'~' is not expanded here"),
    ):
        with pytest.raises(ConfigError, match=rf"^RAGWATCH_STATE_DIR: .*{re.escape(why)}"):
            Settings.from_env({"RAGWATCH_STATE_DIR": bad})
    not_yet = tmp_path / "a" / "b"
    assert Settings.from_env({"RAGWATCH_STATE_DIR": str(not_yet)}).state_dir == not_yet
    assert not not_yet.exists()  # reading settings creates nothing


def test_state_subdir_creates_it_or_says_in_one_line_why_it_cannot(tmp_path: Path) -> None:
    s = Settings.from_env({"RAGWATCH_STATE_DIR": str(tmp_path / "state")})
    assert s.state_subdir("faust") == tmp_path / "state" / "faust"
    assert (tmp_path / "state" / "faust").is_dir()
    blocked = Settings.from_env({"RAGWATCH_STATE_DIR": str(tmp_path / "later")})
    (tmp_path / "later").write_text("a file took its place after the settings were read")
    with pytest.raises(ConfigError, match=r"^RAGWATCH_STATE_DIR: cannot create .*later/faust: "):
        blocked.state_subdir("faust")


def test_ca_file_is_a_file_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^RAGWATCH_KAFKA_SSL_CAFILE: not a file: "):
        Settings.from_env({"RAGWATCH_KAFKA_SSL_CAFILE": str(tmp_path)})
    # one not on this machine is checked where a Kafka client starts, not here: settings
    # are checked on machines that do not hold it (a deployment's env files, in CI)
    elsewhere = tmp_path / "ca.pem"
    assert Settings.from_env({"RAGWATCH_KAFKA_SSL_CAFILE": str(elsewhere)}).kafka_ssl_cafile == (
        elsewhere
    )


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("0.0.0.0", True),
        ("::", True),
        ("127.0.0.1", True),
        ("localhost", True),
        ("ragwatch-serve.monitoring.svc", True),
        ("http://0.0.0.0", False),
        ("0.0.0.0:8080", False),
        ("[::1]", False),
        ("my host", False),
    ],
)
def test_serve_host_is_an_address_or_a_host_name(host: str, ok: bool) -> None:
    if ok:
        assert Settings.from_env({"RAGWATCH_SERVE_HOST": host}).serve_host == host
    else:
        with pytest.raises(ConfigError, match=r"^RAGWATCH_SERVE_HOST: expected an IP address"):
            Settings.from_env({"RAGWATCH_SERVE_HOST": host})


@pytest.mark.parametrize(
    "url", ["redis://cache:6379/zero", "redis:///0", "redis://cache:port/0", "unix://"]
)
def test_redis_url_needs_a_host_and_a_database_number(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^RAGWATCH_REDIS_URL: "):
        Settings.from_env({"RAGWATCH_REDIS_URL": url})


def test_the_cli_prints_a_bad_setting_as_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ragwatch.cli import main

    assert main(["settings"], environ={"RAGWATCH_SERVE_PORT": "abc"}) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        "ragwatch: error: RAGWATCH_SERVE_PORT: expected a port number 1..65535, got 'abc'\n",
    )


def test_ragwatch_settings_shows_unset_secrets_empty_and_set_ones_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ragwatch.cli import main

    assert main(["settings"], environ={"RAGWATCH_SERVE_TOKEN": SERVE_TOKEN}) == 0
    lines = {
        line.split("=", 1)[0]: line.split("=", 1)[1].split("    # ")[0]
        for line in capsys.readouterr().out.splitlines()
    }
    assert lines["RAGWATCH_SERVE_TOKEN"] == "**********"
    assert lines["RAGWATCH_KAFKA_SASL_PASSWORD"] == lines["RAGWATCH_WEBHOOK_HMAC_SECRET"] == ""
    _assert_no_secret(repr(lines))
    assert "Secret(" not in repr(lines)


def test_a_ca_file_that_cannot_be_read_is_one_line_where_the_client_is_made(
    tmp_path: Path,
) -> None:
    """Checked where it is read: by the client config (the env examples of deploy/ name a
    CA file of the target host, so the settings alone do not require it here)."""
    missing = tmp_path / "nope.pem"
    s = Settings.from_env(
        {"RAGWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "RAGWATCH_KAFKA_SSL_CAFILE": str(missing)}
    )
    with pytest.raises(ConfigError, match=rf"^RAGWATCH_KAFKA_SSL_CAFILE: cannot read {missing}"):
        s.kafka_config()
    from ragwatch.kafka import KafkaClient

    with pytest.raises(ConfigError, match=r"^RAGWATCH_KAFKA_SSL_CAFILE: cannot read "):
        KafkaClient.of(s).aiokafka()
