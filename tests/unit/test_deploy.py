"""deploy/: the systemd units, env examples and Kubernetes manifests, checked offline.

Nothing is installed or applied: the files are parsed (YAML with ``yaml.safe_load_all``,
units and env files line by line, as systemd reads them) and held against the code they
configure. Every ``RAGWATCH_*`` name is a real setting and every value set passes
:meth:`Settings.from_env`; the argument lists parse with the real CLI parser and select
the intended command and source; the agent sees the host's PIDs and ``/proc``, spools
on the host and gets enough time after SIGTERM for the publisher's flush.
"""

from __future__ import annotations

import inspect
import re
import shlex
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.cli import build_parser
from ragwatch.config import PREFIX, Settings, env_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
KUBERNETES = DEPLOY / "kubernetes"

NAMESPACE = "ragwatch"
CONFIGMAP = "ragwatch-config"
NODE_NAME = "gpu-node-7"
# Values a Secret would hold, by the variable they are given to (the Secret is not in git).
SECRET_VALUES = {
    "RAGWATCH_KAFKA_SASL_PASSWORD": "s3cret",
    "RAGWATCH_REDIS_URL": "redis://:pw@redis.ragwatch.svc:6379/0",
    "RAGWATCH_WEBHOOK_URLS": "https://hooks.example.internal/a,https://hooks.example.internal/b",
}
SECRET_SETTINGS = ("RAGWATCH_KAFKA_SASL_PASSWORD", "RAGWATCH_REDIS_URL", "RAGWATCH_WEBHOOK_URLS")
_NAME = re.compile(r"\bRAGWATCH_[A-Z][A-Z0-9_]*\b")


def publisher_flush_timeout() -> float:
    """Seconds ``KafkaPublisher.close()`` spends delivering before it spools the rest."""
    default = inspect.signature(KafkaPublisher.close).parameters["timeout"].default
    assert isinstance(default, int | float)
    return float(default)


# ---------------------------------------------------------------- systemd parsing

Unit = dict[str, dict[str, list[str]]]


@cache
def unit(name: str) -> Unit:
    """``{section: {key: [values in order]}}``; duplicate keys keep every value.

    Comment lines (``#``/``;``) are skipped, also inside a continuation; a trailing
    backslash joins the next line with a space, as systemd does.
    """
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for number, raw in enumerate((SYSTEMD / name).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{name}:{number}: not KEY=VALUE: {raw!r}"
        assert current is not None, f"{name}:{number}: assignment outside a section"
        current.setdefault(key.strip(), []).append(value.strip())
    assert not pending, f"{name} ends inside a continuation line"
    return sections


def unit_value(name: str, key: str, section: str = "Service") -> str | None:
    values = unit(name).get(section, {}).get(key)
    return values[-1] if values else None


def systemd_bool(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "yes", "true", "on")


_TIME_UNITS = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}


def systemd_seconds(value: str) -> float:
    """``45``, ``45s``, ``1min 30s`` -> seconds (a bare number is seconds)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value.strip())
    assert parts and "".join(n + u for n, u in parts) == re.sub(r"\s", "", value), value
    return sum(float(n) * _TIME_UNITS[u or "s"] for n, u in parts)


def exec_argv(name: str) -> list[str]:
    """ExecStart split like systemd, the binary checked and dropped."""
    starts = unit(name)["Service"]["ExecStart"]
    assert len(starts) == 1, f"{name}: one ExecStart"
    argv = shlex.split(starts[0].lstrip("-@:+!"))
    binary = PurePosixPath(argv[0])
    assert binary.is_absolute() and binary.name == "ragwatch", argv[0]
    return argv[1:]


def unit_environment(name: str) -> dict[str, str]:
    """``Environment=`` assignments of a unit (``KEY=VALUE`` words, quotes allowed)."""
    env: dict[str, str] = {}
    for line in unit(name)["Service"].get("Environment", []):
        for word in shlex.split(line):
            key, sep, value = word.partition("=")
            assert sep, f"{name}: Environment={line!r}"
            env[key] = value
    return env


def env_file(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """An EnvironmentFile: (active assignments, commented-out ``#RAGWATCH_X=...`` ones)."""
    active: dict[str, str] = {}
    commented: dict[str, str] = {}
    for number, raw in enumerate((SYSTEMD / name).read_text().splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line[0] in "#;":
            m = re.fullmatch(r"[#;]\s*(RAGWATCH_[A-Z0-9_]+)=(.*)", line)
            if m:
                commented[m[1]] = _unquote(m[2])
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()), (
            f"{name}:{number}: not KEY=VALUE: {raw!r}"
        )
        assert not key.startswith("export "), f"{name}:{number}: systemd has no 'export'"
        active[key.strip()] = _unquote(value.strip())
    return active, commented


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


# ---------------------------------------------------------------- Kubernetes parsing


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


@cache
def documents(path: Path) -> tuple[dict[str, Any], ...]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        assert isinstance(d, dict), f"{path.name}: every document is a mapping"
    return tuple(docs)


@cache
def manifests() -> tuple[dict[str, Any], ...]:
    out = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        out += [d for d in documents(path) if d.get("kind") != "Kustomization"]
    return tuple(out)


def manifest(kind: str, name: str) -> dict[str, Any]:
    found = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name!r} in deploy/kubernetes, found {len(found)}"
    return found[0]


def daemonset() -> dict[str, Any]:
    return manifest("DaemonSet", "ragwatch-agent")


def deployment() -> dict[str, Any]:
    return manifest("Deployment", "ragwatch-worker")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def main_container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1, "one container: ragwatch"
    c = containers[0]
    assert isinstance(c, dict)
    return c


def env_entries(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def configmap_data(name: str = CONFIGMAP) -> dict[str, str]:
    data = manifest("ConfigMap", name).get("data") or {}
    for k, v in data.items():
        assert isinstance(v, str), f"ConfigMap {name}: {k} must be a string, got {v!r}"
    return dict(data)


def container_environment(container: dict[str, Any]) -> dict[str, str]:
    """What the container's process sees: envFrom ConfigMaps, then env (which wins).

    Secret references get :data:`SECRET_VALUES`, ``spec.nodeName`` gets :data:`NODE_NAME`.
    """
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert set(source) <= {"configMapRef", "prefix"}, f"unexpected envFrom {source}"
        env.update(configmap_data(source["configMapRef"]["name"]))
    for name, entry in env_entries(container).items():
        if "value" in entry:
            env[name] = str(entry["value"])
            continue
        ref = entry["valueFrom"]
        if "secretKeyRef" in ref:
            env[name] = SECRET_VALUES[name]
        elif ref.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[name] = NODE_NAME
        else:
            pytest.fail(f"env {name}: unexpected valueFrom {ref}")
    return env


def ragwatch_only(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(PREFIX)}


_REF = re.compile(r"\$\((?P<name>[A-Za-z_][A-Za-z0-9_]*)\)|\$\$")


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion in args; an undefined reference fails the test
    (Kubernetes would pass it on literally)."""

    def sub(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        assert m["name"] in env, f"$({m['name']}) is not defined in the container's env"
        return env[m["name"]]

    return _REF.sub(sub, arg)


def container_args(workload: dict[str, Any]) -> list[str]:
    c = main_container(workload)
    # The image's ENTRYPOINT is `ragwatch`: args only, or an explicit `ragwatch` command.
    assert c.get("command") in (None, ["ragwatch"]), c.get("command")
    env = container_environment(c)
    return [expand(str(a), env) for a in c["args"]]


def volume_of(workload: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volumeMount, volume) of the mount that holds ``path`` (the deepest one)."""
    mounts = [
        m
        for m in main_container(workload).get("volumeMounts", [])
        if path == Path(m["mountPath"]) or Path(m["mountPath"]) in path.parents
    ]
    assert mounts, f"{path} is on no volume"
    mount = max(mounts, key=lambda m: len(Path(m["mountPath"]).parts))
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    return mount, volumes[mount["name"]]


_QUANTITY = {"m": 1e-3, "": 1.0, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6}


def quantity(value: Any) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|k|M|)", str(value))
    assert m, f"bad quantity {value!r}"
    return float(m[1]) * _QUANTITY[m[2]]


# ---------------------------------------------------------------- every file


def test_deploy_has_the_expected_files() -> None:
    expected = {
        "README.md",
        "systemd/ragwatch-agent.service",
        "systemd/agent.env.example",
        "systemd/ragwatch-worker.service",
        "systemd/worker.env.example",
        "kubernetes/agent-daemonset.yaml",
        "kubernetes/configmap.yaml",
        "kubernetes/worker-deployment.yaml",
    }
    present = {str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*") if p.is_file()}
    assert expected <= present, sorted(expected - present)


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_parses(path: Path) -> None:
    docs = documents(path)
    assert docs, f"{path.name} holds no document"
    for d in docs:
        assert d.get("apiVersion") and d.get("kind"), f"{path.name}: apiVersion and kind"
        if d["kind"] in ("Kustomization", "Namespace"):
            continue
        assert d["metadata"].get("namespace") == NAMESPACE, (
            f"{path.name}: {d['kind']} {d['metadata'].get('name')} in namespace {NAMESPACE}"
        )


def test_kustomization_lists_every_manifest() -> None:
    path = KUBERNETES / "kustomization.yaml"
    assert path.exists(), "deploy/kubernetes/kustomization.yaml is how README says to install"
    (kust,) = documents(path)
    others = {p.name for p in KUBERNETES.glob("*.yaml") if p != path}
    assert set(kust["resources"]) == others
    # the namespace comes first, so a plain `kubectl apply -k` works on an empty cluster
    namespaces = [
        r for r in kust["resources"] if documents(KUBERNETES / r)[0]["kind"] == "Namespace"
    ]
    assert namespaces and kust["resources"][0] == namespaces[0]


def test_workloads_find_their_selector_labels() -> None:
    for workload in (daemonset(), deployment()):
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]


def test_every_ragwatch_name_in_deploy_is_a_setting() -> None:
    known = set(env_names())
    named: dict[str, set[str]] = {}
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            for name in _NAME.findall(path.read_text()):
                named.setdefault(name, set()).add(str(path.relative_to(DEPLOY)))
    # the structured places, so a name the regex missed cannot hide there
    for m in manifests():
        if m["kind"] == "ConfigMap":
            for k in m.get("data") or {}:
                named.setdefault(k, set()).add(f"ConfigMap {m['metadata']['name']}")
    for workload in (daemonset(), deployment()):
        for container in pod_spec(workload)["containers"] + pod_spec(workload).get(
            "initContainers", []
        ):
            for e in container.get("env", []):
                if e["name"].startswith(PREFIX):
                    named.setdefault(e["name"], set()).add("container env")
    for name in ("agent.env.example", "worker.env.example"):
        active, commented = env_file(name)
        for k in (*active, *commented):
            named.setdefault(k, set()).add(f"systemd/{name}")
    assert named, "deploy/ names no RAGWATCH_* setting at all"
    unknown = {k: sorted(v) for k, v in named.items() if k not in known}
    assert not unknown, f"not settings (see ragwatch.config): {unknown}"


# ---------------------------------------------------------------- Kubernetes settings


def test_configmap_settings_are_valid() -> None:
    data = configmap_data()
    assert "RAGWATCH_KAFKA_BOOTSTRAP" in data
    Settings.from_env(data)  # raises ConfigError naming the bad variable
    leaked = sorted(set(data) & set(SECRET_SETTINGS))
    assert not leaked, f"secrets belong in the Secret, not the ConfigMap: {leaked}"


@pytest.mark.parametrize("workload", ["agent", "worker"])
def test_container_settings_are_valid(workload: str) -> None:
    obj = daemonset() if workload == "agent" else deployment()
    container = main_container(obj)
    refs = [s["configMapRef"]["name"] for s in container.get("envFrom", [])]
    assert refs == [CONFIGMAP]
    settings = Settings.from_env(ragwatch_only(container_environment(container)))
    assert settings.kafka_bootstrap == configmap_data()["RAGWATCH_KAFKA_BOOTSTRAP"]


def test_secrets_come_from_one_secret_never_from_literals() -> None:
    secret_names = set()
    for workload in (daemonset(), deployment()):
        for name, entry in env_entries(main_container(workload)).items():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if name in SECRET_SETTINGS:
                assert ref, f"{name} must come from a secretKeyRef, not a literal value"
            if ref:
                assert name in SECRET_SETTINGS, f"{name} from a Secret but not a secret"
                secret_names.add(ref["name"])
    assert len(secret_names) == 1, secret_names


def test_agent_sasl_password_comes_from_the_secret() -> None:
    entry = env_entries(main_container(daemonset()))["RAGWATCH_KAFKA_SASL_PASSWORD"]
    assert entry["valueFrom"]["secretKeyRef"]["key"]


def test_worker_gets_redis_and_webhooks_from_the_secret() -> None:
    env = env_entries(main_container(deployment()))
    redis = env["RAGWATCH_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert not redis.get("optional", False), "the worker cannot run without its Redis URL"
    assert env["RAGWATCH_WEBHOOK_URLS"]["valueFrom"]["secretKeyRef"]["key"]


# ---------------------------------------------------------------- the agent DaemonSet


def agent_args() -> Any:
    return build_parser().parse_args(container_args(daemonset()))


def test_daemonset_args_parse_as_the_nvml_agent() -> None:
    args = agent_args()
    assert args.command == "agent"
    assert args.source == "nvml"
    assert args.interval == 1.0
    assert not args.once and not args.json
    assert args.host == NODE_NAME, "--host $(NODE_NAME): envelopes carry the node's name"
    assert args.spool_dir == Path("/var/lib/ragwatch/spool")
    env = env_entries(main_container(daemonset()))
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_daemonset_runs_in_the_host_pid_namespace_with_host_proc() -> None:
    spec = pod_spec(daemonset())
    assert spec.get("hostPID") is True, "NVML reports host pids"
    proc_root = agent_args().proc_root
    assert proc_root != Path("/proc"), "mount the host's /proc elsewhere and pass it"
    mount, volume = volume_of(daemonset(), proc_root)
    assert Path(mount["mountPath"]) == proc_root
    assert mount.get("readOnly") is True
    assert volume["hostPath"]["path"] == "/proc"


def test_daemonset_spools_on_the_host() -> None:
    spool = agent_args().spool_dir
    mount, volume = volume_of(daemonset(), spool)
    assert not mount.get("readOnly", False)
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    assert volume["hostPath"]["path"].startswith("/var/lib/")


def test_daemonset_runs_on_gpu_nodes_only() -> None:
    spec = pod_spec(daemonset())
    tolerations = spec.get("tolerations", [])
    assert any(
        t.get("key") == "nvidia.com/gpu"
        and t.get("effect") in (None, "NoSchedule")
        and t.get("operator", "Equal") in ("Exists", "Equal")
        for t in tolerations
    ), tolerations
    selector = spec.get("nodeSelector", {}).get("nvidia.com/gpu.present")
    terms = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    by_affinity = any(
        e["key"] == "nvidia.com/gpu.present" for t in terms for e in t["matchExpressions"]
    )
    assert selector == "true" or by_affinity


def test_daemonset_sees_the_gpus_without_taking_one() -> None:
    c = main_container(daemonset())
    env = container_environment(c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    for kind in ("requests", "limits"):
        assert "nvidia.com/gpu" not in c["resources"].get(kind, {}), "it would take a GPU"


def test_daemonset_has_time_to_flush_after_sigterm() -> None:
    grace = pod_spec(daemonset())["terminationGracePeriodSeconds"]
    assert grace >= 30
    assert grace > publisher_flush_timeout(), "SIGKILL before the flush ends loses the queue"


def test_daemonset_is_small_and_not_privileged() -> None:
    spec = pod_spec(daemonset())
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        assert sc.get("privileged") is not True, c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
    agent = main_container(daemonset())
    assert agent["securityContext"].get("runAsNonRoot") is True
    res = agent["resources"]
    for r in ("cpu", "memory"):
        assert quantity(res["requests"][r]) <= quantity(res["limits"][r]), r
    assert quantity(res["limits"]["memory"]) <= 512 * 2**20


# ---------------------------------------------------------------- the worker Deployment


def test_worker_deployment_runs_the_worker() -> None:
    args = build_parser().parse_args(container_args(deployment()))
    assert args.command == "worker"
    assert deployment()["spec"]["replicas"] == 2
    assert pod_spec(deployment())["terminationGracePeriodSeconds"] >= 30


def test_worker_state_dir_is_writable() -> None:
    env = container_environment(main_container(deployment()))
    state = Settings.from_env(ragwatch_only(env)).state_dir
    assert state.is_absolute()
    mount, _ = volume_of(deployment(), state)
    assert not mount.get("readOnly", False)


# ---------------------------------------------------------------- systemd


def test_agent_unit_runs_the_nvml_agent_with_a_spool_in_its_state_dir() -> None:
    args = build_parser().parse_args(exec_argv("ragwatch-agent.service"))
    assert args.command == "agent"
    assert args.source == "nvml"
    assert args.interval == 1.0
    assert not args.once and not args.json
    assert args.spool_dir == Path("/var/lib/ragwatch/spool")
    state_dirs = unit_value("ragwatch-agent.service", "StateDirectory")
    assert state_dirs, "StateDirectory= creates the spool's parent, owned by the user"
    roots = [Path("/var/lib") / d for d in state_dirs.split()]
    assert any(r in args.spool_dir.parents for r in roots), (roots, args.spool_dir)
    writable = (unit_value("ragwatch-agent.service", "ReadWritePaths") or "").split()
    assert any(
        Path(p.lstrip("-+")) in (args.spool_dir, *args.spool_dir.parents) for p in writable
    ), f"the spool must be writable under ProtectSystem=strict: ReadWritePaths={writable}"


def test_worker_unit_runs_the_worker() -> None:
    args = build_parser().parse_args(exec_argv("ragwatch-worker.service"))
    assert args.command == "worker"


@pytest.mark.parametrize("name", ["ragwatch-agent.service", "ragwatch-worker.service"])
def test_unit_restarts_stops_gracefully_and_runs_unprivileged(name: str) -> None:
    assert unit_value(name, "Restart") == "always"
    assert unit_value(name, "RestartSec")
    assert unit_value(name, "KillSignal") in (None, "SIGTERM", "TERM", "15")
    stop = unit_value(name, "TimeoutStopSec")
    assert stop and systemd_seconds(stop) >= 30
    user = unit_value(name, "User")
    assert systemd_bool(unit_value(name, "DynamicUser")) or (user and user != "root")
    assert systemd_bool(unit_value(name, "NoNewPrivileges"))
    assert unit_value(name, "ProtectSystem") == "strict"
    assert systemd_bool(unit_value(name, "PrivateTmp"))
    assert unit_value(name, "ProtectHome") in ("yes", "true", "read-only", "tmpfs")
    assert unit_value(name, "WantedBy", section="Install") == "multi-user.target"


def test_agent_unit_flushes_and_keeps_the_gpus_visible() -> None:
    name = "ragwatch-agent.service"
    stop = systemd_seconds(unit_value(name, "TimeoutStopSec") or "0")
    assert stop > publisher_flush_timeout(), "SIGKILL before the flush ends loses the queue"
    assert not systemd_bool(unit_value(name, "PrivateDevices")), "NVML needs /dev/nvidia*"
    assert unit_value(name, "DevicePolicy") in (None, "auto"), "NVML needs /dev/nvidia*"
    assert unit_value(name, "ProtectProc") in (None, "default"), "other users' /proc is read"
    assert unit_value(name, "ProcSubset") in (None, "all"), "the agent reads /proc/<pid>"


@pytest.mark.parametrize(
    ("unit_name", "example"),
    [
        ("ragwatch-agent.service", "agent.env.example"),
        ("ragwatch-worker.service", "worker.env.example"),
    ],
)
def test_env_example_is_the_units_environment_file(unit_name: str, example: str) -> None:
    files = unit(unit_name)["Service"].get("EnvironmentFile", [])
    assert len(files) == 1, f"{unit_name}: one EnvironmentFile"
    path = PurePosixPath(files[0].lstrip("-"))
    assert path.is_absolute() and path.parent == PurePosixPath("/etc/ragwatch")
    assert f"{path.name}.example" == example


@pytest.mark.parametrize(
    ("unit_name", "example"),
    [
        ("ragwatch-agent.service", "agent.env.example"),
        ("ragwatch-worker.service", "worker.env.example"),
    ],
)
def test_env_example_settings_are_valid(unit_name: str, example: str) -> None:
    active, commented = env_file(example)
    assert "RAGWATCH_KAFKA_BOOTSTRAP" in active
    # EnvironmentFile= overrides Environment=, as in systemd
    env = {**unit_environment(unit_name), **active}
    Settings.from_env(env)
    # the commented-out SASL_SSL example, switched on, is complete and valid too
    sasl = Settings.from_env({**env, **commented})
    assert sasl.kafka_security_protocol == "SASL_SSL"
    assert sasl.kafka_sasl_password


def test_worker_unit_keeps_its_state_in_its_state_directory() -> None:
    name = "ragwatch-worker.service"
    env = {**unit_environment(name), **env_file("worker.env.example")[0]}
    state = Settings.from_env(env).state_dir
    state_dirs = (unit_value(name, "StateDirectory") or "").split()
    assert any(state == Path("/var/lib") / d for d in state_dirs), (state, state_dirs)
    assert Settings.from_env(env).redis_url.startswith(("redis://", "rediss://"))
