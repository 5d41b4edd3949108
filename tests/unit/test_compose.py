"""docker-compose.yml, Dockerfile and .dockerignore, checked without Docker.

The files are only parsed: the six services exist, Kafka is the official image in KRaft
mode and advertises the address the ragwatch containers use, every ``RAGWATCH_*`` variable
is a real setting that :meth:`Settings.from_env` accepts (with Compose's ``${VAR:-default}``
defaults), the ``command`` of each ragwatch service parses with the real CLI parser, and the
image installs extras that pyproject.toml defines.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from ragwatch.agents.sim import SimConfig
from ragwatch.cli import build_parser
from ragwatch.commands import agent as agent_command
from ragwatch.config import PREFIX, Settings, env_names
from ragwatch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"

SERVICES = ("kafka", "redis", "worker", "notify", "serve", "agent")
RAGWATCH_SERVICES = ("worker", "notify", "serve", "agent")


# ---------------------------------------------------------------- helpers


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict), "docker-compose.yml must be a mapping"
    return data


def service(name: str) -> dict[str, Any]:
    svc = compose()["services"][name]
    assert isinstance(svc, dict)
    return svc


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


_INTERPOLATION = re.compile(
    r"\$(?:\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*)|(?P<escaped>\$))"
)
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.S)


def interpolate(value: str) -> str:
    """Compose variable interpolation as if no variable were set in the shell or .env.

    ``${VAR:-default}`` and ``${VAR-default}`` give the default, ``${VAR}``, ``$VAR`` and
    ``${VAR:+alt}`` give "", ``$$`` gives "$"; ``${VAR:?message}`` (required) fails.
    """

    def replace(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        if m["named"]:
            return ""
        braced = _BRACED.fullmatch(m["braced"])
        assert braced, f"bad interpolation {m[0]!r}"
        op, arg = braced["op"], braced["arg"]
        if op in (":-", "-"):
            return str(arg)
        assert op not in (":?", "?"), f"{braced['name']} must be set: {m[0]!r}"
        return ""

    return _INTERPOLATION.sub(replace, value)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def environment(svc: dict[str, Any]) -> dict[str, str | None]:
    """A service's ``environment`` (list or mapping form), interpolated.

    ``None`` marks a variable passed through from the shell (``- NAME`` or ``NAME:``),
    which is unset when the shell does not set it.
    """
    env = svc.get("environment") or {}
    out: dict[str, str | None] = {}
    if isinstance(env, list):
        for item in env:
            assert isinstance(item, str), f"environment list items are strings: {item!r}"
            name, sep, value = item.partition("=")
            out[name] = interpolate(value) if sep else None
    else:
        assert isinstance(env, dict), f"environment must be a list or mapping: {env!r}"
        for name, value in env.items():
            out[str(name)] = None if value is None else interpolate(_scalar(value))
    return out


def ragwatch_env(name: str) -> dict[str, str]:
    return {
        k: v
        for k, v in environment(service(name)).items()
        if k.startswith(PREFIX) and v is not None
    }


def command_argv(svc: dict[str, Any]) -> list[str]:
    cmd = svc["command"]
    argv = shlex.split(cmd) if isinstance(cmd, str) else [_scalar(a) for a in cmd]
    return [interpolate(a) for a in argv]


@cache
def dockerfile() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, with continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continuation are dropped
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        instr, _, args = full.partition(" ")
        out.append((instr.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continuation line"
    return out


def instructions(name: str) -> list[str]:
    return [args for instr, args in dockerfile() if instr == name]


def copy_sources() -> list[str]:
    sources: list[str] = []
    for args in instructions("COPY"):
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        if words and words[0].startswith("["):
            words = json.loads(args[args.index("[") :])
        sources += [w.rstrip("/") for w in words[:-1]]
    return sources


def installed_extras() -> set[str]:
    extras: set[str] = set()
    for args in instructions("RUN"):
        for cmd in re.split(r"&&|;", args):
            if re.search(r"\bpip3?\s+install\b", cmd):
                for group in re.findall(r"\.\[([^\]]+)\]", cmd):
                    extras |= {e.strip() for e in group.split(",") if e.strip()}
    return extras


# ---------------------------------------------------------------- services


def test_the_four_services_exist() -> None:
    assert set(SERVICES) <= set(compose()["services"])


def test_kafka_is_the_official_image_pinned_to_a_version() -> None:
    image = service("kafka")["image"]
    repo, _, tag = image.partition(":")
    assert repo in ("apache/kafka", "docker.io/apache/kafka"), image
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag), f"pin apache/kafka to a release: {image}"


def test_kafka_runs_kraft_as_a_single_combined_node() -> None:
    env = environment(service("kafka"))
    roles = {r.strip() for r in str(env["KAFKA_PROCESS_ROLES"]).split(",")}
    assert {"broker", "controller"} <= roles
    assert not any(k.startswith("KAFKA_ZOOKEEPER") for k in env)
    node_id = str(env["KAFKA_NODE_ID"])
    voters = str(env["KAFKA_CONTROLLER_QUORUM_VOTERS"]).split(",")
    assert [v.split("@")[0] for v in voters] == [node_id]
    # a single broker cannot hold the default 3 replicas of the offsets topic
    assert str(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == "1"


def _listeners(value: str | None) -> dict[str, str]:
    """``NAME://host:port,...`` -> {NAME: host:port}."""
    out = {}
    for item in str(value).split(","):
        name, sep, addr = item.strip().partition("://")
        assert sep, f"bad listener {item!r}"
        out[name] = addr
    return out


def test_kafka_listeners_are_consistent() -> None:
    env = environment(service("kafka"))
    listeners = _listeners(env["KAFKA_LISTENERS"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(
        p.split(":") for p in str(env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]).split(",")
    )
    controller = str(env["KAFKA_CONTROLLER_LISTENER_NAMES"])
    assert controller in listeners
    assert controller not in advertised, "brokers must not advertise the controller listener"
    assert set(listeners) <= set(protocols)
    assert set(advertised) <= set(listeners)
    voter_port = str(env["KAFKA_CONTROLLER_QUORUM_VOTERS"]).rsplit(":", 1)[1]
    assert listeners[controller].rsplit(":", 1)[1] == voter_port
    inter = env.get("KAFKA_INTER_BROKER_LISTENER_NAME")
    if inter is not None:
        assert inter in advertised


@pytest.mark.parametrize("name", ("worker", "notify", "agent"))  # serve reads Redis only
def test_ragwatch_services_bootstrap_from_an_advertised_kafka_listener(name: str) -> None:
    advertised = set(
        _listeners(environment(service("kafka"))["KAFKA_ADVERTISED_LISTENERS"]).values()
    )
    settings = Settings.from_env(ragwatch_env(name))
    for server in settings.kafka_bootstrap.split(","):
        assert server in advertised, f"{name} bootstraps from {server}, not advertised"


def test_healthchecks() -> None:
    kafka_test = " ".join(service("kafka")["healthcheck"]["test"])
    assert "/opt/kafka/bin/" in kafka_test
    redis_test = " ".join(service("redis")["healthcheck"]["test"])
    assert "redis-cli" in redis_test and "ping" in redis_test
    assert service("redis")["image"].split(":")[1].startswith("7")


def _depends_on(svc: dict[str, Any]) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def test_dependencies_wait_for_healthy_kafka_and_redis() -> None:
    assert _depends_on(service("worker")) == {
        "kafka": "service_healthy",
        "redis": "service_healthy",
    }
    assert _depends_on(service("agent")).get("kafka") == "service_healthy"
    assert service("worker").get("restart") == "unless-stopped"
    for name, svc in compose()["services"].items():
        for dep, condition in _depends_on(svc).items():
            assert dep in compose()["services"], f"{name} depends on unknown {dep}"
            if condition == "service_healthy":
                assert "healthcheck" in service(dep), f"{name} waits for {dep}'s healthcheck"


@pytest.mark.parametrize("name", RAGWATCH_SERVICES)
def test_ragwatch_services_build_this_image(name: str) -> None:
    svc = service(name)
    build = svc["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    assert Path(ROOT, context).resolve() == ROOT
    assert "entrypoint" not in svc, "the image's ENTRYPOINT (ragwatch) must stay"


# ---------------------------------------------------------------- RAGWATCH_* settings


@pytest.mark.parametrize("name", SERVICES)
def test_every_ragwatch_variable_is_a_real_setting(name: str) -> None:
    known = env_names()
    unknown = [k for k in environment(service(name)) if k.startswith(PREFIX) and k not in known]
    assert not unknown, f"{name}: not ragwatch settings: {unknown}"


@pytest.mark.parametrize("name", SERVICES)
def test_ragwatch_variables_parse_as_settings(name: str) -> None:
    env = ragwatch_env(name)
    try:
        settings = Settings.from_env(env)
    except ConfigError as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"{name}: {exc}")
    assert len(settings.explicit) == len(env)


def test_worker_and_notifier_are_wired_to_the_compose_services() -> None:
    worker = ragwatch_env("worker")
    assert {
        "RAGWATCH_KAFKA_BOOTSTRAP",
        "RAGWATCH_REDIS_URL",
        "RAGWATCH_APP_ID",
        "RAGWATCH_LOG_LEVEL",
        "RAGWATCH_KAFKA_SESSION_TIMEOUT",
    } <= set(worker)
    notify = ragwatch_env("notify")
    assert notify["RAGWATCH_APP_ID"] == worker["RAGWATCH_APP_ID"]  # same topic, own group
    for env in (worker, notify):
        settings = Settings.from_env(env)
        assert settings.kafka_bootstrap == "kafka:9092"
        assert urlsplit(settings.redis_url).hostname == "redis"
    settings = Settings.from_env(notify)
    assert settings.webhook_urls, "the default webhook URL must be a valid http(s) URL"
    assert all(urlsplit(u).scheme in ("http", "https") for u in settings.webhook_urls)


def test_serve_publishes_its_port_on_loopback_only() -> None:
    svc = service("serve")
    settings = Settings.from_env(ragwatch_env("serve"))
    assert urlsplit(settings.redis_url).hostname == "redis"
    assert svc["ports"] == [f"127.0.0.1:{settings.serve_port}:{settings.serve_port}"]


def test_agent_is_wired_to_kafka() -> None:
    assert Settings.from_env(ragwatch_env("agent")).kafka_bootstrap == "kafka:9092"


def test_interpolation_helper() -> None:
    assert interpolate("${A:-http://h:9000/x}") == "http://h:9000/x"
    assert interpolate("${A-d},${B},$C,$$D,${E:+alt}") == "d,,,$D,"
    with pytest.raises(AssertionError):
        interpolate("${A:?set A}")


def test_environment_helper_accepts_list_and_mapping_forms() -> None:
    as_list = {"environment": ["RAGWATCH_LOG_LEVEL=${X:-DEBUG}", "RAGWATCH_APP_ID"]}
    as_map = {
        "environment": {
            "RAGWATCH_LOG_LEVEL": "${X:-DEBUG}",
            "RAGWATCH_APP_ID": None,
            "RAGWATCH_TOPIC_PARTITIONS": 8,
        }
    }
    assert environment(as_list) == {"RAGWATCH_LOG_LEVEL": "DEBUG", "RAGWATCH_APP_ID": None}
    assert environment(as_map) == {
        "RAGWATCH_LOG_LEVEL": "DEBUG",
        "RAGWATCH_APP_ID": None,
        "RAGWATCH_TOPIC_PARTITIONS": "8",
    }


# ---------------------------------------------------------------- commands


def test_worker_command_parses() -> None:
    args = build_parser().parse_args(command_argv(service("worker")))
    assert args.command == "worker"


def test_agent_command_parses_into_a_valid_simulation() -> None:
    args = build_parser().parse_args(command_argv(service("agent")))
    assert args.command == "agent"
    assert (args.source, args.scenario, args.hosts, args.gpus, args.speed) == (
        "sim",
        "leak",
        4,
        2,
        60.0,
    )
    # what `ragwatch agent` builds from these arguments must be valid too
    SimConfig(
        hosts=args.hosts,
        gpus=args.gpus,
        seed=args.seed,
        scenario=args.scenario,
        interval_s=args.interval or agent_command.DEFAULT_INTERVAL["sim"],
    )


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_installs_extras_that_pyproject_defines() -> None:
    extras = installed_extras()
    defined = set(pyproject()["project"]["optional-dependencies"])
    assert extras, "the Dockerfile must pip install '.[extras]'"
    assert extras <= defined, f"unknown extras: {sorted(extras - defined)}"
    assert {"agent", "stream"} <= extras, "the image runs both `agent` and `worker`"


def test_dockerfile_base_image_satisfies_requires_python() -> None:
    base = instructions("FROM")[0].split()[0]
    m = re.fullmatch(r"(?:docker\.io/(?:library/)?)?python:3\.(\d+)(?:[.-].*)?", base)
    assert m, f"expected a python:3.X base image, got {base}"
    required = re.fullmatch(r">=\s*3\.(\d+)", pyproject()["project"]["requires-python"])
    assert required and int(m.group(1)) >= int(required.group(1))


def test_dockerfile_copies_everything_the_package_needs() -> None:
    sources = copy_sources()
    package_dirs = set(pyproject()["tool"]["setuptools"]["package-dir"].values())
    for needed in {"pyproject.toml", *package_dirs}:
        assert needed in sources, f"Dockerfile does not COPY {needed}"
    readme = pyproject()["project"].get("readme")
    if isinstance(readme, str):
        assert any(fnmatch.fnmatchcase(readme, s) for s in sources), f"COPY {readme}"


def test_dockerfile_runs_ragwatch_as_a_non_root_user() -> None:
    users = instructions("USER")
    assert users, "the image must switch to a non-root USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    entrypoint = instructions("ENTRYPOINT")
    assert entrypoint and json.loads(entrypoint[-1]) == ["ragwatch"]
    assert "ragwatch" in pyproject()["project"]["scripts"]


def test_dockerignore_keeps_local_state_out_but_not_the_sources() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for excluded in (".venv", ".git", ".ragwatch", "build"):
        assert excluded in patterns, f".dockerignore should exclude {excluded}"
    for source in copy_sources():
        for pattern in patterns:
            if pattern.startswith("!"):
                continue
            assert not fnmatch.fnmatchcase(source, pattern.lstrip("/")), (
                f".dockerignore pattern {pattern!r} hides {source!r}, which the Dockerfile copies"
            )
