"""The on-disk spool: FIFO order, restarts, torn frames, the byte cap."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from ragwatch.agents.spool import Spool
from ragwatch.errors import ConfigError


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


def segment_numbers(directory: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in directory.glob("spool-*.seg"))


def spool_logs(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ragwatch.agents.spool" and r.levelno == level
    ]


def test_no_space_left_drops_the_oldest_segment_and_keeps_the_newest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real ENOSPC from the kernel (the next segment file is /dev/full): put() does not
    raise, the oldest segment makes room, the loss is counted, the error is logged once
    per kind however often it happens."""
    first = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    for r in records(16):
        first.put(*r)
    first.close()
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)  # writes a new segment
    (oldest, *_, last) = segment_numbers(tmp_path)
    full = tmp_path / f"spool-{last + 1:08d}.seg"
    full.symlink_to("/dev/full")
    assert spool.put(*records(1, start=16)[0]) is True
    assert spool.errors == 1 and spool.dropped > 0
    assert len(spool) == 17 - spool.dropped
    assert oldest not in segment_numbers(tmp_path)
    (tmp_path / f"spool-{last + 2:08d}.seg").symlink_to("/dev/full")  # it happens again
    for r in records(30, start=17):
        assert spool.put(*r) is True
    assert spool.errors == 2
    kept = drain(spool)
    assert kept == records(47)[spool.dropped :]  # the newest, in order
    assert len(spool_logs(caplog, logging.ERROR)) == 1
    assert "No space left on device" in spool_logs(caplog, logging.ERROR)[0]


def test_a_write_error_other_than_space_drops_the_record_being_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Permission, read-only, I/O errors: dropping old data would not help; the record is
    dropped and counted, put() returns False, one log line for any number of them."""
    spool = Spool(tmp_path, max_bytes=1 << 20)
    (tmp_path / "spool-00000001.seg").mkdir()  # in the way of the first segment
    assert [spool.put(*r) for r in records(50)] == [False] * 50
    assert (len(spool), spool.dropped, spool.errors) == (0, 50, 50)
    (only,) = spool_logs(caplog, logging.ERROR)
    assert "cannot write" in only and "Is a directory" in only
    (tmp_path / "spool-00000001.seg").rmdir()  # the disk is fixed: the spool works again
    assert spool.put(*records(1)[0]) is True and drain(spool) == records(1)


def test_a_segment_that_cannot_be_read_is_dropped_and_the_rest_still_read(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    for r in records(30):
        spool.put(*r)
    first = tmp_path / f"spool-{segment_numbers(tmp_path)[0]:08d}.seg"
    first.unlink()  # removed behind the spool's back (an operator, a bad disk)
    left = drain(spool)
    assert spool.errors == 1 and spool.dropped == 30 - len(left) > 0
    assert left == records(30)[spool.dropped :]


def test_a_spool_on_a_real_full_filesystem_keeps_sampling_and_the_newest_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 64 KiB tmpfs filled four times over: no put() raises, what is kept is the newest
    records in order, every loss is counted, one error line. (Needs the right to mount, as
    root; the /dev/full test above covers the same path without it.)"""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    )
    # CI runs as root, as make test's apt-get installs do: a mount it refuses is a failure
    assert mounted.returncode == 0, f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}"
    try:
        spool = Spool(disk / "spool", max_bytes=1 << 20, segment_bytes=8192)
        recs = records(2000)  # ~250 KB
        assert all(spool.put(*r) for r in recs)
        assert spool.errors > 0 and spool.dropped > 1000
        kept = drain(spool)
        assert kept == recs[spool.dropped :] and len(kept) > 100
        assert len(spool_logs(caplog, logging.ERROR)) == 1
        spool.close()
        (disk / "spool" / "later").mkdir()
        with pytest.raises(OSError), (disk / "filler").open("wb") as f:
            while True:  # the disk full of something else
                f.write(b"x" * 4096)
                f.flush()
        caplog.clear()
        later = Spool(disk / "spool" / "later", max_bytes=1 << 20)  # starts: space may return
        assert later.put(*recs[0]) is False and later.dropped == 1
        (warning,) = spool_logs(caplog, logging.WARNING)
        assert "No space left on device" in warning
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_an_unusable_directory_is_refused_at_start_with_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    for directory, why in [
        (a_file / "spool", "cannot create it: Not a directory"),
        (a_file, "cannot create it: it exists and is not a directory"),
        (Path("/proc/ragwatch-spool"), "cannot create it: No such file or directory"),
    ]:
        with pytest.raises(ConfigError) as err:
            Spool(directory, max_bytes=1 << 20)
        assert str(err.value) == f"spool directory {directory} is not usable: {why}"
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "spool-00000001.seg").mkdir()  # a segment that cannot be read
    with pytest.raises(ConfigError, match=r"cannot read spool-00000001\.seg: Is a directory"):
        Spool(tmp_path / "spool", max_bytes=1 << 20)
