"""What every signal pipeline is, to the fleet, the snapshots, the status and the charts.

A pipeline turns one kind of telemetry into series, signals and alert transitions. Its
state belongs to *keys* of one :data:`Domain`: a host (GPU telemetry, device events,
scraped engines) or a service (RAG requests); the input topic's key names it, so a
worker owns a key whole and snapshots, rebalances and pruning go by it. A fifth kind of
telemetry is a fifth class with this shape, added to :class:`~.fleet.Pipelines`' tuple.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

from ragwatch.schema import Transition

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
