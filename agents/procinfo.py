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

The Kubernetes pod UID is read from the same file (:func:`pod_uid_from_cgroup`): the
``pod<uid>`` segment of the cgroupfs driver (``/kubepods/burstable/pod<uid>/<id>``) or
of the systemd driver (``kubepods-burstable-pod<uid_with_underscores>.slice``). A reader
in a private cgroup namespace (a pod's, on cgroup v2) sees other pods' paths relative to
its own (``/../../pod<uid>/<id>``); those count too. No ``pod`` segment, no pod: a host
process, even in a container of its own.

>>> import os
>>> info = ProcInfo()
>>> info.exists(os.getpid()), info.rss_bytes(os.getpid()) > 0
(True, True)
>>> container_id_from_cgroup("0::/system.slice/docker-" + "ab" * 32 + ".scope")
'abababababab'
>>> pod_uid_from_cgroup("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort"
...                     "-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-x.scope")
'0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b'

:class:`ProcessTable` turns NVML's ``(pid, used memory)`` pairs into
:class:`~ragwatch.schema.ProcessSample` records: name, container id and pod UID are read
once per pid and cached until the pid leaves its GPU; RSS is read every tick; a pid with
no ``/proc`` entry is ``dead``. It also remembers which pids each GPU listed, to report
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
from dataclasses import dataclass
from pathlib import Path

from ragwatch.schema import ProcessSample

# A 64-hex container id as a whole path segment, optionally with a runtime prefix and
# a systemd ".scope" suffix.
_CONTAINER_SEGMENT = re.compile(
    r"^(?:docker-|cri-containerd-|crio-|libpod-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
# A pod's cgroup: ``pod<uid>`` (cgroupfs driver) or ``<...kubepods...>-pod<uid>.slice``
# (systemd driver, dashes in the UID as underscores). A UID is a UUID, or 32 hex digits
# for a static pod (a hash of its manifest).
_POD_SEGMENT = re.compile(
    r"^(?:(?P<slice>\S*kubepods\S*)-)?pod"
    r"(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$"
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


def pod_uid_from_cgroup(text: str) -> str | None:
    """The Kubernetes pod UID in the text of a ``/proc/<pid>/cgroup`` file, or ``None``.

    A bare ``pod<uid>`` segment counts only below a ``kubepods`` segment, or below ``..``
    (a path relative to the reader's own cgroup namespace).
    """
    for line in text.splitlines():
        segments = line.split(":", 2)[-1].split("/")
        for i, segment in enumerate(segments):
            m = _POD_SEGMENT.match(segment)
            if m and (m["slice"] or any("kubepods" in s or s == ".." for s in segments[:i])):
                return m["uid"].replace("_", "-")
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
        return self.cgroup_ids(pid)[0]

    def cgroup_ids(self, pid: int) -> tuple[str | None, str | None]:
        """(short container id, Kubernetes pod UID) of ``pid``, from one read of its cgroup."""
        text = self._read(pid, "cgroup")
        if text is None:
            return None, None
        return container_id_from_cgroup(text), pod_uid_from_cgroup(text)


@dataclass(frozen=True, slots=True)
class _Ident:
    """What is read once per pid: its name, container id and pod UID."""

    name: str
    container: str | None = None
    pod_uid: str | None = None


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
        self._idents: dict[int, _Ident] = {}
        self._present: dict[Hashable, dict[int, str]] = {}

    def sample(self, pid: int, gpu_mem: int) -> ProcessSample:
        """The sample of one pid holding ``gpu_mem`` bytes; ``dead`` if it left ``/proc``."""
        rss = self.proc.rss_bytes(pid)
        if rss is None and not self.proc.exists(pid):
            if pid not in self._idents:
                self._idents[pid] = _Ident(self._fallback(pid) or "")
            return ProcessSample(pid=pid, name=self._idents[pid].name, gpu_mem=gpu_mem, dead=True)
        ident = self._idents.get(pid) or self._identify(pid)
        return ProcessSample(
            pid=pid, name=ident.name, gpu_mem=gpu_mem, rss=rss, container=ident.container
        )

    def pod_uid(self, pid: int) -> str | None:
        """The pod UID of ``pid`` (cached as its name is); ``None`` outside pods or if gone."""
        ident = self._idents.get(pid)
        if ident is None and self.proc.exists(pid):
            ident = self._identify(pid)
        return None if ident is None else ident.pod_uid

    def _identify(self, pid: int) -> _Ident:
        name = self.proc.process_name(pid) or self._fallback(pid) or ""
        ident = self._idents[pid] = _Ident(name, *self.proc.cgroup_ids(pid))
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
