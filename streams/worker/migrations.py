"""What a worker makes of snapshots older than its own format, and until when.

The formats (:mod:`~.snapshot` writes the newest):

====  ==================================================================  ===============
 v    what changed                                                        read until
====  ==================================================================  ===============
 2    GPU series keep raw values (a pickle, as every version up to 6)     retired
 3    request series keep evidence windows and seasonal baselines         retired
 4    request buckets count an outlier cluster's records apart            retired
 5    seasonal baselines keep a row per day; count rings grow             retired
 6    tail windows keep runs of one bucket; outlier windows doubles       retired
 7    msgpack of plain data behind :data:`~.snapshot.MAGIC`, never a      (current)
      pickle; every pipeline's part names its own format
====  ==================================================================  ===============

**Retired.** Versions 2-6 were pickles of the detector objects of their day. Reading them
needed those objects' classes (the object twins of today's banks) and an allow-list
unpickler; the release that wrote version 7 read them once per key during its rolling
upgrade, and they are not read since the banks became the only form. A worker that meets
one says why (:func:`not_read`), counts it (``snapshot_errors``) and starts that host or
service afresh: its detectors relearn, and its alerts are raised again if the condition
holds. ``RAGWATCH_SNAPSHOT_LEGACY``, which governed the reading, is accepted and ignored
(:data:`ragwatch.config.RETIRED`).

**Within version 7.** A part written before a field of its format existed still loads:
the field starts unknown or afresh. Each such tolerance lives in the reader of its part
and goes with version 8:

- GPU rows (``gpu-rows/1``) without the columns of the memory no process holds
  (``residual``, ...): NaN, the low-water mark starts at the next sample;
- leak bank rows without the floor (``floor_max``, ...): the floor starts fresh;
- tail windows without ``expiry``: computed again;
- a service's request-shape memory absent: a fresh one.

>>> not_read(b"\\x80\\x04...")
'is a pickle (snapshot version 6 or older), no longer read: the key starts afresh'
>>> not_read(b"{}")
'is not a snapshot (no header)'
"""

from __future__ import annotations

PICKLE = b"\x80"  # the PROTO opcode every pickle of protocol 2 and later starts with
RETIRED_VERSIONS = frozenset(range(2, 7))


def not_read(data: bytes) -> str:
    """Why bytes without the snapshot header are not read: the end of the message of the
    :class:`~.snapshot.SnapshotError` the worker counts."""
    if data.startswith(PICKLE):
        return "is a pickle (snapshot version 6 or older), no longer read: the key starts afresh"
    return "is not a snapshot (no header)"
