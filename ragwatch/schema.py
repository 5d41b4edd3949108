"""Typed, frozen records for every message ragwatch puts on Kafka.

This module is the wire format's single source of truth. Records are plain frozen,
slotted dataclasses; :mod:`ragwatch.codec` is the only code that turns them into bytes
and back. ``from_dict`` validates strictly: missing required fields, wrong types,
NaN/inf, negative memory, ``fb_used > fb_total``, unknown ``kind`` and unsupported
``v`` all raise :class:`~ragwatch.errors.SchemaError` with a reason naming the field.
Extra fields are allowed and ignored (forward compatibility), except on events, which
keep them as ``attrs``.

>>> env = GpuEnvelope(host="h1", ts=1.0, gpus=())
>>> env.kind
'gpu'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union, cast

from ragwatch.errors import SchemaError

SCHEMA_VERSION = 1
MAX_INT = 2**63 - 1
MAX_UINT = 2**64 - 1
ENVELOPE_FIELDS = ("v", "kind", "host", "ts", "type")
ALERT_STATUSES = ("pending", "firing", "resolved")
# Why a resolved alert resolved: its condition cleared ("recovered"), its baseline accepted
# the deviation as the new normal after holding it ("relearned"), or its series went
# silent ("gone").
RESOLUTIONS = ("recovered", "relearned", "gone")
REQUEST_STATUSES = ("ok", "error")
EVENT_TYPES = (
    "xid",  # an NVML XID critical error (attrs: gpu, uuid, xid)
    "oom_kill",  # the OOM killer took a process (attrs: gpu, pid, process, container)
    "process_exit",  # a compute process left a GPU (attrs: gpu, pid, process)
    "device_event",  # another critical NVML event: ECC, power, clocks (attrs: gpu, event)
    "agent_start",  # an agent started (attrs: source, driver_version, cuda_version, ...)
)

AlertStatus = Literal["pending", "firing", "resolved"]
RequestStatus = Literal["ok", "error"]


# ---------------------------------------------------------------- field readers


def _get(d: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in d:
        raise SchemaError(f"{path}{key}: required field missing")
    return d[key]


def _str(d: Mapping[str, Any], key: str, path: str, *, nonempty: bool = True) -> str:
    v = _get(d, key, path)
    if not isinstance(v, str):
        raise SchemaError(f"{path}{key}: expected string, got {type(v).__name__}")
    if nonempty and not v:
        raise SchemaError(f"{path}{key}: must not be empty")
    return v


def _opt_str(d: Mapping[str, Any], key: str, path: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise SchemaError(f"{path}{key}: expected string or null, got {type(v).__name__}")
    return v


MAX_LABEL_LEN = 256
MAX_JSON_DEPTH = 32  # free-form values (event attributes): lists and objects nested this deep


def is_label(v: str) -> bool:
    """Whether ``v`` may be a label value (:func:`check_label`'s rule, as a predicate for
    fast paths and sources that skip what fails it)."""
    return len(v) <= MAX_LABEL_LEN and v.isprintable()


def check_label(v: str, name: str) -> str:
    """Names that become labels (hosts, services, processes ...) end up in Slack text,
    HTML, Redis keys and /metrics: printable, at most MAX_LABEL_LEN characters."""
    if len(v) > MAX_LABEL_LEN:
        raise SchemaError(f"{name}: longer than {MAX_LABEL_LEN} characters ({len(v)})")
    if not v.isprintable():
        bad = next(c for c in v if not c.isprintable())
        raise SchemaError(f"{name}: contains the control character U+{ord(bad):04X}")
    return v


def _label(d: Mapping[str, Any], key: str, path: str, *, nonempty: bool = True) -> str:
    return check_label(_str(d, key, path, nonempty=nonempty), f"{path}{key}")


def _opt_label(d: Mapping[str, Any], key: str, path: str) -> str | None:
    v = _opt_str(d, key, path)
    return None if v is None else check_label(v, f"{path}{key}")


def _int(d: Mapping[str, Any], key: str, path: str, *, minimum: int | None = 0) -> int:
    v = _get(d, key, path)
    if isinstance(v, bool) or not isinstance(v, int):
        raise SchemaError(f"{path}{key}: expected integer, got {type(v).__name__}")
    if v > MAX_UINT:
        raise SchemaError(f"{path}{key}: must be <= 2**64-1, got {v}")
    if minimum is not None and v < minimum:
        raise SchemaError(f"{path}{key}: must be >= {minimum}, got {v}")
    return v


def _opt_int(d: Mapping[str, Any], key: str, path: str) -> int | None:
    if d.get(key) is None:
        return None
    return _int(d, key, path)


def _check_float(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SchemaError(f"{name}: expected number, got {type(v).__name__}")
    try:
        f = float(v)
    except OverflowError:
        raise SchemaError(f"{name}: must be finite, got an integer beyond float range") from None
    if not math.isfinite(f):
        raise SchemaError(f"{name}: must be finite, got {v!r}")
    return f


def _float(d: Mapping[str, Any], key: str, path: str, *, minimum: float | None = None) -> float:
    f = _check_float(_get(d, key, path), f"{path}{key}")
    if minimum is not None and f < minimum:
        raise SchemaError(f"{path}{key}: must be >= {minimum:g}, got {f:g}")
    return f


def _opt_float(
    d: Mapping[str, Any], key: str, path: str, *, minimum: float | None = None
) -> float | None:
    if d.get(key) is None:
        return None
    return _float(d, key, path, minimum=minimum)


def _bool(d: Mapping[str, Any], key: str, path: str, default: bool = False) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise SchemaError(f"{path}{key}: expected true or false, got {type(v).__name__}")
    return v


def _list(d: Mapping[str, Any], key: str, path: str) -> list[Any]:
    v = _get(d, key, path)
    if not isinstance(v, list):
        raise SchemaError(f"{path}{key}: expected array, got {type(v).__name__}")
    return v


def _obj(v: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise SchemaError(f"{path or 'message'}: expected object, got {type(v).__name__}")
    return v


def _str_map(d: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    raw = _obj(d.get(key, {}), f"{path}{key}")
    for k, v in raw.items():
        if not isinstance(v, str):
            raise SchemaError(f"{path}{key}.{k}: expected string, got {type(v).__name__}")
    return dict(raw)


def _choice(d: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...]) -> str:
    v = _str(d, key, path)
    if v not in choices:
        raise SchemaError(f"{path}{key}: must be one of {', '.join(choices)}, got {v!r}")
    return v


def _opt_choice(d: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...]) -> str | None:
    return None if d.get(key) is None else _choice(d, key, path, choices)


def _check_json_value(v: Any, name: str) -> None:
    """Free-form values (event attributes): finite numbers, 64-bit ints, nested at most
    ``MAX_JSON_DEPTH`` deep (an iterative walk: no input can exhaust the stack, and
    ``encode`` of what was accepted cannot fail on depth).

    >>> _check_json_value({"a": [1, 2.5, {"b": "c"}]}, "attrs")
    >>> deep: list[Any] = []
    >>> for _ in range(1000):
    ...     deep = [deep]
    >>> _check_json_value(deep, "attrs")
    Traceback (most recent call last):
    ...
    ragwatch.errors.SchemaError: attrs: nested deeper than 32 levels
    """
    todo: list[tuple[Any, str, int]] = [(v, name, 0)]
    while todo:
        v, path, depth = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise SchemaError(f"{path}: must be finite, got {v!r}")
        if isinstance(v, int) and not isinstance(v, bool) and not -MAX_INT - 1 <= v <= MAX_UINT:
            raise SchemaError(f"{path}: integer out of 64-bit range")
        if isinstance(v, list | dict):
            if depth >= MAX_JSON_DEPTH:
                raise SchemaError(f"{name}: nested deeper than {MAX_JSON_DEPTH} levels")
            items = enumerate(v) if isinstance(v, list) else v.items()
            fmt = "{}[{}]" if isinstance(v, list) else "{}.{}"
            todo.extend((item, fmt.format(path, k), depth + 1) for k, item in items)


def check_header(d: Mapping[str, Any], kind: str) -> None:
    """Check ``v`` and ``kind`` of an envelope dict; raise SchemaError if they are off."""
    v = d.get("v")
    if type(v) is not int or v != SCHEMA_VERSION:
        raise SchemaError(f"v: unsupported schema version {v!r} (this build reads v=1)")
    if d.get("kind") != kind:
        raise SchemaError(f"kind: expected {kind!r}, got {d.get('kind')!r}")


# ---------------------------------------------------------------- gpu telemetry


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One compute process on one GPU: its framebuffer use (bytes) and host RSS.

    ``dead`` marks memory still held by a pid that no longer exists in ``/proc``.
    ``container`` is the Kubernetes container name when the agent knows the process's pod
    (``namespace`` and ``pod`` set, docs/kubernetes.md), else the runtime's short container
    id (``None`` outside containers).
    """

    pid: int
    name: str
    gpu_mem: int
    rss: int | None = None
    container: str | None = None
    dead: bool = False
    namespace: str | None = None
    pod: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "") -> ProcessSample:
        return cls(
            pid=_int(d, "pid", path),
            name=_label(d, "name", path, nonempty=False),
            gpu_mem=_int(d, "gpu_mem", path),
            rss=_opt_int(d, "rss", path),
            container=_opt_label(d, "container", path),
            dead=_bool(d, "dead", path),
            namespace=_opt_label(d, "namespace", path),
            pod=_opt_label(d, "pod", path),
        )


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU (or MIG instance) at one tick. Memory in bytes, utilisation in percent.

    ``namespace``, ``pod`` and ``container`` name the Kubernetes container the device is
    allocated to (the kubelet's PodResources API), when exactly one holds it.
    """

    index: int
    uuid: str
    name: str
    fb_used: int
    fb_total: int
    mig: str | None = None
    fb_reserved: int | None = None
    gpu_util: float | None = None
    mem_copy_util: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    procs: tuple[ProcessSample, ...] = ()
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "") -> GpuSample:
        fb_used = _int(d, "fb_used", path)
        fb_total = _int(d, "fb_total", path)
        if fb_used > fb_total:
            raise SchemaError(f"{path}fb_used: {fb_used} exceeds fb_total {fb_total}")
        procs = _list(d, "procs", path) if "procs" in d else []
        return cls(
            index=_int(d, "index", path),
            uuid=_label(d, "uuid", path),
            name=_label(d, "name", path, nonempty=False),
            mig=_opt_label(d, "mig", path),
            fb_used=fb_used,
            fb_total=fb_total,
            fb_reserved=_opt_int(d, "fb_reserved", path),
            gpu_util=_opt_float(d, "gpu_util", path, minimum=0.0),
            mem_copy_util=_opt_float(d, "mem_copy_util", path, minimum=0.0),
            temp_c=_opt_float(d, "temp_c", path),
            power_w=_opt_float(d, "power_w", path, minimum=0.0),
            namespace=_opt_label(d, "namespace", path),
            pod=_opt_label(d, "pod", path),
            container=_opt_label(d, "container", path),
            procs=tuple(
                ProcessSample.from_dict(_obj(p, f"{path}procs[{i}]"), f"{path}procs[{i}].")
                for i, p in enumerate(procs)
            ),
        )


@dataclass(frozen=True, slots=True)
class GpuEnvelope:
    """Topic ``ragwatch.gpu``, key = host: every GPU of one host at one sampling tick."""

    kind: ClassVar[str] = "gpu"
    host: str
    ts: float
    gpus: tuple[GpuSample, ...]

    @property
    def key(self) -> str:
        return self.host

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuEnvelope:
        check_header(d, cls.kind)
        return cls(
            host=_label(d, "host", ""),
            ts=_float(d, "ts", "", minimum=0.0),
            gpus=tuple(
                GpuSample.from_dict(_obj(g, f"gpus[{i}]"), f"gpus[{i}].")
                for i, g in enumerate(_list(d, "gpus", ""))
            ),
        )


# ---------------------------------------------------------------- request telemetry


_NO_STAGES: dict[str, float] = {}  # a record without "stages" (never mutated)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One RAG request: end-to-end and per-stage latency (ms) and token counts."""

    ts: float
    status: RequestStatus
    e2e_ms: float
    context_tokens: int
    output_tokens: int
    stages: dict[str, float] = field(default_factory=dict)
    queue_ms: float | None = None
    ttft_ms: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "") -> RequestRecord:
        # Fast path for the common, well-typed record (a worker decodes ~50,000 a second);
        # anything else goes through the field readers, which name what is wrong.
        ts, e2e, status = d.get("ts"), d.get("e2e_ms"), d.get("status")
        ctx, out = d.get("context_tokens"), d.get("output_tokens")
        queue, ttft, stages = d.get("queue_ms"), d.get("ttft_ms"), d.get("stages", _NO_STAGES)
        if (
            type(ts) is float
            and 0.0 <= ts < math.inf
            and type(e2e) is float
            and 0.0 <= e2e < math.inf
            and (status == "ok" or status == "error")
            and type(ctx) is int
            and 0 <= ctx <= MAX_UINT
            and type(out) is int
            and 0 <= out <= MAX_UINT
            and (queue is None or (type(queue) is float and 0.0 <= queue < math.inf))
            and (ttft is None or (type(ttft) is float and 0.0 <= ttft < math.inf))
            and type(stages) is dict
            and all(type(v) is float and 0.0 <= v < math.inf for v in stages.values())
        ):
            return cls(
                ts=ts,
                status=status,
                e2e_ms=e2e,
                queue_ms=queue,
                ttft_ms=ttft,
                stages=dict(stages),
                context_tokens=ctx,
                output_tokens=out,
            )
        return cls._checked(d, path)

    @classmethod
    def _checked(cls, d: Mapping[str, Any], path: str) -> RequestRecord:
        stages_raw = _obj(d.get("stages", {}), f"{path}stages")
        stages = {k: _check_float(v, f"{path}stages.{k}") for k, v in stages_raw.items()}
        for k, v in stages.items():
            if v < 0:
                raise SchemaError(f"{path}stages.{k}: must be >= 0, got {v:g}")
        status = _choice(d, "status", path, REQUEST_STATUSES)
        return cls(
            ts=_float(d, "ts", path, minimum=0.0),
            status=cast(RequestStatus, status),
            e2e_ms=_float(d, "e2e_ms", path, minimum=0.0),
            queue_ms=_opt_float(d, "queue_ms", path, minimum=0.0),
            ttft_ms=_opt_float(d, "ttft_ms", path, minimum=0.0),
            stages=stages,
            context_tokens=_int(d, "context_tokens", path),
            output_tokens=_int(d, "output_tokens", path),
        )


@dataclass(frozen=True, slots=True)
class RequestsEnvelope:
    """Topic ``ragwatch.requests``, key = service: a batch of request records.

    ``host`` and ``pid`` (optional) say where the instance runs: the GPU host and the
    serving process. With them an alert on the service can name the GPU process whose
    memory grows on the same host, and a GPU alert can name the services it slows down.
    ``started`` (optional, epoch seconds) is when the sending process started: a newer one
    than the instance had says it restarted, and its first minutes' latencies are a cold
    start, not a fault (the worker's warm-up grace; a container's pid is often the same
    after a restart, its start time is not).
    """

    kind: ClassVar[str] = "requests"
    service: str
    instance: str
    ts: float
    records: tuple[RequestRecord, ...]
    host: str | None = None
    pid: int | None = None
    started: float | None = None

    @property
    def key(self) -> str:
        return self.service

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RequestsEnvelope:
        check_header(d, cls.kind)
        return cls(
            service=_label(d, "service", ""),
            instance=_label(d, "instance", ""),
            ts=_float(d, "ts", "", minimum=0.0),
            records=tuple(
                RequestRecord.from_dict(_obj(r, f"records[{i}]"), f"records[{i}].")
                for i, r in enumerate(_list(d, "records", ""))
            ),
            host=_opt_label(d, "host", "") or None,
            pid=_opt_int(d, "pid", ""),
            started=_opt_float(d, "started", "", minimum=0.0),
        )


# ---------------------------------------------------------------- device events


@dataclass(frozen=True, slots=True)
class EventEnvelope:
    """Topic ``ragwatch.events``, key = host: an XID, an OOM kill or a process exit.

    Fields beyond the envelope (``gpu``, ``pid``, ``xid``, ``process``...) are kept in
    ``attrs`` and written back at the top level; attrs named like a header field
    (``v``, ``kind``, ``host``, ``ts``, ``type``) are refused.
    """

    def __post_init__(self) -> None:
        clash = [k for k in self.attrs if k in ENVELOPE_FIELDS]
        if clash:
            raise SchemaError(f"attrs: {', '.join(clash)} would overwrite the envelope header")

    kind: ClassVar[str] = "event"
    host: str
    ts: float
    type: str
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.host

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EventEnvelope:
        check_header(d, cls.kind)
        attrs = {k: v for k, v in d.items() if k not in ENVELOPE_FIELDS}
        for k, v in attrs.items():
            _check_json_value(v, k)
            if isinstance(v, str):  # process, container, uuid ... become alert labels
                check_label(v, k)
        return cls(
            host=_label(d, "host", ""),
            ts=_float(d, "ts", "", minimum=0.0),
            type=_choice(d, "type", "", EVENT_TYPES),
            attrs=attrs,
        )


# ---------------------------------------------------------------- alerts


@dataclass(frozen=True, slots=True)
class Alert:
    """Topic ``ragwatch.alerts``: one state transition of one alert.

    ``fingerprint`` identifies the alert (rule + identifying labels) across transitions;
    times are event-time epoch seconds; ``at`` is when this transition happened (the
    evaluation that made it; None from producers that do not say). ``resolution`` says why
    a resolved alert resolved (one of :data:`RESOLUTIONS`; None otherwise, and from
    producers that do not say): a receiver must not read "relearned" as "fixed".
    """

    kind: ClassVar[str] = "alert"
    rule: str
    severity: str
    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float
    expected: float | None
    starts_at: float
    ends_at: float | None
    fingerprint: str
    at: float | None = None
    resolution: str | None = None

    @property
    def key(self) -> str:
        return self.fingerprint

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alert:
        check_header(d, cls.kind)
        status = _choice(d, "status", "", ALERT_STATUSES)
        return cls(
            rule=_str(d, "rule", ""),
            severity=_str(d, "severity", ""),
            status=cast(AlertStatus, status),
            labels=_str_map(d, "labels", ""),
            annotations=_str_map(d, "annotations", ""),
            value=_float(d, "value", ""),
            expected=_opt_float(d, "expected", ""),
            starts_at=_float(d, "starts_at", "", minimum=0.0),
            ends_at=_opt_float(d, "ends_at", "", minimum=0.0),
            fingerprint=_str(d, "fingerprint", ""),
            at=_opt_float(d, "at", "", minimum=0.0),
            resolution=_opt_choice(d, "resolution", "", RESOLUTIONS),
        )


@dataclass(frozen=True, slots=True)
class Transition:
    """One alert changing state; ``previous`` is inactive, pending or firing. ``flapped``:
    a firing transition of an alert that had resolved less than ``flap_window_s`` before
    (counted in the alert engine's ``flaps``)."""

    alert: Alert
    previous: str
    flapped: bool = False

    @property
    def notify(self) -> bool:
        """Whether receivers should hear about it (firing, or resolved after firing)."""
        return self.alert.status == "firing" or (
            self.alert.status == "resolved" and self.previous == "firing"
        )

    @property
    def fires(self) -> bool:
        """Whether its alert starts firing here (and gets a hint)."""
        return self.alert.status == "firing" and self.previous != "firing"


# ---------------------------------------------------------------- facts (what hints join)


@dataclass(frozen=True, slots=True)
class LeakFact:
    """A process whose GPU memory grows steadily: a cause a hint names."""

    gpu: str
    pid: str
    process: str
    container: str
    gb_per_hour: float
    tte_h: float | None  # hours until its GPU is full at that rate (None: unknown)
    pod: str = ""  # namespace/pod, where the agent knows it


@dataclass(frozen=True, slots=True)
class AnomalyFact:
    """A scored signal of one series whose highest anomaly score of the last hour reached
    the advisor's bar (:mod:`ragwatch.advisor`): the series in words ("GPU 2", "pid 4011
    (python)", an instance's name), the signal, that peak score, the value and the
    expected value at it (None: no value), and its event time."""

    where: str
    signal: str
    score: float
    value: float | None
    expected: float | None
    at: float | None


@dataclass(frozen=True, slots=True)
class GpuFact:
    """A GPU as its like GPUs on other hosts compare with it
    (:mod:`ragwatch.streams.pipelines.gpu_peers`): its member name (``host/gpu``, with
    ``/mig`` for a MIG instance), its group (model and pod template; only GPUs allocated
    to a pod have one), the event time of its newest sample and the signals compared, as
    smoothed for the comparison (None: not known)."""

    member: str
    group: str
    ts: float
    leak_gb_per_hour: float | None = None
    gpu_util: float | None = None
    watts_per_util: float | None = None  # power per percent of utilisation, while busy
    temp_c: float | None = None


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What a host's GPU telemetry says about it at one moment, for the hints of alerts
    on it and on the services it runs: its leaking processes (steepest first), its GPUs
    near full (``(gpu, used ratio)`` in GPU order), the event time of its newest sample
    (None: no GPU series of it is held), and its GPUs that have like GPUs to compare
    with (in GPU order)."""

    host: str
    ts: float | None = None
    leaks: tuple[LeakFact, ...] = ()
    full: tuple[tuple[str, float], ...] = ()
    gpus: tuple[GpuFact, ...] = ()
    anomalous: tuple[AnomalyFact, ...] = ()  # its GPUs' and processes', highest first


@dataclass(frozen=True, slots=True)
class InstanceFacts:
    """What a service instance's requests say about it at one moment, for the hints of
    alerts on it and on its host: its host (None: unknown), the end of its newest closed
    bucket, its signals then and the label of its active outlier cluster."""

    service: str
    instance: str
    host: str | None
    bucket_end: float | None
    signals: Mapping[str, float | None]
    outlier_label: str | None = None
    anomalous: tuple[AnomalyFact, ...] = ()  # its scored signals', highest first


@dataclass(frozen=True, slots=True)
class WorkerProgress:
    """How far a worker has read the telemetry it owns, as it tells the other workers on
    the facts topic (:mod:`ragwatch.facts_wire`): the event time of the newest GPU
    envelope of its hosts and of the newest request envelope of its services (None: it
    owns none of that kind now). A hint that needs the other side's facts at an alert's
    time waits for the workers behind it (``RAGWATCH_HINT_WAIT``)."""

    worker: str
    host_ts: float | None = None
    service_ts: float | None = None
    seq: int = 0  # counts the worker's progress records: it knows when it reads its own


AttrValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class Span:
    """One span of a trace, as decoded from OTLP (:mod:`ragwatch.otlp`): ids in hex, times
    in nanoseconds, scalar attributes only (arrays and maps are dropped), where it ran
    from its resource (``service.name``, ``service.instance.id`` or ``k8s.pod.name``,
    ``host.name``), when its first streamed chunk came, if an event says so
    (:data:`ragwatch.otlp.FIRST_CHUNK_EVENTS`), and when its process started, as the
    resource says it (``process.creation.time``, ISO 8601, as given)."""

    trace_id: str
    span_id: str
    parent_id: str | None  # None: a root span
    name: str
    start_ns: int  # nanoseconds since the epoch, as OTLP has them
    end_ns: int
    error: bool  # status ERROR
    attributes: Mapping[str, AttrValue]
    service: str
    instance: str
    host: str | None = None
    first_chunk_ns: int | None = None
    process_created: str | None = None

    @property
    def end(self) -> float:
        """Event time of its end, epoch seconds."""
        return self.end_ns / 1e9

    @property
    def duration_ms(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e6


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One scraped Prometheus sample: name, labels and a finite value."""

    name: str
    labels: dict[str, str]
    value: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "") -> MetricSample:
        return cls(
            name=_str(d, "name", path),
            labels=_str_map(d, "labels", path),
            value=_float(d, "value", path),
        )


@dataclass(frozen=True, slots=True)
class MetricsEnvelope:
    """Topic ``ragwatch.metrics``, key = host: samples scraped from one target at one time.

    Counters are cumulative, as scraped; rates and reset handling happen in streams.
    """

    kind: ClassVar[str] = "metrics"
    host: str
    target: str
    ts: float
    samples: tuple[MetricSample, ...]

    @property
    def key(self) -> str:
        return self.host

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MetricsEnvelope:
        check_header(d, cls.kind)
        return cls(
            host=_label(d, "host", ""),
            target=_label(d, "target", ""),
            ts=_float(d, "ts", "", minimum=0.0),
            samples=tuple(
                MetricSample.from_dict(_obj(s, f"samples[{i}]"), f"samples[{i}].")
                for i, s in enumerate(_list(d, "samples", ""))
            ),
        )


Envelope = Union[GpuEnvelope, RequestsEnvelope, EventEnvelope, MetricsEnvelope, Alert]  # noqa: UP007

KINDS: dict[str, type[Envelope]] = {
    c.kind: c for c in (GpuEnvelope, RequestsEnvelope, EventEnvelope, MetricsEnvelope, Alert)
}

# Headers on a dead-letter record; its value is the rejected message's original bytes.
DLQ_HEADER_TOPIC = "ragwatch-topic"
DLQ_HEADER_PARTITION = "ragwatch-partition"
DLQ_HEADER_OFFSET = "ragwatch-offset"
DLQ_HEADER_REASON = "ragwatch-reason"
