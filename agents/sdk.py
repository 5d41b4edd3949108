"""Per-request RAG telemetry for the service itself: time stages, count tokens, batch, publish.

A RAG service makes one :class:`RequestRecorder` at start-up and wraps each request::

    with rec.request() as r:          # or: async with rec.request() as r:
        with r.stage("retriever"):
            docs = retrieve(query)
        with r.stage("llm"):
            answer = generate(docs)
        r.tokens(context=n_ctx, output=n_out)

Services that time things themselves call ``rec.record(e2e_ms=..., stages=...)``.

The request path only appends a tuple to a bounded ``deque`` under a lock held for the
append and two counters; it never blocks on I/O and never raises for telemetry problems.
When the buffer is full the oldest record is dropped and counted. A daemon thread wakes
every ``flush_interval_s`` (or as soon as ``max_batch`` records wait), validates the
records (bad values are dropped and counted as ``invalid``, so one never poisons a batch),
builds :class:`~ragwatch.schema.RequestsEnvelope` batches of at most ``max_batch`` records,
encodes them with :mod:`ragwatch.codec` and writes them to the sink with key = service.
Sink errors are logged and counted. When nothing was sent for ``heartbeat_s`` (30 s) the
flusher sends an envelope without records (:meth:`RequestRecorder.heartbeat`): a quiet
minute then reads as zero traffic to the worker, not as an instance gone silent.
``close()`` stops the thread and flushes what is left; it does **not** close the sink,
which belongs to the caller (one publisher may serve several recorders).

Nothing is lost when a script or service ends without closing anything: at a normal
interpreter exit, every recorder drains into its sink (within ``exit_timeout_s``, 5 s),
and then every :class:`~ragwatch.agents.publisher.KafkaPublisher` sends what it holds
(within its own ``exit_timeout_s``; what is still undelivered is logged and counted), as
the OpenTelemetry SDK flushes its span processors and then its exporters at shutdown. Both
are context managers for code that wants to say when::

    with KafkaPublisher(conf) as pub, RequestRecorder(pub, service="s", instance="i") as rec:
        ...

The flusher is a daemon thread, and so is the publisher's sender: neither keeps the
interpreter from exiting. A forked child has no flusher (and the exit hook skips what its
parent made), so make the recorder and its publisher in each worker process, after the
fork. The flusher's work (about 3-4 us of CPU per record on a 2-core x86 box with Python
3.11) runs under the GIL, so a request thread that needs the GIL meanwhile can wait up to
the interpreter's switch interval (5 ms).

Times: stage, ``e2e_ms``, ``queue_ms`` and ``ttft_ms`` are milliseconds from ``perf``;
a record's ``ts`` is the wall-clock time (``clock``) at which the request finished.

>>> from itertools import count
>>> from ragwatch.agents.publisher import ListSink
>>> from ragwatch.codec import decode
>>> sink, ticks = ListSink(), count()
>>> with RequestRecorder(sink, service="rag-api", instance="pod-1", clock=lambda: 100.0,
...                      perf=lambda: next(ticks) * 0.010, autostart=False) as rec:
...     with rec.request() as r:              # every perf() call below advances 10 ms
...         with r.stage("retriever"):
...             pass
...         r.tokens(context=1200, output=250)
...     rec.record(e2e_ms=812.5, stages={"llm": 700.0}, output_tokens=10, status="error")
>>> [(topic, key) for topic, key, _ in sink.records]
[('ragwatch.requests', 'rag-api')]
>>> env = decode(sink.records[0][2])
>>> env.kind, env.service, env.instance
('requests', 'rag-api', 'pod-1')
>>> [(x.status, x.e2e_ms, x.stages, x.context_tokens, x.output_tokens) for x in env.records]
[('ok', 30.0, {'retriever': 10.0}, 1200, 250), ('error', 812.5, {'llm': 700.0}, 0, 10)]
>>> rec.stats.recorded, rec.stats.sent_records, rec.stats.dropped
(2, 2, 0)
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from types import TracebackType
from typing import Any, Literal

from ragwatch.agents.shutdown import register_at_exit
from ragwatch.agents.sinks import Sink
from ragwatch.codec import MAX_MESSAGE_BYTES, encode
from ragwatch.logs import log_sometimes
from ragwatch.schema import MAX_UINT, REQUEST_STATUSES, RequestRecord, RequestsEnvelope

log = logging.getLogger(__name__)

# What the request path buffers, in this order; the flusher turns it into a RequestRecord.
# (ts, status, e2e_ms, context_tokens, output_tokens, stages, queue_ms, ttft_ms). stages is
# a dict: one allocation that the garbage collector does not track while it holds only
# strings and floats (a tuple of pairs means four tracked allocations, and more GC runs).
_Item = tuple[Any, ...]


@dataclass(frozen=True)
class RecorderStats:
    """A snapshot of a recorder's counters.

    Once everything is flushed: ``recorded == sent_records + dropped + invalid +
    failed_records``. ``failed_records`` are those lost with an envelope the sink refused
    (``sink_errors`` counts the refused envelopes).
    """

    recorded: int = 0
    dropped: int = 0
    invalid: int = 0
    sent_records: int = 0
    sent_envelopes: int = 0
    sink_errors: int = 0
    failed_records: int = 0
    heartbeats: int = 0  # envelopes without records, sent while idle


# The status of a request whose timing went wrong in the caller's hands (an unhashable stage
# name, a token count that does not add up, a perf clock that raised): the flusher drops it
# as invalid, so the caller never sees an exception from telemetry.
_BROKEN = "broken"


class _Stage:
    """Times one ``with r.stage(name)`` block; repeated names add up."""

    __slots__ = ("_name", "_t0", "_timer")

    def __init__(self, timer: RequestTimer, name: str) -> None:
        self._timer, self._name = timer, name
        self._t0 = 0.0

    def __enter__(self) -> None:
        try:
            self._t0 = self._timer._rec._perf()
        except Exception:
            self._timer._status = _BROKEN

    def __exit__(self, *exc: object) -> None:
        timer = self._timer
        try:
            ms = (timer._rec._perf() - self._t0) * 1000.0
            timer._stages[self._name] = timer._stages.get(self._name, 0.0) + ms
        except Exception:
            timer._status = _BROKEN

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()


class RequestTimer:
    """One request in flight, made by :meth:`RequestRecorder.request`; use it once.

    Works as ``with`` and ``async with``. An exception escaping the block marks the
    request ``"error"`` (cancellation included) and propagates. ``queue_ms`` may be set
    directly when the service knows how long the request waited before it started.
    Bad values (a negative ``queue_ms``, a token count that is not an integer) never raise
    here: the flusher drops the record and counts it as ``invalid``.
    """

    __slots__ = ("_context", "_output", "_rec", "_stages", "_status", "_t0", "_ttft", "queue_ms")

    def __init__(self, rec: RequestRecorder) -> None:
        self._rec = rec
        self._stages: dict[str, float] = {}
        self._context = 0
        self._output = 0
        self._status = "ok"
        self._ttft: float | None = None
        self._t0 = 0.0
        self.queue_ms: float | None = None

    def stage(self, name: str) -> _Stage:
        """A context manager (``with`` or ``async with``) timing one stage in ms.

        The same name twice adds up; nested stages are each timed in full.
        """
        return _Stage(self, name)

    def tokens(self, *, context: int = 0, output: int = 0) -> None:
        """Add to the request's token counts (call it once per LLM call)."""
        try:
            self._context += context
            self._output += output
        except Exception:
            self._status = _BROKEN

    def ttft(self) -> None:
        """Mark the first output token now; later calls are ignored (safe in a stream loop)."""
        if self._ttft is None:
            try:
                self._ttft = (self._rec._perf() - self._t0) * 1000.0
            except Exception:
                self._status = _BROKEN

    def error(self) -> None:
        """Mark the request failed without raising."""
        if self._status == "ok":
            self._status = "error"

    def __enter__(self) -> RequestTimer:
        try:
            self._t0 = self._rec._perf()
        except Exception:
            self._status = _BROKEN
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        rec = self._rec
        status = self._status
        if exc_type is not None and status == "ok":
            status = "error"
        try:
            e2e_ms = (rec._perf() - self._t0) * 1000.0
            rec._push(
                (
                    rec._clock(),
                    status,
                    e2e_ms,
                    self._context,
                    self._output,
                    self._stages,
                    self.queue_ms,
                    self._ttft,
                )
            )
        except Exception:
            rec._refuse()

    async def __aenter__(self) -> RequestTimer:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def _now(clock: Callable[[], float]) -> float | None:
    """``clock()`` as a start time; None (not sent) if it fails or is not one."""
    try:
        t = float(clock())
    except Exception:
        log.warning("the recorder's clock failed: its envelopes will not say when it started")
        return None
    return t if 0.0 <= t < math.inf else None


class RequestRecorder:
    """Buffers request records and publishes them in batches from a background thread.

    ``sink`` receives ``write(topic, service, bytes)``; the recorder never closes it.
    ``buffer_size`` bounds the records waiting (the flusher may hold one more swapped-out
    batch while it sends). ``clock`` gives wall-clock ``ts``; ``perf`` times stages.
    ``started``: when this process started serving (epoch s; default: ``clock()`` when
    the recorder is created), sent on every envelope; a newer one tells the worker the instance
    restarted, and its first minutes' latencies are taken as a cold start
    (``streams/pipelines/warmup.py``). Create the recorder once per process, at startup.
    With ``autostart=False`` nothing runs in the background until :meth:`start`;
    :meth:`flush` still drains synchronously. Records made after :meth:`close` wait in the
    buffer until the next :meth:`flush` (or the interpreter's exit).
    ``exit_timeout_s``: how long the interpreter's exit may wait for the flusher before
    draining what is left into the sink (None: not at exit).
    """

    def __init__(
        self,
        sink: Sink,
        *,
        topic: str = "ragwatch.requests",
        service: str,
        instance: str,
        host: str | None = None,
        pid: int | None = None,
        started: float | None = None,
        flush_interval_s: float = 1.0,
        heartbeat_s: float = 30.0,
        max_batch: int = 1000,
        buffer_size: int = 100_000,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
        autostart: bool = True,
        exit_timeout_s: float | None = 5.0,
    ) -> None:
        if not service or not instance or not topic:
            raise ValueError("topic, service and instance must be non-empty strings")
        if not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s!r}")
        if not heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
        if exit_timeout_s is not None and not exit_timeout_s >= 0:
            raise ValueError(f"exit_timeout_s must be >= 0 or None, got {exit_timeout_s!r}")
        self.heartbeat_s = heartbeat_s
        if max_batch < 1 or buffer_size < 1:
            raise ValueError(f"max_batch and buffer_size must be >= 1: {max_batch}, {buffer_size}")
        self.sink, self.topic, self.service, self.instance = sink, topic, service, instance
        # Where this instance runs, so alerts can join it with the GPU telemetry of its host
        # (the NVML agent reports socket.gethostname() too) and its serving process.
        self.host = socket.gethostname() if host is None else host
        self.pid = os.getpid() if pid is None else pid
        if started is not None and not 0.0 <= started < math.inf:
            raise ValueError(f"started must be epoch seconds >= 0, got {started!r}")
        self.started = _now(clock) if started is None else float(started)
        self.flush_interval_s, self.max_batch, self.buffer_size = (
            flush_interval_s,
            max_batch,
            buffer_size,
        )
        self._clock, self._perf = clock, perf
        # Request path: _lock guards _buf (swapped by the flusher), _recorded and _dropped.
        self._lock = threading.Lock()
        self._buf: deque[_Item] = deque(maxlen=buffer_size)
        self._recorded = self._dropped = self._invalid = 0
        self._wake_at = min(max_batch, buffer_size)
        # Flusher side: one drain at a time; its counters are written under _drain_lock.
        self._drain_lock = threading.Lock()
        self._sent_records = self._sent_envelopes = self._sink_errors = self._failed = 0
        self._sent_at: float | None = None  # when the flusher last wrote an envelope
        self._heartbeats = 0  # envelopes without records (heartbeat)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # At a normal interpreter exit: drained into the sink, before publishers send.
        self.exit_timeout_s = exit_timeout_s
        self._pid = os.getpid()
        if exit_timeout_s is not None:
            register_at_exit(self, first=True)
        if autostart:
            self.start()

    # ------------------------------------------------------------ request path

    def request(self) -> RequestTimer:
        """A new :class:`RequestTimer`; each call (each task or thread) gets its own."""
        return RequestTimer(self)

    def record(
        self,
        *,
        e2e_ms: float,
        stages: Mapping[str, float] | None = None,
        context_tokens: int = 0,
        output_tokens: int = 0,
        status: Literal["ok", "error"] = "ok",
        queue_ms: float | None = None,
        ttft_ms: float | None = None,
        ts: float | None = None,
    ) -> None:
        """Record one request timed by the caller. ``ts`` defaults to now (``clock``)."""
        try:
            if ts is None:
                ts = self._clock()
            st = None if stages is None else dict(stages)  # the caller may reuse its dict
            self._push((ts, status, e2e_ms, context_tokens, output_tokens, st, queue_ms, ttft_ms))
        except Exception:
            self._refuse()

    def _push(self, item: _Item) -> None:
        with self._lock:
            n = len(self._buf)
            if n == self.buffer_size:
                self._dropped += 1  # the deque's maxlen drops the oldest on this append
            self._buf.append(item)
            self._recorded += 1
        if n + 1 == self._wake_at:
            self._wake.set()

    def _refuse(self) -> None:
        """Count a record that could not even be captured (a broken clock, bad stages)."""
        with self._lock:
            self._recorded += 1
            self._invalid += 1
            invalid = self._invalid
        log_sometimes(log, invalid, "request record refused on capture", exc_info=True)

    # ------------------------------------------------------------ flushing

    def start(self) -> None:
        """Start the background flusher (done by the constructor unless autostart=False)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"ragwatch-sdk-{self.service}", daemon=True
        )
        self._thread.start()

    def flush(self) -> int:
        """Send everything recorded so far to the sink now; returns the records this call sent.

        Waits for a drain the flusher has in progress, and for the sink's ``write``; does
        not call ``sink.flush()`` (the sink's owner does).
        """
        return self._drain()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the flusher and send what is left. Does not close the sink."""
        thread, self._thread = self._thread, None
        self._stop.set()
        self._wake.set()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.error("request flusher still busy after %.0fs (sink blocked?)", timeout)
                return
        self._drain()

    def __enter__(self) -> RequestRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> RecorderStats:
        """The counters now (see :class:`RecorderStats`)."""
        with self._lock:
            recorded, dropped, invalid = self._recorded, self._dropped, self._invalid
        return RecorderStats(
            recorded=recorded,
            dropped=dropped,
            invalid=invalid,
            sent_records=self._sent_records,
            sent_envelopes=self._sent_envelopes,
            sink_errors=self._sink_errors,
            failed_records=self._failed,
            heartbeats=self._heartbeats,
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()  # before draining, so a wake-up during the drain is kept
            if not self._drain() and self._idle_s() >= self.heartbeat_s:
                self.heartbeat()

    def _idle_s(self) -> float:
        """Seconds since the flusher last sent anything (0 the first time; 0 if the clock
        is broken: a broken clock sends no heartbeats, it never raises)."""
        try:
            now = self._clock()
        except Exception:
            return 0.0
        if self._sent_at is None:
            self._sent_at = now
        return now - self._sent_at

    def heartbeat(self) -> bool:
        """Send an envelope without records: "no requests until now", so a quiet minute
        reads as zero traffic, not as a missing instance. The flusher sends one when
        nothing was sent for ``heartbeat_s``. Returns whether the sink took it."""
        with self._drain_lock:
            before = self._heartbeats
            self._write([])
            return self._heartbeats > before

    def _drain(self) -> int:
        with self._drain_lock:
            with self._lock:
                if not self._buf:
                    return 0
                batch, self._buf = self._buf, deque(maxlen=self.buffer_size)
            try:
                return self._send(batch)
            except Exception:  # not expected (_send counts its own failures): keep the thread
                self._failed += len(batch)  # what _send had not taken yet
                log.exception("request flusher failed; %d record(s) lost", len(batch))
                return 0

    def _send(self, batch: deque[_Item]) -> int:
        """Validate, encode and write ``batch`` (owned by the flusher) in max_batch chunks."""
        sent = 0
        while batch:
            chunk = [batch.popleft() for _ in range(min(self.max_batch, len(batch)))]
            records: list[RequestRecord] = []
            for item in chunk:
                try:
                    records.append(_to_record(item))
                except Exception as exc:  # any bad value drops this record only
                    with self._lock:
                        self._invalid += 1
                        invalid = self._invalid
                    log_sometimes(log, invalid, "invalid request record dropped: %s", exc)
            del chunk
            if records:
                sent += self._write(records)
            time.sleep(0)  # let request threads take the GIL between chunks
        return sent

    def _write(self, records: list[RequestRecord]) -> int:
        try:
            env = RequestsEnvelope(
                self.service,
                self.instance,
                self._clock(),
                tuple(records),
                host=self.host or None,
                pid=self.pid,
                started=self.started,
            )
            data = encode(env)
        except Exception:  # validated records always encode; a broken clock might not
            self._failed += len(records)
            log.exception("could not encode %d request record(s)", len(records))
            return 0
        if len(data) > MAX_MESSAGE_BYTES and len(records) > 1:  # consumers would refuse it
            half = len(records) // 2
            return self._write(records[:half]) + self._write(records[half:])
        try:
            self.sink.write(self.topic, self.service, data)
        except Exception:
            self._sink_errors += 1
            self._failed += len(records)
            log_sometimes(
                log,
                self._sink_errors,
                "sink write failed topic=%s key=%s: %d record(s) lost",
                self.topic,
                self.service,
                len(records),
                exc_info=True,
            )
            return 0
        self._sent_at = env.ts
        if not records:
            self._heartbeats += 1
            return 0
        self._sent_envelopes += 1
        self._sent_records += len(records)
        return len(records)


# ---------------------------------------------------------------- validation (flusher only)


def _ms(v: Any) -> float:
    """A finite float >= 0 (exact float and int first: the common case is cheap)."""
    t = type(v)
    if t is not float:
        if t is bool or (t is not int and not isinstance(v, Real)):
            raise TypeError(f"expected a number, got {t.__name__}")
        v = float(v)
    if not 0.0 <= v < math.inf:  # NaN fails every comparison
        raise ValueError(f"expected a finite number >= 0, got {v!r}")
    return v  # type: ignore[no-any-return]


def _count(v: Any) -> int:
    """An integer in [0, 2**64-1]."""
    t = type(v)
    if t is not int:
        if t is bool or not isinstance(v, Integral):
            raise TypeError(f"expected an integer, got {t.__name__}")
        v = int(v)
    if not 0 <= v <= MAX_UINT:
        raise ValueError(f"expected an integer in [0, 2**64-1], got {v}")
    return v  # type: ignore[no-any-return]


def _to_record(item: _Item) -> RequestRecord:
    """Check one buffered tuple against the schema's rules and build its record."""
    ts, status, e2e_ms, context, output, stages, queue_ms, ttft_ms = item
    if status is _BROKEN:
        raise ValueError("a stage name, token count or the perf clock failed during the request")
    if status not in REQUEST_STATUSES:
        raise ValueError(f"status must be one of {', '.join(REQUEST_STATUSES)}, got {status!r}")
    checked: dict[str, float] = {}
    for name, ms in (stages or {}).items():
        if type(name) is not str:
            if not isinstance(name, str):
                raise TypeError(f"stage names must be strings, got {type(name).__name__}")
            name = str.__str__(name)  # a StrEnum member: its plain value (orjson wants str keys)
        checked[name] = _ms(ms)
    return RequestRecord(
        ts=_ms(ts),
        status="ok" if status == "ok" else "error",
        e2e_ms=_ms(e2e_ms),
        context_tokens=_count(context),
        output_tokens=_count(output),
        stages=checked,
        queue_ms=None if queue_ms is None else _ms(queue_ms),
        ttft_ms=None if ttft_ms is None else _ms(ttft_ms),
    )
