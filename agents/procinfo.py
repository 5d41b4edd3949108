"""What ``/proc`` says about a process that holds GPU memory: name, host RSS, container.

NVML reports pids; everything else about a process comes from the proc filesystem. The
root is injectable so tests (and agents that see the host's ``/proc`` mounted elsewhere,
e.g. ``/host/proc``) can point it at another tree. Every reader returns ``None`` instead
of raising when the process is gone or the file is unreadable: a pid can exit between
NVML listing it and us reading its files.

Container ids are read from ``/proc/<pid>/cgroup`` (cgroup v1 and v2) and shortened to
the 12 hex characters ``docker ps`` shows. Recognised layouts: docker
(``/docker/<id>``, ``docker-<id>.scope``), containerd and CRI-O under Kubernetes
(``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``/kubepods/.../pod<uid>/<id>``),
and podman (``libpod-<id>.scope``; its ``libpod-conmon-`` monitor is not a container).
A private cgroup namespace shows only ``0::/``; the id cannot be known then.

>>> import os
>>> info = ProcInfo()
>>> info.exists(os.getpid()), info.rss_bytes(os.getpid()) > 0
(True, True)
>>> container_id_from_cgroup("0::/system.slice/docker-" + "ab" * 32 + ".scope")
'abababababab'

:class:`ProcessTable` turns NVML's ``(pid, used memory)`` pairs into
:class:`~ragwatch.schema.ProcessSample` records: name and container are read once per
pid and cached until the pid leaves its GPU; RSS is read every tick; a pid with no
``/proc`` entry is ``dead``. It also remembers which pids each GPU listed, to report
the ones that left.

>>> table = ProcessTable(info)
>>> table.sample(os.getpid(), 1024).dead
False
>>> table.exits("gpu0", {1: "a", 2: "b"}), table.exits("gpu0", {2: "b"})
([], [(1, 'a')])
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path

from ragwatch.schema import ProcessSample

# A 64-hex container id as a whole path segment, optionally with a runtime prefix and
# a systemd ".scope" suffix.
_CONTAINER_SEGMENT = re.compile(
    r"^(?:docker-|cri-containerd-|crio-|libpod-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
_READ_LIMIT = 64 * 1024


def container_id_from_cgroup(text: str) -> str | None:
    """The short (12 hex) container id in the text of a ``/proc/<pid>/cgroup`` file.

    Each line is ``hierarchy-id:controllers:path``; the deepest path segment that is a
    container id wins. ``None`` when no line names a container.
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for segment in reversed(path.split("/")):
            m = _CONTAINER_SEGMENT.match(segment)
            if m:
                return m.group(1)[:12]
    return None


class ProcInfo:
    """Readers for one proc filesystem (default ``/proc``).

    ``page_size`` converts ``statm`` pages to bytes; it defaults to this host's.
    """

    def __init__(self, root: Path = Path("/proc"), page_size: int | None = None) -> None:
        self.root = root
        self._prefix = str(root).rstrip("/") + "/"
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")

    def _read(self, pid: int, name: str) -> str | None:
        """The text of ``<root>/<pid>/<name>``, or ``None`` if it cannot be read."""
        try:
            fd = os.open(f"{self._prefix}{pid}/{name}", os.O_RDONLY)
        except OSError:
            return None
        try:
            return os.read(fd, _READ_LIMIT).decode("utf-8", "replace")
        except OSError:
            return None
        finally:
            os.close(fd)

    def exists(self, pid: int) -> bool:
        """Whether ``pid`` still has a directory under the proc root."""
        return os.path.isdir(f"{self._prefix}{pid}")

    def rss_bytes(self, pid: int) -> int | None:
        """Resident set size in bytes, from ``statm`` (or ``status`` VmRSS as a fallback)."""
        statm = self._read(pid, "statm")
        if statm is not None:
            fields = statm.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * self.page_size
        return self._status_rss(pid)

    def _status_rss(self, pid: int) -> int | None:
        status = self._read(pid, "status")
        if status is None:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    return int(parts[1]) * 1024  # reported in kB
        return None

    def process_name(self, pid: int) -> str | None:
        """The command name (``comm``, at most 15 characters), or ``None``."""
        comm = self._read(pid, "comm")
        if comm is None:
            return None
        return comm.rstrip("\n") or None

    def container_id(self, pid: int) -> str | None:
        """The short container id of ``pid``; ``None`` outside containers or if unknown."""
        text = self._read(pid, "cgroup")
        return None if text is None else container_id_from_cgroup(text)


class ProcessTable:
    """Process samples for the pids NVML lists, with per-pid identity cached.

    ``fallback_name(pid)`` names a pid whose ``comm`` cannot be read (the NVML agent
    passes ``nvmlSystemGetProcessName``).
    """

    def __init__(
        self, proc: ProcInfo, fallback_name: Callable[[int], str | None] | None = None
    ) -> None:
        self.proc = proc
        self._fallback = fallback_name or (lambda pid: None)
        self._idents: dict[int, tuple[str, str | None]] = {}
        self._present: dict[Hashable, dict[int, str]] = {}

    def sample(self, pid: int, gpu_mem: int) -> ProcessSample:
        """The sample of one pid holding ``gpu_mem`` bytes; ``dead`` if it left ``/proc``."""
        rss = self.proc.rss_bytes(pid)
        if rss is None and not self.proc.exists(pid):
            if pid not in self._idents:
                self._idents[pid] = (self._fallback(pid) or "", None)
            return ProcessSample(pid=pid, name=self._idents[pid][0], gpu_mem=gpu_mem, dead=True)
        name, container = self._idents.get(pid) or self._identify(pid)
        return ProcessSample(pid=pid, name=name, gpu_mem=gpu_mem, rss=rss, container=container)

    def _identify(self, pid: int) -> tuple[str, str | None]:
        name = self.proc.process_name(pid) or self._fallback(pid) or ""
        ident = self._idents[pid] = (name, self.proc.container_id(pid))
        return ident

    def exits(self, key: Hashable, current: Mapping[int, str]) -> list[tuple[int, str]]:
        """``(pid, name)`` of each pid listed under ``key`` last time and missing now."""
        gone = [
            (pid, name) for pid, name in self._present.get(key, {}).items() if pid not in current
        ]
        for pid, _ in gone:
            self._idents.pop(pid, None)
        self._present[key] = dict(current)
        return gone
