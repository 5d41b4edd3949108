"""deploy/: the systemd units, env examples and Kubernetes manifests, checked offline.

Nothing is installed or applied: the files are parsed (YAML with ``yaml.safe_load_all``,
units and env files line by line, as systemd reads them) and held against the code they
configure. Every ``RAGWATCH_*`` name is a real setting and every value set passes
:meth:`Settings.from_env`; the argument lists parse with the real CLI parser and select
the intended command and source; the agent sees the host's PIDs and ``/proc``, spools
on the host and gets enough time after SIGTERM for the publisher's flush; secrets come
only from the one Secret; exactly one notifier runs (one replica, ``Recreate``) and only
it gets the webhook settings; serve listens where its Service and probes look, on
loopback under systemd, and needs a token wherever it does not.
"""

from __future__ import annotations

import dataclasses
import inspect
import ipaddress
import re
import shlex
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from ragwatch.agents.publisher import KafkaPublisher
from ragwatch.cli import build_parser
from ragwatch.config import PREFIX, Secret, Settings, env_names

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
KUBERNETES = DEPLOY / "kubernetes"

NAMESPACE = "ragwatch"
CONFIGMAP = "ragwatch-config"
NOTIFY_CONFIGMAP = "ragwatch-notify"
NODE_NAME = "gpu-node-7"
# Values a Secret would hold, by the variable they are given to (the Secret is not in git).
SECRET_VALUES = {
    "RAGWATCH_KAFKA_SASL_PASSWORD": "s3cret",
    "RAGWATCH_REDIS_URL": "redis://:pw@redis.ragwatch.svc:6379/0",
    "RAGWATCH_WEBHOOK_URLS": "https://hooks.example.internal/a,https://hooks.example.internal/b",
    "RAGWATCH_ALERTMANAGER_URLS": "https://am:pw@alertmanager.example.internal:9093",
    "RAGWATCH_WEBHOOK_HMAC_SECRET": "hmac-s3cret",
    "RAGWATCH_SERVE_TOKEN": "t0ken",
}
# A ${VAR} of the notify file (not a RAGWATCH_* setting) taken from the Secret.
NOTIFY_FILE_SECRET = "receiver-s3cret"
# Secret settings, read off Settings: masked in its repr, or a Secret value.
SECRET_SETTINGS = frozenset(
    PREFIX + f.name.upper()
    for f in dataclasses.fields(Settings)
    if "parse" in f.metadata and (not f.repr or isinstance(f.default, Secret))
)
# Settings only the notifier reads: the worker no longer delivers anything.
NOTIFY_ONLY = ("RAGWATCH_WEBHOOK_URLS", "RAGWATCH_WEBHOOK_HMAC_SECRET", "RAGWATCH_NOTIFY_FILE")
SERVE_ONLY = ("RAGWATCH_SERVE_HOST", "RAGWATCH_SERVE_PORT", "RAGWATCH_SERVE_TOKEN")
# role -> (kind, name) of its workload; its unit is ragwatch-<role>.service, with the
# EnvironmentFile /etc/ragwatch/<role>.env shipped as systemd/<role>.env.example
WORKLOADS = {
    "agent": ("DaemonSet", "ragwatch-agent"),
    "worker": ("Deployment", "ragwatch-worker"),
    "notify": ("Deployment", "ragwatch-notify"),
    "serve": ("Deployment", "ragwatch-serve"),
}
ROLES = tuple(WORKLOADS)
UNITS = {role: f"ragwatch-{role}.service" for role in ROLES}
ENV_EXAMPLES = {role: f"{role}.env.example" for role in ROLES}
# the roles that talk to Kafka (serve reads Redis only)
KAFKA_ROLES = ("agent", "worker", "notify")
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


def unit_settings(role: str, *, commented: bool = False) -> Settings:
    """The unit's settings: Environment=, then its env example (and its commented lines)."""
    active, off = env_file(ENV_EXAMPLES[role])
    env = {**unit_environment(UNITS[role]), **active, **(off if commented else {})}
    return Settings.from_env(env)


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


def workload(role: str) -> dict[str, Any]:
    return manifest(*WORKLOADS[role])


def daemonset() -> dict[str, Any]:
    return workload("agent")


def deployment() -> dict[str, Any]:
    """The worker's Deployment."""
    return workload("worker")


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
            env[name] = SECRET_VALUES[name] if name.startswith(PREFIX) else NOTIFY_FILE_SECRET
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


def container_settings(role: str) -> Settings:
    return Settings.from_env(ragwatch_only(container_environment(main_container(workload(role)))))


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


def container_port(workload: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a number, or the name of a containerPort) as a number."""
    ports = main_container(workload).get("ports", [])
    if isinstance(port, str):
        named = [p["containerPort"] for p in ports if p.get("name") == port]
        assert len(named) == 1, f"no containerPort named {port!r}: {ports}"
        return int(named[0])
    assert any(p["containerPort"] == port for p in ports), f"{port} is no containerPort"
    return port


def commented_notify_file(path: Path) -> str | None:
    """The value of a commented-out ``# - name: RAGWATCH_NOTIFY_FILE`` env entry."""
    m = re.search(
        r"^\s*#\s*-\s*name:\s*RAGWATCH_NOTIFY_FILE\s*\n\s*#\s*value:\s*(\S+)\s*$",
        path.read_text(),
        re.M,
    )
    return m[1] if m else None


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
        "systemd/ragwatch-notify.service",
        "systemd/notify.env.example",
        "systemd/ragwatch-serve.service",
        "systemd/serve.env.example",
        "kubernetes/namespace.yaml",
        "kubernetes/kustomization.yaml",
        "kubernetes/agent-daemonset.yaml",
        "kubernetes/configmap.yaml",
        "kubernetes/worker-deployment.yaml",
        "kubernetes/notify-deployment.yaml",
        "kubernetes/serve-deployment.yaml",
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


@pytest.mark.parametrize("role", ROLES)
def test_workloads_find_their_selector_labels(role: str) -> None:
    obj = workload(role)
    selector = obj["spec"]["selector"]["matchLabels"]
    labels = obj["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items(), obj["metadata"]["name"]
    others = [workload(r)["spec"]["template"]["metadata"]["labels"] for r in ROLES if r != role]
    assert not any(selector.items() <= o.items() for o in others), "selects another's pods"


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
    for role in ROLES:
        spec = pod_spec(workload(role))
        for container in spec["containers"] + spec.get("initContainers", []):
            for e in container.get("env", []):
                if e["name"].startswith(PREFIX):
                    named.setdefault(e["name"], set()).add("container env")
    for name in ENV_EXAMPLES.values():
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


def test_every_secret_setting_has_a_test_value() -> None:
    assert set(SECRET_VALUES) == SECRET_SETTINGS, "SECRET_VALUES is out of date"
    Settings.from_env(SECRET_VALUES)


@pytest.mark.parametrize("role", ROLES)
def test_container_settings_are_valid(role: str) -> None:
    container = main_container(workload(role))
    refs = [s["configMapRef"]["name"] for s in container.get("envFrom", [])]
    assert refs == [CONFIGMAP]
    settings = container_settings(role)
    assert settings.kafka_bootstrap == configmap_data()["RAGWATCH_KAFKA_BOOTSTRAP"]


def test_secrets_come_from_one_secret_never_from_literals() -> None:
    secret_names = set()
    for role in ROLES:
        for name, entry in env_entries(main_container(workload(role))).items():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if name in SECRET_SETTINGS:
                assert ref, f"{role}: {name} must come from a secretKeyRef, not a literal"
            if not ref:
                continue
            if name.startswith(PREFIX):
                assert name in SECRET_SETTINGS, f"{role}: {name} from a Secret but not a secret"
            else:  # a ${VAR} of the notify file
                assert role == "notify", f"{role}: {name} from a Secret but not a setting"
            secret_names.add(ref["name"])
    assert len(secret_names) == 1, secret_names


def test_the_secret_is_the_one_the_worker_uses() -> None:
    worker_secret = env_entries(main_container(deployment()))["RAGWATCH_REDIS_URL"]
    expected = worker_secret["valueFrom"]["secretKeyRef"]["name"]
    for role in ("notify", "serve"):
        for name, entry in env_entries(main_container(workload(role))).items():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == expected, f"{role}: {name} from {ref['name']}"


@pytest.mark.parametrize("role", ["worker", "notify", "serve"])
def test_redis_url_comes_from_the_secret_and_is_required(role: str) -> None:
    entry = env_entries(main_container(workload(role)))["RAGWATCH_REDIS_URL"]
    ref = entry["valueFrom"]["secretKeyRef"]
    assert not ref.get("optional", False), f"{role} cannot run without its Redis URL"
    assert container_settings(role).redis_url == SECRET_VALUES["RAGWATCH_REDIS_URL"]


def test_agent_sasl_password_comes_from_the_secret() -> None:
    entry = env_entries(main_container(daemonset()))["RAGWATCH_KAFKA_SASL_PASSWORD"]
    assert entry["valueFrom"]["secretKeyRef"]["key"]


def test_only_the_notifier_gets_the_webhook_settings() -> None:
    for role in ROLES:
        env = env_entries(main_container(workload(role)))
        given = sorted(set(env) & set(NOTIFY_ONLY))
        if role != "notify":
            assert not given, f"{role} delivers nothing, yet gets {given}"
    assert not set(configmap_data()) & set(NOTIFY_ONLY), "the notifier's own, not shared"
    env = env_entries(main_container(workload("notify")))
    for name in ("RAGWATCH_WEBHOOK_URLS", "RAGWATCH_WEBHOOK_HMAC_SECRET"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["key"] and ref.get("optional") is True, f"{name}: optional Secret key"
    settings = container_settings("notify")
    assert settings.webhook_urls == tuple(SECRET_VALUES["RAGWATCH_WEBHOOK_URLS"].split(","))
    assert settings.webhook_hmac_secret.get() == SECRET_VALUES["RAGWATCH_WEBHOOK_HMAC_SECRET"]


def test_only_serve_gets_the_serve_settings() -> None:
    assert not set(configmap_data()) & set(SERVE_ONLY), "serve's own, not shared"
    for role in ROLES:
        given = sorted(set(env_entries(main_container(workload(role)))) & set(SERVE_ONLY))
        if role != "serve":
            assert not given, f"{role} gets {given}"


@pytest.mark.parametrize("role", ["worker", "notify", "serve"])
def test_cluster_pods_meet_the_restricted_pod_security_level(role: str) -> None:
    obj = workload(role)
    spec = pod_spec(obj)
    for key in ("hostPID", "hostNetwork", "hostIPC"):
        assert not spec.get(key), f"{role}: {key}"
    assert spec.get("automountServiceAccountToken") is False, "no Kubernetes API needed"
    for v in spec.get("volumes", []):
        assert set(v) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"}, v
    pod_sc = spec.get("securityContext", {})
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = {**pod_sc, **c.get("securityContext", {})}
        assert sc.get("runAsNonRoot") is True, c["name"]
        assert sc.get("runAsUser", 1) != 0, c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("privileged") is not True, c["name"]
        assert sc.get("readOnlyRootFilesystem") is True, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert not sc.get("capabilities", {}).get("add"), c["name"]
        assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", c["name"]
    res = main_container(obj)["resources"]
    for r in ("cpu", "memory"):
        assert quantity(res["requests"][r]) <= quantity(res["limits"][r]), (role, r)


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


def test_daemonset_reads_the_kubelets_pod_resources_socket_read_only() -> None:
    from ragwatch.agents.podresources import DEFAULT_SOCKET

    args = agent_args()
    assert not args.no_pod_resources
    socket = args.pod_resources_socket or DEFAULT_SOCKET
    mount, volume = volume_of(daemonset(), socket)
    assert mount.get("readOnly") is True
    assert Path(mount["mountPath"]) == socket.parent
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    assert pod_spec(daemonset()).get("automountServiceAccountToken") is False, "no RBAC needed"


def test_the_spool_belongs_to_the_user_the_agent_runs_as() -> None:
    (init,) = pod_spec(daemonset())["initContainers"]
    uid = main_container(daemonset())["securityContext"]["runAsUser"]
    gid = main_container(daemonset())["securityContext"]["runAsGroup"]
    assert init["command"][0] == "chown" and f"{uid}:{gid}" in init["command"]
    assert init["command"][-1] == str(agent_args().spool_dir)


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
    sc = agent["securityContext"]
    # uid 0 only for the kubelet's root-only socket, and then without any capability
    assert sc.get("runAsNonRoot") is True or (
        sc.get("runAsUser") == 0 and not agent_args().no_pod_resources
    )
    assert sc.get("capabilities", {}).get("drop") == ["ALL"]
    assert not sc.get("capabilities", {}).get("add")
    assert sc.get("readOnlyRootFilesystem") is True
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


def test_worker_deployment_does_not_deliver() -> None:
    text = (KUBERNETES / "worker-deployment.yaml").read_text().lower()
    assert "webhook" not in text, "the worker publishes to ragwatch.alerts; notify delivers"


def test_worker_state_dir_is_writable() -> None:
    env = container_environment(main_container(deployment()))
    state = Settings.from_env(ragwatch_only(env)).state_dir
    assert state.is_absolute()
    mount, _ = volume_of(deployment(), state)
    assert not mount.get("readOnly", False)


# ---------------------------------------------------------------- the notify Deployment


def test_notify_deployment_runs_exactly_one_notifier() -> None:
    obj = workload("notify")
    args = build_parser().parse_args(container_args(obj))
    assert args.command == "notify"
    assert obj["spec"]["replicas"] == 1, "two notifiers split the alerts and their state"
    strategy = obj["spec"]["strategy"]
    assert strategy["type"] == "Recreate", "a rolling update runs two at once"
    assert "rollingUpdate" not in strategy
    autoscaled = [
        m
        for m in manifests()
        if m["kind"] == "HorizontalPodAutoscaler"
        and m["spec"]["scaleTargetRef"]["name"] == obj["metadata"]["name"]
    ]
    assert not autoscaled, "never scale the notifier"
    assert pod_spec(obj)["terminationGracePeriodSeconds"] >= 30


def test_notify_file_is_an_optional_configmap_mounted_read_only() -> None:
    obj = workload("notify")
    env = env_entries(main_container(obj))
    path = env["RAGWATCH_NOTIFY_FILE"]["value"] if "RAGWATCH_NOTIFY_FILE" in env else None
    path = path or commented_notify_file(KUBERNETES / "notify-deployment.yaml")
    assert path, "set RAGWATCH_NOTIFY_FILE, or show it commented out, in the notifier's env"
    notify_file = Settings.from_env({"RAGWATCH_NOTIFY_FILE": path}).notify_file
    assert notify_file is not None and notify_file.is_absolute()
    mount, volume = volume_of(obj, notify_file)
    assert mount.get("readOnly") is True
    assert notify_file.parent == Path(mount["mountPath"]), "a ConfigMap key is a file there"
    assert volume["configMap"]["name"] == NOTIFY_CONFIGMAP
    assert volume["configMap"].get("optional") is True, "the pod starts without a notify file"


# ---------------------------------------------------------------- the serve Deployment


def serve_args() -> Any:
    return build_parser().parse_args(container_args(workload("serve")))


def serve_listen() -> tuple[str, int]:
    """(host, port) serve binds in its pod: ``--host``/``--port`` win over the settings."""
    args, settings = serve_args(), container_settings("serve")
    return (
        args.host or settings.serve_host,
        settings.serve_port if args.port is None else args.port,
    )


def test_serve_deployment_runs_serve_on_the_pods_address() -> None:
    assert serve_args().command == "serve"
    host, port = serve_listen()
    assert ipaddress.ip_address(host).is_unspecified, "127.0.0.1 is unreachable from outside"
    assert container_port(workload("serve"), "http") == port
    assert container_settings("serve").serve_token, "reachable by every pod: a token"
    ref = env_entries(main_container(workload("serve")))["RAGWATCH_SERVE_TOKEN"]
    assert not ref["valueFrom"]["secretKeyRef"].get("optional", False)


@pytest.mark.parametrize(
    ("probe", "path"), [("readinessProbe", "/readyz"), ("livenessProbe", "/livez")]
)
def test_serve_probes_hit_readyz_and_livez(probe: str, path: str) -> None:
    """Readiness follows Redis answering; liveness never reads Redis (a Redis that refuses
    writes, which turns /healthz to 503, neither empties the Service nor restarts pods)."""
    from ragwatch.console.serve import PUBLIC_PATHS

    obj = workload("serve")
    get = main_container(obj)[probe]["httpGet"]
    assert get["path"] == path
    assert get["path"] in PUBLIC_PATHS, "probes carry no bearer token"
    assert container_port(obj, get["port"]) == serve_listen()[1]
    assert get.get("scheme", "HTTP") == "HTTP"


def test_serve_liveness_is_more_patient_than_readiness() -> None:
    c = main_container(workload("serve"))

    def window(probe: dict[str, Any]) -> int:
        return int(probe.get("periodSeconds", 10)) * int(probe.get("failureThreshold", 3))

    # a process that stops answering is restarted only after a while
    assert window(c["livenessProbe"]) >= max(window(c["readinessProbe"]), 60)


def test_serve_service_reaches_the_serve_pods_on_8080() -> None:
    svc = manifest("Service", "ragwatch-serve")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    labels = workload("serve")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    assert port["port"] == 8080
    target = port.get("targetPort", port["port"])
    assert container_port(workload("serve"), target) == serve_listen()[1]
    assert port.get("protocol", "TCP") == "TCP"


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


@pytest.mark.parametrize("role", ["worker", "notify", "serve"])
def test_unit_runs_its_command(role: str) -> None:
    args = build_parser().parse_args(exec_argv(UNITS[role]))
    assert args.command == role


@pytest.mark.parametrize("name", UNITS.values())
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


# [Service] keys of the worker unit that are not sandboxing (its command, restarts,
# environment and state directory); every other one is, and the other units copy it.
_NOT_SANDBOXING = frozenset(
    {
        "Type", "User", "Group", "Environment", "EnvironmentFile", "ExecStart", "Restart",
        "RestartSec", "KillSignal", "TimeoutStopSec", "StateDirectory", "StateDirectoryMode",
        "WorkingDirectory", "ReadWritePaths",
    }
)  # fmt: skip


@pytest.mark.parametrize("role", ["notify", "serve"])
def test_network_only_units_are_hardened_like_the_worker(role: str) -> None:
    worker = unit(UNITS["worker"])["Service"]
    mine = unit(UNITS[role])["Service"]
    for key, values in worker.items():
        if key not in _NOT_SANDBOXING:
            assert mine.get(key) == values, f"{UNITS[role]}: {key}={mine.get(key)}, worker {values}"
    # it writes no file: nothing writable under ProtectSystem=strict, no state directory
    for key in ("StateDirectory", "ReadWritePaths", "RuntimeDirectory", "CacheDirectory"):
        assert key not in mine, f"{UNITS[role]}: {key}= (it keeps its state in Redis)"


@pytest.mark.parametrize("role", ROLES)
def test_env_example_is_the_units_environment_file(role: str) -> None:
    unit_name, example = UNITS[role], ENV_EXAMPLES[role]
    files = unit(unit_name)["Service"].get("EnvironmentFile", [])
    assert len(files) == 1, f"{unit_name}: one EnvironmentFile"
    path = PurePosixPath(files[0].lstrip("-"))
    assert path.is_absolute() and path.parent == PurePosixPath("/etc/ragwatch")
    assert f"{path.name}.example" == example


@pytest.mark.parametrize("role", KAFKA_ROLES)
def test_env_example_settings_are_valid(role: str) -> None:
    unit_name, example = UNITS[role], ENV_EXAMPLES[role]
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


@pytest.mark.parametrize("role", ["worker", "notify", "serve"])
def test_redis_users_get_a_redis_url(role: str) -> None:
    assert "RAGWATCH_REDIS_URL" in env_file(ENV_EXAMPLES[role])[0]
    assert unit_settings(role).redis_url.startswith(("redis://", "rediss://"))


def test_notifier_and_workers_agree_on_topics_group_and_keys() -> None:
    worker, notify = unit_settings("worker"), unit_settings("notify")
    for field in ("topic_prefix", "topic_partitions", "app_id", "redis_prefix"):
        assert getattr(notify, field) == getattr(worker, field), field
    assert unit_settings("serve").redis_prefix == worker.redis_prefix


def test_webhook_settings_moved_from_the_worker_to_the_notifier() -> None:
    for role in ROLES:
        active, commented = env_file(ENV_EXAMPLES[role])
        given = sorted((set(active) | set(commented)) & set(NOTIFY_ONLY))
        if role != "notify":
            assert not given, f"{ENV_EXAMPLES[role]}: {given} are the notifier's"
    assert "RAGWATCH_WEBHOOK_URLS" in env_file("notify.env.example")[0]
    assert unit_settings("notify").webhook_urls
    text = (SYSTEMD / UNITS["worker"]).read_text().lower()
    assert "webhook" not in text, "the worker publishes to ragwatch.alerts; notify delivers"


def test_notify_unit_can_read_its_notify_file() -> None:
    """The notify file (set, or commented out in the example) is readable in the sandbox."""
    name = UNITS["notify"]
    notify_file = unit_settings("notify", commented=True).notify_file
    assert notify_file is not None, "show RAGWATCH_NOTIFY_FILE in notify.env.example"
    assert notify_file.is_absolute() and notify_file.parent == Path("/etc/ragwatch")
    hidden = (
        {Path("/tmp"), Path("/var/tmp")} if systemd_bool(unit_value(name, "PrivateTmp")) else set()
    )
    if unit_value(name, "ProtectHome") in ("yes", "true", "tmpfs"):
        hidden |= {Path("/home"), Path("/root"), Path("/run/user")}
    for key in ("InaccessiblePaths", "TemporaryFileSystem"):
        hidden |= {
            Path(p.lstrip("-+").split(":")[0]) for p in (unit_value(name, key) or "").split()
        }
    assert not hidden & {notify_file, *notify_file.parents}, (notify_file, hidden)


def test_serve_unit_binds_loopback() -> None:
    args = build_parser().parse_args(exec_argv(UNITS["serve"]))
    host = args.host or unit_settings("serve").serve_host
    assert ipaddress.ip_address(host).is_loopback, f"{host}: a TLS proxy or a token first"


def test_serve_unit_needs_no_kafka() -> None:
    active, commented = env_file(ENV_EXAMPLES["serve"])
    kafka = sorted(k for k in (*active, *commented) if k.startswith("RAGWATCH_KAFKA_"))
    assert not kafka, f"serve reads Redis only: {kafka}"
    assert unit_settings("serve", commented=True).serve_token, "show the token, commented out"
