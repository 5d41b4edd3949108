"""The on-disk spool: FIFO order, restarts, torn frames, the byte cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwatch.agents.spool import Spool


def records(n: int, start: int = 0) -> list[tuple[str, str, bytes]]:
    return [
        ("ragwatch.gpu", f"h{i % 3}", b"x" * 100 + str(i).encode()) for i in range(start, start + n)
    ]


def drain(spool: Spool) -> list[tuple[str, str, bytes]]:
    out = []
    while (rec := spool.get()) is not None:
        out.append(rec)
    return out


def test_fifo_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    recs = records(50)
    for r in recs:
        spool.put(*r)
    assert len(spool) == 50 and len(list(tmp_path.glob("spool-*.seg"))) > 5
    assert drain(spool) == recs
    assert len(spool) == 0


def test_interleaved_put_and_get_never_repeat_or_lose(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=700)
    got = []
    for i, r in enumerate(records(200)):
        spool.put(*r)
        if i % 3 == 0:
            got.append(spool.get())
    got += drain(spool)
    assert got == records(200)


def test_survives_a_restart_and_keeps_order(tmp_path: Path) -> None:
    first = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    for r in records(30):
        first.put(*r)
    first.close()
    second = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    assert len(second) == 30
    for r in records(5, start=30):
        second.put(*r)
    assert drain(second) == records(35)
    second.close()
    assert list(tmp_path.glob("spool-*.seg")) == []  # empty spool leaves no files


def test_a_torn_frame_from_a_crash_is_ignored_and_later_records_still_read(
    tmp_path: Path,
) -> None:
    first = Spool(tmp_path, max_bytes=1 << 20)
    for r in records(3):
        first.put(*r)
    (seg,) = tmp_path.glob("spool-*.seg")
    with seg.open("ab") as f:
        f.write(b"\x05\x00\x02\x00")  # half a header: the process died mid-write
    second = Spool(tmp_path, max_bytes=1 << 20)
    assert len(second) == 3
    second.put(*records(1, start=3)[0])  # written to a new segment, after the torn one
    assert drain(second) == records(4)


def test_over_the_cap_the_oldest_segment_is_dropped_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=3000, segment_bytes=1000)
    for r in records(100):
        spool.put(*r)
    assert spool.size_bytes <= 3000
    left = drain(spool)
    assert spool.dropped + len(left) == 100
    assert left == records(100)[-len(left) :]  # the newest are kept, in order


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"max_bytes": 10, "segment_bytes": 0}])
def test_bad_sizes_raise(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Spool(tmp_path, **kwargs)
