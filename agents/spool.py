"""An on-disk FIFO of Kafka records for agents, bounded in bytes.

While the broker is unreachable, the publisher spills what does not fit in memory here
and reads it back, oldest first, when the broker returns; on shutdown it writes what is
still unsent here, so the next start sends it. Records live in append-only segment files
(``spool-00000001.seg``...) of length-prefixed frames: a segment is deleted once every
record in it was handed back. When the spool would grow past ``max_bytes``, its oldest
segment is dropped (the newest telemetry is worth more) and the loss is counted.

Delivery is at least once across crashes: records of a segment that was being read when
the process died are read again on the next start.

>>> import tempfile
>>> spool = Spool(tempfile.mkdtemp(), max_bytes=1 << 20)
>>> spool.put("ragwatch.gpu", "h1", b"{}")
>>> len(spool), spool.get()
(1, ('ragwatch.gpu', 'h1', b'{}'))
>>> spool.get() is None
True
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<HHI")  # topic length, key length, value length
Record = tuple[str, str, bytes]


class Spool:
    """Append at the tail, read from the head; survives restarts; bounded in bytes."""

    def __init__(self, directory: str | Path, *, max_bytes: int, segment_bytes: int = 4 << 20):
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError("max_bytes and segment_bytes must be > 0")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes, max_bytes)
        self.dropped = 0
        self._segments: deque[Path] = deque(sorted(self.dir.glob("spool-*.seg")))
        self._count = sum(self._count_records(p) for p in self._segments)
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
        return sum(p.stat().st_size for p in self._segments)

    def put(self, topic: str, key: str, value: bytes) -> None:
        t, k = topic.encode(), key.encode()
        frame = _HEADER.pack(len(t), len(k), len(value)) + t + k + value
        if self._writer is None or self._writer.tell() + len(frame) > self.segment_bytes:
            self._new_segment()
        assert self._writer is not None
        self._writer.write(frame)
        self._writer.flush()
        self._count += 1
        while self.size_bytes > self.max_bytes and len(self._segments) > 1:
            self._drop_oldest()

    def get(self) -> Record | None:
        """The oldest record, removed from the spool; None when empty."""
        while self._segments:
            head = self._segments[0]
            with head.open("rb") as f:
                f.seek(self._read_pos)
                rec = self._read_frame(f)
                if rec is not None:
                    self._read_pos = f.tell()
                    self._count -= 1
                    return rec
            if len(self._segments) == 1:
                # Fully read: start over with a new segment so nothing is read twice.
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
                self._remove_head()
                return None
            self._remove_head()
        return None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._count == 0:
            for p in list(self._segments):
                p.unlink(missing_ok=True)
            self._segments.clear()

    # ------------------------------------------------------------------ internals

    def _new_segment(self) -> None:
        if self._writer is not None:
            self._writer.close()
        last = int(self._segments[-1].stem.split("-")[1]) if self._segments else 0
        path = self.dir / f"spool-{last + 1:08d}.seg"
        self._segments.append(path)
        self._writer = path.open("ab")

    def _remove_head(self) -> None:
        self._segments.popleft().unlink(missing_ok=True)
        self._read_pos = 0

    def _drop_oldest(self) -> None:
        head = self._segments[0]
        with head.open("rb") as f:
            f.seek(self._read_pos)
            lost = 0
            while self._read_frame(f) is not None:
                lost += 1
        self._remove_head()
        self._count -= lost
        self.dropped += lost
        log.warning(
            "spool %s over %d bytes: dropped %d oldest record(s) (dropped so far: %d)",
            self.dir,
            self.max_bytes,
            lost,
            self.dropped,
        )

    @staticmethod
    def _read_frame(f: BinaryIO) -> Record | None:
        read = f.read
        head = read(_HEADER.size)
        if len(head) < _HEADER.size:
            return None
        tl, kl, vl = _HEADER.unpack(head)
        body = read(tl + kl + vl)
        if len(body) < tl + kl + vl:
            return None  # a torn frame at the end of a segment (crash while writing)
        return body[:tl].decode(), body[tl : tl + kl].decode(), body[tl + kl :]

    def _count_records(self, path: Path) -> int:
        n = 0
        with path.open("rb") as f:
            while self._read_frame(f) is not None:
                n += 1
        return n
