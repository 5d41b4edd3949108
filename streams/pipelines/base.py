"""What every signal pipeline is, to the fleet, the snapshots, the status and the charts.

A pipeline turns one kind of telemetry into series, signals and alert transitions. Its
state belongs to *keys* of one :data:`Domain`: a host (GPU telemetry, device events,
scraped engines) or a service (RAG requests); the input topic's key names it, so a
worker owns a key whole and snapshots, rebalances and pruning go by it. A fifth kind of
telemetry is a fifth class with this shape, added to :class:`~.fleet.Pipelines`' tuple.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

from ragwatch.schema import Transition
from ragwatch.streams.alerting.rules import Rule

Domain = Literal["host", "service"]
DOMAINS: tuple[Domain, ...] = ("host", "service")


def owns(domain: Domain, key: str, labels: Mapping[str, str]) -> bool:
    """Whether an alert with ``labels`` belongs to ``key`` of ``domain`` (a request alert
    names its service, and may name the host it runs on: it is the service's).

    >>> owns("host", "h1", {"host": "h1", "gpu": "0"})
    True
    >>> owns("host", "h1", {"host": "h1", "service": "rag"})
    False
    """
    if domain == "service":
        return labels.get("service") == key
    return labels.get("host") == key and "service" not in labels


class BatchFailed(Exception):
    """Processing a batch raised (a bug): ``transitions`` are those of the part of the batch
    done before it, to be sent all the same (their alerts are in the engine: without them
    their pages would never go); the batch's state is cleared for the next one. What the
    failed part had gathered is not learnt twice: its envelopes, tried again one at a time,
    read as seen."""

    def __init__(self, transitions: list[Transition]) -> None:
        super().__init__(f"a batch failed after {len(transitions)} transition(s)")
        self.transitions = transitions


class ChartSeries(NamedTuple):
    """One series a chart may draw: its kind (gpu, process, engine, service), labels, the
    event time of its newest signals, and what holds them (``.signals``)."""

    kind: str
    labels: Mapping[str, str]
    ts: float
    holder: Any
    where: str | None = None  # its ids' prefix (chart_ids.series_prefix), if kept at hand


class SeriesState(Protocol):
    """A series as readers outside its pipeline see it (hints, charts, status): its labels
    and newest signals."""

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def signals(self) -> Mapping[str, float | None]: ...


class GpuSeriesState(SeriesState, Protocol):
    """A GPU or process series: and the event time of its newest sample."""

    @property
    def last_ts(self) -> float: ...


class InstanceState(SeriesState, Protocol):
    """A service instance's request series: and its host, the end of its newest closed
    bucket and the label of its active outlier cluster."""

    @property
    def host(self) -> str | None: ...

    @property
    def bucket_end(self) -> float | None: ...

    @property
    def outlier_label(self) -> str | None: ...


class GpuState(Protocol):
    """What the GPU pipeline lets others read of a host (the hints: causes)."""

    def host_series(self, host: str) -> Mapping[tuple[str, int, str, int], GpuSeriesState]: ...


class RequestState(Protocol):
    """What the request pipeline lets others read (the hints: effects), by (service,
    instance)."""

    @property
    def series(self) -> Mapping[tuple[str, str], InstanceState]: ...


class ChartSource(Protocol):
    """What a chart recorder reads: the rules (which chart holds which alert) and the
    series of some keys, each with its signals (:meth:`~.fleet.Pipelines.charts`)."""

    @property
    def rules(self) -> Sequence[Rule]: ...

    def charts(self, domain: Domain, keys: Collection[str]) -> Iterable[ChartSeries]: ...


class SignalPipeline(Protocol):
    """The seam between a pipeline and everything that is not its telemetry."""

    name: ClassVar[str]  # its part of a snapshot and a status entry: gpu, events, engines, ...
    domain: ClassVar[Domain]
    swept: set[str]  # keys whose last series went silent and was swept (see Pipelines.gone)
    sweep_mark: float  # silent keys are swept against min(watermark, sweep_mark)

    @property
    def watermark(self) -> float: ...

    def tracks(self, key: str) -> bool:
        """Whether it holds any series of ``key``."""
        ...

    def forget(self, key: str) -> Any:
        """Drop ``key``'s state without a transition (another worker owns it now)."""
        ...

    def dump(self, key: str) -> Any:
        """``key``'s state, for a snapshot (picklable)."""
        ...

    def adopt(self, key: str, state: Any) -> int:
        """Take over ``key`` from a :meth:`dump`, unless it has its own (newer) state;
        the series adopted."""
        ...

    def status(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        """Its part of each key's status entry (what ``ragwatch status`` shows), for many
        keys at once (the worker writes those that changed every second)."""
        ...

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]:
        """The series of ``keys`` that charts may draw."""
        ...
