"""What one bucket of one request series accumulates until it closes.

A request series (a service instance) keeps its records in fixed event-time buckets
(``bucket_s``, a minute by default) until the bucket closes: counts and sums for the rates
and means (requests, errors, output tokens and their squares, context tokens, the records
of an active outlier cluster apart) and, per latency (end to end, each stage, time to first
token, queueing), a :class:`Reservoir` of at most ``reservoir`` values, a uniform sample of
all that came. At its close the counts go to the series' count ring and the values to its
tail window (:mod:`~ragwatch.detectors.tails`). Two values per request are
derived from its record: ``tpot``, the decode time per output token
(:func:`decode_ms_per_token`), ``ttft_net``, its time to first token less its queue
wait (:func:`ttft_net_ms`): what the serving engine spent itself, and ``out``, the output
tokens of a request that succeeded (for a mean over the newest requests).

>>> import random
>>> from ragwatch.schema import RequestRecord
>>> b = Bucket(reservoir=100, rng=random.Random(0))
>>> b.add_run([RequestRecord(ts=1.0, status="ok", e2e_ms=640.0, context_tokens=2750,
...                          output_tokens=178, stages={"llm": 410.0})])
>>> b.counts().n, list(b.latencies["llm"].values)
(1, [410.0])
"""

from __future__ import annotations

import random
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ragwatch.detectors.counts import BucketCounts

STAGES = ("retriever", "reranker", "llm")
# The latencies a request's own size sets (its context, its answer): a record of an active
# outlier cluster leaves them out, as its counts (a new kind's long prefill is no slower
# service). The stages before the LLM and the queue serve every request alike: counted.
OWN: tuple[str, ...] = ("e2e", "llm", "ttft", "tpot", "ttft_net", "out")
# values derived from a record (decode time per token, TTFT less queue wait): sampled, once
# their reservoir is full, with a generator of their own, so that adding them left the
# samples of the measured latencies (and the series' shared generator) as they were
DERIVED = ("tpot", "ttft_net", "out")
DERIVED_SEED = 30


class Record(Protocol):
    """A request record as the pipeline reads it: :class:`~ragwatch.schema.RequestRecord`
    (the checked decode, tests) or :class:`~ragwatch.request_wire.RecordWire` (the worker's
    typed decode) alike."""

    @property
    def ts(self) -> float: ...
    @property
    def status(self) -> str: ...
    @property
    def e2e_ms(self) -> float: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def stages(self) -> dict[str, float]: ...
    @property
    def queue_ms(self) -> float | None: ...
    @property
    def ttft_ms(self) -> float | None: ...


class RequestsMessage(Protocol):
    """A requests envelope as the pipeline reads it: :class:`~ragwatch.schema.
    RequestsEnvelope` or the worker's typed :class:`~ragwatch.request_wire.RequestsWire`."""

    @property
    def service(self) -> str: ...
    @property
    def instance(self) -> str: ...
    @property
    def ts(self) -> float: ...
    @property
    def records(self) -> Sequence[Record]: ...
    @property
    def host(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def started(self) -> float | None: ...


@dataclass
class Reservoir:
    """At most ``cap`` values, a uniform sample of all added (Algorithm R), as doubles
    (8 bytes a value; a snapshot written before kept a list, which reads the same)."""

    cap: int
    rng: random.Random
    values: array[float] = field(default_factory=lambda: array("d"))
    seen: int = 0

    def extend(self, vs: Sequence[float]) -> None:
        """Values that fit as they are (no sampling: nothing is drawn from the rng)."""
        if len(self.values) + len(vs) > self.cap:
            raise ValueError(f"{len(vs)} values do not fit ({len(self.values)} of {self.cap})")
        self.values.extend(vs)
        self.seen += len(vs)

    def add(self, v: float) -> None:
        self.seen += 1
        if len(self.values) < self.cap:
            self.values.append(v)
        else:
            j = self.rng.randrange(self.seen)
            if j < self.cap:
                self.values[j] = v


@dataclass
class Bucket:
    """What one bucket of one series accumulates until it closes."""

    reservoir: int
    rng: random.Random
    n: int = 0
    errors: int = 0
    output_tokens: int = 0
    output_sq: float = 0.0
    context_tokens: int = 0
    latencies: dict[str, Reservoir] = field(default_factory=dict)
    outliers: int = 0
    novel: int = 0  # ok records away from the service's known clusters
    labels: Counter[str] = field(default_factory=Counter)
    clustered: int = 0  # records of the service's active outlier cluster (in none of the above)

    def add(self, rec: Record, clustered: bool = False) -> None:
        """One record; one of an active outlier cluster is counted apart (``clustered``):
        it is the news RequestOutlierCluster pages for, not the service's usual traffic,
        so the traffic baselines neither learn it nor test it, nor do the latencies its
        own size sets (:data:`OWN`: a new kind 20x as long as the usual takes its long
        prefill, no slower service). The retriever, the reranker and the queue serve it
        as they serve every request: those count."""
        skip = OWN if clustered else ()
        if clustered:
            self.clustered += 1
        else:
            self.n += 1
            self.errors += rec.status != "ok"
            self.output_tokens += rec.output_tokens
            self.output_sq += rec.output_tokens * rec.output_tokens
            self.context_tokens += rec.context_tokens
        if "e2e" not in skip:
            self._sample("e2e", rec.e2e_ms)
        for stage, ms in rec.stages.items():
            if stage in STAGES and stage not in skip:
                self._sample(stage, ms)
        if rec.ttft_ms is not None and "ttft" not in skip:
            self._sample("ttft", rec.ttft_ms)
        if rec.queue_ms is not None and "queue" not in skip:
            self._sample("queue", rec.queue_ms)
        if "tpot" not in skip and (tpot := decode_ms_per_token(rec)) is not None:
            self._sample("tpot", tpot)
        if "ttft_net" not in skip and (net := ttft_net_ms(rec)) is not None:
            self._sample("ttft_net", net)
        if rec.status == "ok" and "out" not in skip:
            self._sample("out", float(rec.output_tokens))

    def add_run(self, recs: Sequence[Record], clustered: Sequence[bool] = ()) -> None:
        """:meth:`add` of each record of ``recs`` in turn (``clustered[i]`` for record i;
        none if empty), a column at a time: the latencies of a name appended together,
        the counts summed. Where a reservoir would fill within the run, record by record
        (sampling then draws from the shared rng in the records' order)."""
        if clustered and len(clustered) != len(recs):
            raise ValueError(f"{len(clustered)} clustered flags for {len(recs)} records")
        cols = _latency_columns(recs, clustered)
        lat, cap = self.latencies, self.reservoir
        if any((len(lat[k].values) if k in lat else 0) + len(v) > cap for k, v in cols.items()):
            for i, rec in enumerate(recs):
                self.add(rec, bool(clustered) and clustered[i])
            return
        for name, values in cols.items():
            if not values:
                continue
            res = lat.get(name)
            if res is None:
                res = lat[name] = Reservoir(cap, self.rng_for(name))
            res.extend(values)
        counted = (
            [r for r, c in zip(recs, clustered, strict=True) if not c] if any(clustered) else recs
        )
        self.clustered += len(recs) - len(counted)
        self.n += len(counted)
        self.errors += sum(1 for r in counted if r.status != "ok")
        for rec in counted:
            out = rec.output_tokens
            self.output_tokens += out
            self.output_sq += out * out
            self.context_tokens += rec.context_tokens

    def _sample(self, name: str, v: float) -> None:
        r = self.latencies.get(name)
        if r is None:
            r = self.latencies[name] = Reservoir(self.reservoir, self.rng_for(name))
        if len(r.values) < r.cap:  # Reservoir.add, inline: a call less per value
            r.seen += 1
            r.values.append(v)
        else:
            r.add(v)

    def rng_for(self, name: str) -> random.Random:
        """The generator that samples ``name``'s reservoir (see :data:`DERIVED`)."""
        if name not in DERIVED:
            return self.rng
        for other in DERIVED:  # the bucket's derived reservoirs share one
            if other in self.latencies:
                return self.latencies[other].rng
        return random.Random(DERIVED_SEED)

    def counts(self) -> BucketCounts:
        return BucketCounts(
            self.n,
            self.errors,
            self.output_tokens,
            self.output_sq,
            self.context_tokens,
            clustered=self.clustered,
        )


def _latency_columns(
    recs: Sequence[Record], clustered: Sequence[bool] = ()
) -> dict[str, list[float]]:
    """The latencies of ``recs`` by name, each in the order :meth:`Bucket.add` samples
    them (the records' order); a name no record has is left out. Of the records of an
    active outlier cluster (``clustered``), only the latencies not in :data:`OWN`."""
    own = [r for r, c in zip(recs, clustered, strict=True) if not c] if any(clustered) else recs

    def of(name: str) -> Sequence[Record]:
        return own if name in OWN else recs

    cols: dict[str, list[float]] = {"e2e": [r.e2e_ms for r in of("e2e")]}
    for stage in STAGES:
        col = [v for r in of(stage) if (v := r.stages.get(stage)) is not None]
        if col:
            cols[stage] = col
    ttft = [v for r in of("ttft") if (v := r.ttft_ms) is not None]
    queue = [v for r in of("queue") if (v := r.queue_ms) is not None]
    if ttft:
        cols["ttft"] = ttft
    if queue:
        cols["queue"] = queue
    tpot = [v for r in of("tpot") if (v := decode_ms_per_token(r)) is not None]
    if tpot:
        cols["tpot"] = tpot
    if ttft:
        cols["ttft_net"] = [v for r in of("ttft_net") if (v := ttft_net_ms(r)) is not None]
    out = [float(r.output_tokens) for r in of("out") if r.status == "ok"]
    if out:
        cols["out"] = out
    return cols


def decode_ms_per_token(rec: Record) -> float | None:
    """The time the request spent per output token while decoding (ms), None where it
    cannot be told (a failed request, fewer than 2 tokens, no LLM time or TTFT).

    With ``ttft_ms`` (from the request's start, as the SDK measures it), the decode is
    the time from the first token to the end, ``e2e - ttft``, over the ``out - 1`` tokens
    after the first; it cannot be longer than the LLM stage, so a TTFT measured from the
    LLM call's start instead (``e2e - ttft`` longer than the stage) is taken as
    ``llm - ttft``. Without a TTFT: the whole LLM stage over all its tokens (its prefill
    included: a slower prefill reads as slower decoding, which is what a user sees).

    >>> from ragwatch.schema import RequestRecord
    >>> decode_ms_per_token(RequestRecord(ts=0, status="ok", e2e_ms=900.0, context_tokens=1,
    ...     output_tokens=101, stages={"llm": 800.0}, ttft_ms=400.0))
    5.0
    """
    out = rec.output_tokens
    if rec.status != "ok" or out < 2:
        return None
    llm, ttft = rec.stages.get("llm"), rec.ttft_ms
    if ttft is not None and rec.e2e_ms > ttft:
        span = rec.e2e_ms - ttft
        if llm is not None and span > llm:
            span = llm - ttft if llm > ttft else llm
        return span / (out - 1) if span > 0 else None
    return llm / out if llm is not None and llm > 0 else None


def ttft_net_ms(rec: Record) -> float | None:
    """Time to first token less the queue wait (ms; the TTFT itself without a queue
    wait): the part the engine (and the stages before it) spent, so a queue that grows
    pages once, as queue wait, not again as TTFT."""
    ttft = rec.ttft_ms
    if ttft is None:
        return None
    q = rec.queue_ms
    return ttft - q if q is not None and q < ttft else (ttft if q is None else 0.0)


def drop_before(buckets: dict[int, Bucket], b: int) -> int:
    """Drop the open buckets before bucket ``b`` (a gap the closes skip: records a sender
    sent later for a time it was silent would otherwise stay open for good); how many
    records they held.

    >>> import random
    >>> open_ = {3: Bucket(8, random.Random(0)), 9: Bucket(8, random.Random(0))}
    >>> open_[3].n = 2
    >>> drop_before(open_, 5), sorted(open_)
    (2, [9])
    """
    n = 0
    for k in [k for k in buckets if k < b]:
        gone = buckets.pop(k)
        n += gone.n + gone.clustered
    return n
