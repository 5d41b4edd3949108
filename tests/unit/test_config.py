"""Settings: defaults, every ``RAGWATCH_*`` variable, errors that name the variable, the
Kafka option mapping, and secrets that never show in ``repr``/``str``/``describe()``.

Settings are built from plain dicts passed to ``Settings.from_env``; the process
environment is never read or changed.
"""

from __future__ import annotations

import dataclasses
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
    ("RAGWATCH_KAFKA_SSL_CAFILE", "/etc/ssl/ca.pem", "kafka_ssl_cafile", Path("/etc/ssl/ca.pem")),
    ("RAGWATCH_KAFKA_SSL_CAFILE", "", "kafka_ssl_cafile", None),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "45", "kafka_session_timeout", 45.0),
    ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "0.5", "kafka_session_timeout", 0.5),
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
    ("RAGWATCH_SNAPSHOT_LEGACY", "false", "snapshot_legacy", False),
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
]


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
        ("RAGWATCH_KAFKA_SESSION_TIMEOUT", "0", "must be > 0, got '0'"),
        ("RAGWATCH_TOPIC_PARTITIONS", "-3", "must be > 0, got '-3'"),
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


def test_all_six_topics_exist() -> None:
    assert set(TOPICS) == {"gpu", "requests", "events", "metrics", "alerts", "deadletter"}


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
            "RAGWATCH_KAFKA_SSL_CAFILE": "/etc/kafka/ca.pem",
        }
    )
    assert s.kafka_config() == {
        "bootstrap.servers": "broker.example.com:9094",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ragwatch-svc",
        "sasl.password": "hunter2-kafka",
        "ssl.ca.location": "/etc/kafka/ca.pem",
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
        {"RAGWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "RAGWATCH_KAFKA_SSL_CAFILE": "ca.pem"}
    )
    assert s.kafka_config() == {
        "bootstrap.servers": "localhost:9092",
        "security.protocol": "SSL",
        "ssl.ca.location": "ca.pem",
    }


def test_kafka_config_keys_are_librdkafka_dotted_names() -> None:
    s = Settings.from_env({**SASL_ENV, "RAGWATCH_KAFKA_SSL_CAFILE": "ca.pem"})
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
    assert described["RAGWATCH_KAFKA_SASL_PASSWORD"] == "Secret('**********')"
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
    assert described["RAGWATCH_KAFKA_SASL_PASSWORD"] == "Secret('')"


def test_describe_of_non_secret_settings_reads_back_to_the_same_settings() -> None:
    s = Settings.from_env(
        {
            "RAGWATCH_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
            "RAGWATCH_KAFKA_SECURITY_PROTOCOL": "ssl",
            "RAGWATCH_KAFKA_SSL_CAFILE": "/ca.pem",
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
