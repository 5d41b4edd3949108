"""What every signal pipeline is, to the fleet, the snapshots, the status and the charts.

A pipeline turns one kind of telemetry into series, signals and alert transitions. Its
state belongs to *keys* of one :data:`Domain`: a host (GPU telemetry, device events,
scraped engines) or a service (RAG requests); the input topic's key names it, so a
worker owns a key whole and snapshots, rebalances and pruning go by it. A fifth kind of
telemetry is a fifth class with this shape, added to :class:`~.fleet.Pipelines`' tuple.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

from ragwatch.schema import AnomalyFact, HostFacts, InstanceFacts, Transition

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


@dataclass(frozen=True, slots=True)
class Step:
    """What one wave of a batch produced: the keys it moved on, each with the event time
    of its newest envelope (a request step: every service of its batch, whose buckets may
    have closed), its transitions in order, and the facts of its own side taken
    at that wave for the alerts that start firing in it (by host; by (service, instance)),
    which their hints read (:mod:`.facts`)."""

    moved: Sequence[tuple[str, float]]
    transitions: list[Transition]
    hosts: Mapping[str, HostFacts] = field(default_factory=dict)
    instances: Mapping[tuple[str, str], InstanceFacts] = field(default_factory=dict)


# a pipeline's batch, wave by wave (``process_steps``): closed by whoever drives it if it fails
Steps = Generator[Step, None, None]


def transitions_of(steps: Iterable[Step]) -> list[Transition]:
    """The transitions of ``steps``, in order."""
    return [t for step in steps for t in step.transitions]


def drive(steps: Steps, join: Callable[[Step], Step] | None = None) -> list[Step]:
    """Every step of a batch (a pipeline's ``process_steps``), each joined as it comes,
    before the pipeline goes on (the fleet ages event alerts and adds hints there). If the
    pipeline fails, the steps it had not handed on are joined too and come with the
    :class:`BatchFailed`, after those done; if ``join`` fails, the batch stops there and
    the step it failed on comes as it was.

    >>> drive(step for step in [Step([("h", 1.0)], [])])
    [Step(moved=[('h', 1.0)], transitions=[], hosts={}, instances={})]
    """
    done: list[Step] = []
    while True:
        try:
            step = next(steps)
        except StopIteration:
            return done
        except BatchFailed as exc:  # the pipeline failed
            rest = exc.steps if join is None else [join(s) for s in exc.steps]
            raise BatchFailed(done + rest) from exc.__cause__
        try:
            done.append(step if join is None else join(step))
        except Exception as exc:  # the join failed: the rest of the batch is not done
            steps.close()
            raise BatchFailed([*done, step]) from exc


class BatchFailed(Exception):
    """Processing a batch raised (a bug): ``steps`` are the waves of the batch done before
    it, whose transitions are to be sent all the same (their alerts are in the engine:
    without them their pages would never go); the batch's state is cleared for the next
    one. What the failed part had gathered is not learnt twice: its envelopes, tried again
    one at a time, read as seen."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.transitions = transitions_of(steps)
        super().__init__(f"a batch failed after {len(self.transitions)} transition(s)")


class ChartSeries(NamedTuple):
    """One series a chart may draw: its kind (gpu, process, engine, service), labels, the
    event time of its newest signals, and what holds them (``.signals``)."""

    kind: str
    labels: Mapping[str, str]
    ts: float
    holder: Any
    where: str | None = None  # its ids' prefix (chart_ids.series_prefix), if kept at hand


class SeriesState(Protocol):
    """A series as readers outside its pipeline see it (its facts, charts, status): its labels
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

    @property
    def anomalous(self) -> tuple[AnomalyFact, ...]:
        """Its scored signals whose peak of the last hour reached the advisor's bar."""
        ...


class ChartReader(Protocol):
    """What a chart recorder reads of the pipeline whose series moved on: its name and
    domain, and the series of some of its keys, each with its signals."""

    name: ClassVar[str]
    domain: ClassVar[Domain]

    def charts(self, keys: Collection[str]) -> Iterable[ChartSeries]: ...


# told by a pipeline after each wave which of its keys moved on, each with the event time
# of its newest envelope (the worker's chart recorder: charts.SeriesRecorder.observe)
Tap = Callable[[ChartReader, Sequence[tuple[str, float]]], None]


class SignalPipeline(Protocol):
    """The seam between a pipeline and everything that is not its telemetry."""

    name: ClassVar[str]  # its part of a snapshot and a status entry: gpu, events, engines, ...
    domain: ClassVar[Domain]
    # keys whose last series went silent and was swept, or whose input was refused with no
    # series of theirs kept (a GPU host's stamps too old): see Pipelines.gone
    swept: set[str]
    sweep_mark: float  # silent keys are swept against min(watermark, sweep_mark)
    tap: Tap | None  # told which keys moved on after each wave (the charts), if set

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
