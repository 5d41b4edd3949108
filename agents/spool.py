"""An on-disk FIFO of Kafka records for agents, bounded in bytes, that never raises at run time.

While the broker is unreachable, the publisher spills what does not fit in memory here
and reads it back, oldest first, when the broker returns; on shutdown it writes what is
still unsent here, so the next start sends it. Records live in append-only segment files
(``spool-00000001.seg``...) of length-prefixed frames: a segment is deleted once every
record in it was handed back. When the spool would grow past ``max_bytes``, its oldest
segment is dropped (the newest telemetry is worth more) and the loss is counted.

The directory is checked when the spool is made: it is created if missing and a file is
written there; a directory that cannot be used raises :class:`~ragwatch.errors.ConfigError`
naming it and the reason (a full disk only warns: space may come back, and the spool copes
with it). After that, :meth:`Spool.put` and :meth:`Spool.get` never raise for the disk: a
write that fails for want of space (``ENOSPC``, ``EDQUOT``) drops the oldest segment and
tries again, any other write error (permission, read-only, I/O) drops the record being
written, and a segment that cannot be read is dropped; every loss is counted in
``dropped``, every error in ``errors``, and each kind of error is logged once.

Delivery is at least once across crashes: records of a segment that was being read when
the process died are read again on the next start.

>>> import tempfile
>>> spool = Spool(tempfile.mkdtemp(), max_bytes=1 << 20)
>>> spool.put("ragwatch.gpu", "h1", b"{}")
True
>>> len(spool), spool.get()
(1, ('ragwatch.gpu', 'h1', b'{}'))
>>> spool.get() is None
True
>>> Spool("/proc/version/spool", max_bytes=1 << 20)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ragwatch.errors.ConfigError: spool directory /proc/version/spool is not usable: cannot create...
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ragwatch.errors import ConfigError

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<HHI")  # topic length, key length, value length
Record = tuple[str, str, bytes]
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


@dataclass
class _Segment:
    path: Path
    records: int = 0  # complete frames not read yet
    size: int = 0  # bytes in the file


class Spool:
    """Append at the tail, read from the head; survives restarts; bounded in bytes."""

    def __init__(self, directory: str | Path, *, max_bytes: int, segment_bytes: int = 4 << 20):
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError("max_bytes and segment_bytes must be > 0")
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes, max_bytes)
        self.dropped = 0  # records lost: over the cap, out of space, unwritable, unreadable
        self.errors = 0  # OSErrors met writing or reading
        self._logged: set[tuple[str, int]] = set()  # (operation, errno) already logged
        self._segments: deque[_Segment] = deque(self._open_dir())
        self._count = sum(s.records for s in self._segments)
        self._bytes = sum(s.size for s in self._segments)
        self._read_pos = 0  # offset in the head segment
        # Always write a fresh segment: an old one may end in a frame torn by a crash.
        self._writer: BinaryIO | None = None
        if self._count:
            log.info(
                "spool %s: %d record(s) from an earlier run will be sent", self.dir, self._count
            )

    def __len__(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, topic: str, key: str, value: bytes) -> bool:
        """Append one record; False if it could not be kept (counted in ``dropped``)."""
        if not topic:
            raise ValueError("a spooled record needs a topic")
        t, k = topic.encode(), key.encode()
        frame = _HEADER.pack(len(t), len(k), len(value)) + t + k + value
        while True:
            try:
                self._append(frame)
                break
            except OSError as exc:
                self._error("write", exc)
                if exc.errno in NO_SPACE and self._segments:
                    self._drop_head("out of space")  # the oldest make room for the newest
                    continue
                self.dropped += 1
                return False
        self._count += 1
        while self._bytes > self.max_bytes and len(self._segments) > 1:
            self._drop_head(f"over {self.max_bytes} bytes")
        return True

    def get(self) -> Record | None:
        """The oldest record, removed from the spool; None when empty."""
        while self._segments:
            head = self._segments[0]
            if head.records == 0:  # fully read: gone, so nothing is read twice
                self._remove_head()
                continue
            try:
                with head.path.open("rb") as f:
                    f.seek(self._read_pos)
                    rec = self._read_frame(f)
                    pos = f.tell()
            except OSError as exc:
                self._error("read", exc)
                self._drop_head("has a segment it cannot read")
                continue
            if rec is None:  # shorter than when it was counted: changed behind our back
                self._drop_head("has a segment shorter than written")
                continue
            self._read_pos = pos
            head.records -= 1
            self._count -= 1
            return rec
        return None

    def close(self) -> None:
        self._close_writer()
        if self._count == 0:
            while self._segments:
                self._remove_head()

    # ------------------------------------------------------------------ internals

    def _open_dir(self) -> list[_Segment]:
        """Create the directory, write a file there and count what an earlier run left;
        ConfigError (one line: the directory, what failed and why) if it cannot be used."""
        doing = "create it"
        try:
            if self.dir.exists() and not self.dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "it exists and is not a directory")
            self.dir.mkdir(parents=True, exist_ok=True)
            doing = "write a file there"
            self._probe()
            segments = []
            for path in sorted(self.dir.glob("spool-*.seg")):
                doing = f"read {path.name}"
                n, size = self._count_records(path)
                segments.append(_Segment(path, n, size))
            return segments
        except OSError as exc:
            why = exc.strerror or str(exc)
            msg = f"spool directory {self.dir} is not usable: cannot {doing}: {why}"
            raise ConfigError(msg) from None

    def _probe(self) -> None:
        probe = self.dir / f".probe-{os.getpid()}"
        try:
            with probe.open("wb", buffering=0) as f:
                f.write(b"ragwatch spool probe")
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            log.warning("spool %s: %s; the oldest records will be dropped", self.dir, exc)
        finally:
            probe.unlink(missing_ok=True)

    def _append(self, frame: bytes) -> None:
        tail = self._segments[-1] if self._writer is not None else None
        if tail is None or tail.size + len(frame) > self.segment_bytes:
            tail = self._new_segment()
        assert self._writer is not None
        try:
            view = memoryview(frame)
            while view:
                view = view[self._writer.write(view) or 0 :]
        except OSError:
            self._abandon_tail(tail)
            raise
        tail.size += len(frame)
        tail.records += 1
        self._bytes += len(frame)

    def _new_segment(self) -> _Segment:
        self._close_writer()
        last = int(self._segments[-1].path.stem.split("-")[1]) if self._segments else 0
        path = self.dir / f"spool-{last + 1:08d}.seg"
        self._writer = path.open("ab", buffering=0)  # unbuffered: a frame is on disk or not
        segment = _Segment(path)
        self._segments.append(segment)
        return segment

    def _abandon_tail(self, tail: _Segment) -> None:
        """After a failed write: cut the torn frame off (or start a new segment next
        time), and forget the segment if it holds nothing."""
        try:
            os.truncate(tail.path, tail.size)
        except OSError:
            self._close_writer()  # keep the torn bytes out of the next frames
        if tail.records == 0:
            self._close_writer()
            if len(self._segments) == 1:
                self._remove_head()
            else:
                self._segments.pop()
                self._bytes -= tail.size
                self._unlink(tail.path)

    def _close_writer(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as exc:
                self._error("write", exc)
            self._writer = None

    def _remove_head(self) -> None:
        head = self._segments.popleft()
        if not self._segments:
            self._close_writer()  # the head was the tail
        self._bytes -= head.size
        self._read_pos = 0
        self._unlink(head.path)

    def _unlink(self, path: Path) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            self._error("delete", exc)

    def _drop_head(self, why: str) -> None:
        lost = self._segments[0].records
        self._remove_head()
        if not lost:
            return
        self._count -= lost
        self.dropped += lost
        log.warning(
            "spool %s %s: dropped %d oldest record(s) (dropped so far: %d)",
            self.dir,
            why,
            lost,
            self.dropped,
        )

    def _error(self, op: str, exc: OSError) -> None:
        """Count an OSError; log the first of each kind (each later one is only counted)."""
        self.errors += 1
        kind = (op, exc.errno or 0)
        if kind not in self._logged:
            self._logged.add(kind)
            log.error(
                "spool %s: cannot %s: %s (each loss is counted; this kind of error is logged once)",
                self.dir,
                op,
                exc,
            )

    @staticmethod
    def _read_frame(f: BinaryIO) -> Record | None:
        read = f.read
        head = read(_HEADER.size)
        if len(head) < _HEADER.size:
            return None
        tl, kl, vl = _HEADER.unpack(head)
        if tl == 0:
            return None  # zeros (a crash can leave them at the end of a file): no frame
        body = read(tl + kl + vl)
        if len(body) < tl + kl + vl:
            return None  # a torn frame at the end of a segment (crash while writing)
        return body[:tl].decode(), body[tl : tl + kl].decode(), body[tl + kl :]

    def _count_records(self, path: Path) -> tuple[int, int]:
        """Complete frames in a segment, and its size in bytes."""
        n = 0
        with path.open("rb") as f:
            while self._read_frame(f) is not None:
                n += 1
            return n, f.seek(0, os.SEEK_END)
