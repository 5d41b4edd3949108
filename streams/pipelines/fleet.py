"""Everything one worker computes, without Kafka: envelopes in, explained transitions out.

:class:`Pipelines` bundles the GPU, request, event and metrics pipelines around one
:class:`~ragwatch.streams.alerting.engine.AlertEngine` (fingerprints are unique across series
types) and the :class:`~ragwatch.streams.pipelines.hints.Correlator` that adds root-cause hints.
The Faust worker feeds it decoded messages from its topics; a test, a benchmark or a
replay feeds it envelopes directly, in event-time order, and gets the same transitions.

>>> from ragwatch.agents.scenario import build
>>> from ragwatch.streams.alerting.rules import load_rules
>>> world = build("leak", hosts=1, gpus=1, services=1, interval_s=60.0)
>>> pipes = Pipelines(load_rules())
>>> transitions = pipes.run(world.envelopes(hours=2.0))
>>> leak = next(t.alert for t in transitions if t.alert.status == "firing")
>>> leak.rule, leak.labels["pid"]
('GpuMemoryLeak', '4001')
>>> print(leak.annotations["hint"])  # doctest: +NORMALIZE_WHITESPACE
GPU 0 memory +1.00 GB/h in pid 4001 (rag-worker, container 68335d6694bb) on gpu-node-01:
services on gpu-node-01 (rag-api-0, rag-api-1) are not degraded yet: restart pid 4001
before the CUDA OOM killer does (GPU 0 full in ~14.2 h)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

from ragwatch.codec import gpu_wire
from ragwatch.gpu_wire import GpuMessage
from ragwatch.request_wire import RequestsWire
from ragwatch.schema import (
    Alert,
    Envelope,
    EventEnvelope,
    GpuEnvelope,
    GpuFact,
    HostFacts,
    InstanceFacts,
    MetricsEnvelope,
    RequestsEnvelope,
    Transition,
)
from ragwatch.streams.alerting.engine import AlertEngine
from ragwatch.streams.alerting.rules import Rule
from ragwatch.streams.pipelines.base import (
    DOMAINS,
    Domain,
    SignalPipeline,
    Step,
    Tap,
    drive,
    owns,
    transitions_of,
)
from ragwatch.streams.pipelines.budget import SeriesBudget
from ragwatch.streams.pipelines.events import EventPipeline
from ragwatch.streams.pipelines.facts import Captured, Summary
from ragwatch.streams.pipelines.gpu import GpuPipeline
from ragwatch.streams.pipelines.hints import Correlator
from ragwatch.streams.pipelines.metrics import MetricsPipeline
from ragwatch.streams.pipelines.requests import RequestPipeline, RequestsMessage


class Pipelines:
    """The GPU, request, event and metrics pipelines of one worker, one engine, one
    correlator."""

    def __init__(
        self,
        rules: list[Rule],
        *,
        max_series: int = 100_000,
        remote: Remote | None = None,
        scoring: bool = True,
    ) -> None:
        """``max_series``: the worker's series budget, GPU, request and engine series in
        all (each pipeline also caps its own kind at it). ``remote``: the facts other
        workers publish (the facts topic's table), for the hosts and services this one
        does not own; with it, each alert that starts firing and joins the other side is
        noted (:meth:`take_joins`), so the worker can wait for that side to catch up.
        ``scoring`` False: no signal is scored by the generic detector (its rules, which
        read scores, never fire; ``RAGWATCH_SCORE_SIGNALS``)."""
        self.rules = rules
        self.engine = AlertEngine()
        self.budget = budget = SeriesBudget(max_series)
        e, n, on = self.engine, max_series, scoring
        self.gpus = GpuPipeline(rules, e, max_series=n, budget=budget, scoring=on)
        self.requests = RequestPipeline(rules, e, max_series=n, budget=budget, scoring=on)
        self.events = EventPipeline(rules, self.engine)
        self.metrics = MetricsPipeline(rules, e, max_series=n, budget=budget, scoring=on)
        self.correlator = Correlator(rules, self.engine)
        self.live = Live(self.gpus, self.requests)
        self.remote = remote
        if remote is not None:  # like GPUs on the other workers' hosts (.gpu_peers)
            self.gpus.peers.source = RemotePeers(remote)
        self.joins: list[Join] = []
        self.pipelines: tuple[SignalPipeline, ...] = (
            self.gpus,
            self.events,
            self.metrics,
            self.requests,
        )

    def of(self, domain: Domain) -> tuple[SignalPipeline, ...]:
        """The pipelines whose state belongs to keys of ``domain``."""
        return tuple(p for p in self.pipelines if p.domain == domain)

    def gone(self) -> tuple[set[str], set[str]]:
        """Hosts and services that went silent and were swept since the last call (and
        are tracked no more): their state elsewhere (Redis) can go too; and hosts that
        are tracked nowhere and whose GPU envelopes were refused as too old (stamped
        before 2000, or a day behind: :mod:`.gpu_clock`), so they get no status nor
        snapshot. Those handed to another worker (:meth:`forget`) are not gone."""
        hosts, services = (self._gone(domain) for domain in DOMAINS)
        return hosts, services

    def _gone(self, domain: Domain) -> set[str]:
        pipes = self.of(domain)
        swept = set().union(*(p.swept for p in pipes))
        for p in pipes:
            p.swept.clear()
        return {k for k in swept if not any(p.tracks(k) for p in pipes)}

    @property
    def watermark(self) -> float:
        """The newest event time seen on any input (0 before any)."""
        return max(p.watermark for p in self.pipelines)

    def dump(self, domain: Domain, key: str) -> dict[str, Any]:
        """``key``'s state in every pipeline of ``domain``, by pipeline name (a snapshot)."""
        return {p.name: p.dump(key) for p in self.of(domain)}

    def adopt(self, domain: Domain, key: str, parts: Mapping[str, Any]) -> int:
        """Take over ``key`` from a :meth:`dump`; the series adopted."""
        return sum(p.adopt(key, parts[p.name]) for p in self.of(domain) if p.name in parts)

    def status(self, domain: Domain, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        """The status entry of each of ``keys``: every pipeline's part of it."""
        out: dict[str, dict[str, Any]] = {k: {} for k in keys}
        for p in self.of(domain):
            for k, part in p.status(keys).items():
                out[k].update(part)
        return out

    def tap(self, tap: Tap | None) -> None:
        """Tell ``tap`` after each wave of every pipeline which of its keys moved on (the
        worker's chart recorder, :meth:`.charts.SeriesRecorder.observe`); None: no one."""
        for p in self.pipelines:
            p.tap = tap

    def hint(self, alert: Alert) -> str:
        """The hint ``alert`` would get now, from the facts the pipelines publish (and the
        other workers', as of its time)."""
        return self.correlator.hint(alert, self._live_at(self.correlator.at(alert)))

    def _live_at(self, at: float) -> Live:
        """The pipelines' facts now, and the other workers' as of event time ``at``."""
        if self.remote is None:
            return self.live
        return Live(self.gpus, self.requests, self.remote.as_of(at))

    def gpu(self, env: GpuEnvelope) -> list[Transition]:
        return self.gpu_wire(gpu_wire(env))

    def gpu_wire(self, env: GpuMessage) -> list[Transition]:
        """:meth:`gpu` for a validated message (``codec.decode_gpu_wire``): the worker's
        hot path, without building records."""
        return self.gpu_batch([env])

    def gpu_batch(self, envs: list[GpuMessage]) -> list[Transition]:
        """:meth:`gpu_wire` for a batch of validated messages, in order: the GPU pipeline
        updates their series together, a wave at a time (:meth:`GpuPipeline.process_steps`),
        and each wave is joined before the next: the same transitions as one envelope at a
        time."""
        return transitions_of(drive(self.gpus.process_steps(envs), self._gpu_step))

    def _gpu_step(self, step: Step) -> Step:
        """A wave of GPU envelopes is done: their hosts' event time moves on (event alerts
        age with it), and the transitions get their hints from the facts of that wave."""
        transitions = list(step.transitions)
        for host, ts in step.moved:
            transitions += self.events.advance(host, ts)
        return replace(step, transitions=self._annotate(transitions, step))

    def _annotate(
        self, transitions: list[Transition], step: Step | None = None
    ) -> list[Transition]:
        hosts, instances = (step.hosts, step.instances) if step is not None else ({}, {})
        if self.remote is None:
            facts = Captured(self.live, hosts, instances) if step is not None else self.live
            return self.correlator.annotate(transitions, facts)
        out = []
        for t in transitions:
            if t.fires:  # its hint reads the other workers' facts as of its time
                live = self._live_at(self.correlator.at(t.alert))
                facts = Captured(live, hosts, instances)
                t = replace(t, alert=self.correlator.explain(t.alert, facts))
                if (join := self._join(t.alert, facts)) is not None:
                    self.joins.append(join)
            out.append(t)
        return out

    def _join(self, alert: Alert, facts: Summary) -> Join | None:
        """What of the other side ``alert``'s hint reads that another worker may hold (a
        worker never waits for itself: Faust hands one agent's messages only after the
        other's are taken, so its GPU agent waiting for its request agent would wait in
        vain)."""
        need = self.correlator.joins(alert, facts)
        if need is None or (need[0] == "host" and self.gpus.tracks(need[1])):
            return None
        return Join(alert.fingerprint, need[0], need[1], self.correlator.at(alert), facts)

    def take_joins(self) -> list[Join]:
        """The joins noted since the last call (see ``remote``)."""
        joins, self.joins = self.joins, []
        return joins

    def rehint(self, transitions: list[Transition], joins: Sequence[Join]) -> list[Transition]:
        """``transitions`` with the alerts of ``joins`` explained again (the other side
        has caught up since), each from the facts its own side had when it fired."""
        by = {j.fingerprint: j for j in joins}
        return [
            replace(t, alert=self.correlator.explain(t.alert, by[t.alert.fingerprint].facts))
            if t.fires and t.alert.fingerprint in by
            else t
            for t in transitions
        ]

    def _request_step(self, step: Step) -> Step:
        return replace(step, transitions=self._annotate(step.transitions, step))

    def request(self, env: RequestsMessage) -> list[Transition]:
        return self.request_batch([env])

    def request_batch(self, envs: Sequence[RequestsMessage]) -> list[Transition]:
        """:meth:`request` of each envelope in turn: the request pipeline closes the buckets
        of envelopes of distinct services together, a part at a time
        (:meth:`RequestPipeline.process_steps`), with the transitions of one envelope at a
        time, each part's with its hints."""
        return transitions_of(drive(self.requests.process_steps(envs), self._request_step))

    def event(self, env: EventEnvelope) -> list[Transition]:
        return self._annotate(self.events.process(env))

    def metric(self, env: MetricsEnvelope) -> list[Transition]:
        return self._annotate(self.metrics.process(env))

    def process(self, env: Envelope) -> list[Transition]:
        """One envelope of any kind (alerts are outputs: no transitions)."""
        if isinstance(env, GpuEnvelope):
            return self.gpu(env)
        if isinstance(env, RequestsEnvelope | RequestsWire):
            return self.request(env)
        if isinstance(env, EventEnvelope):
            return self.event(env)
        if isinstance(env, MetricsEnvelope):
            return self.metric(env)
        return []

    def forget(self, domain: Domain, key: str) -> None:
        """Drop everything held about a host or service, with no transition: its partition
        went to another worker, which restores it from the snapshot. Meeting it again
        restores it here from the snapshot too, instead of carrying on from state that
        missed what the other worker saw."""
        for p in self.of(domain):
            p.forget(key)
        self.engine.forget(lambda lab: owns(domain, key, lab))

    def redelivered(self, domain: Domain, key: str) -> None:
        """A host's or service's partition stays here through a rebalance and is read
        again from its committed offset: a host's envelopes come again behind its newest,
        duplicates, not a clock that jumped back (:meth:`.gpu_clock.HostClocks.redelivered`).
        A service's request envelopes need nothing: one not newer than its sender's last
        is counted as a duplicate already (the request pipeline's ``stats.duplicates``)."""
        if domain == "host":
            self.gpus.clocks.redelivered(key)

    def run(self, envelopes: Iterable[Envelope], *, batch: int = 256) -> Iterator[Transition]:
        """Every transition of a stream of envelopes, in order: runs of up to ``batch``
        consecutive GPU envelopes go through :meth:`gpu_batch` together, and runs of
        request envelopes through :meth:`request_batch`."""
        run = Run(self, batch)
        for env in envelopes:
            if isinstance(env, GpuEnvelope):
                yield from run.add(gpu_wire(env))
            elif isinstance(env, RequestsEnvelope):
                yield from run.add(env)
            else:
                yield from run.flush()
                yield from self.process(env)
        yield from run.flush()


class Run:
    """Consecutive envelopes of one kind that has a batch seam (GPU: validated messages;
    requests), at most ``size``, processed together (:meth:`Pipelines.gpu_batch`,
    :meth:`Pipelines.request_batch`): the transitions of one at a time, in order. An
    envelope of the other kind flushes the run first; whoever feeds it flushes it before
    anything of a third kind."""

    def __init__(self, pipes: Pipelines, size: int) -> None:
        self.pipes, self.size = pipes, size
        self.envs: list[Any] = []
        self.gpu = True

    def add(self, env: GpuMessage | RequestsMessage) -> list[Transition]:
        """Take ``env``; the transitions of the run it ended or filled, if any."""
        gpu = isinstance(env, GpuMessage)
        out = self.flush() if self.envs and gpu != self.gpu else []
        self.gpu = gpu
        self.envs.append(env)
        return out + self.flush() if len(self.envs) >= self.size else out

    def flush(self) -> list[Transition]:
        """The run's transitions, in order; the run is empty after."""
        if not self.envs:
            return []
        envs, self.envs = self.envs, []
        return self.pipes.gpu_batch(envs) if self.gpu else self.pipes.request_batch(envs)


class Remote(Protocol):
    """The facts other workers publish (the facts topic's table,
    :class:`~ragwatch.streams.worker.facts_table.FactsTable`), as of an event time."""

    def as_of(self, at: float) -> Summary: ...

    def gpus_at(self, at: float) -> list[tuple[str, GpuFact]]: ...

    def behind(self, domain: Domain, at: float) -> list[str]: ...


class RemotePeers:
    """The like GPUs of the hosts other workers own, as they published them (the GPU
    pipeline's :class:`~.gpu_peers.PeerSource`): a minute is ready once no live worker
    that reads GPU telemetry is behind it."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    def gpus_at(self, at: float) -> list[tuple[str, GpuFact]]:
        return self.remote.gpus_at(at)

    def ready(self, at: float) -> bool:
        return not self.remote.behind("host", at)


class Join(NamedTuple):
    """An alert that started firing whose hint reads the other side (``domain``: the GPU
    telemetry of ``host``, or the services on it), at event time ``at``, with the facts
    its own side had then."""

    fingerprint: str
    domain: Domain
    host: str
    at: float
    facts: Summary


class Live:
    """The facts the GPU and request pipelines publish as they are now (a
    :class:`~.facts.Summary`); with ``remote`` (the facts the other workers published, as
    of an alert's time), those of the hosts and instances the pipelines do not hold."""

    def __init__(
        self, gpus: GpuPipeline, requests: RequestPipeline, remote: Summary | None = None
    ) -> None:
        self.gpus, self.requests, self.remote = gpus, requests, remote

    def host(self, host: str) -> HostFacts:
        own = self.gpus.facts(host)
        return own if own.ts is not None or self.remote is None else self.remote.host(host)

    def instance(self, service: str, instance: str) -> InstanceFacts | None:
        own = self.requests.facts(service, instance)
        if own is not None or self.remote is None:
            return own
        return self.remote.instance(service, instance)

    def instances_on(self, host: str) -> list[InstanceFacts]:
        own = self.requests.facts_on(host)
        if self.remote is None:
            return own
        mine = {(f.service, f.instance) for f in own}
        theirs = [f for f in self.remote.instances_on(host) if (f.service, f.instance) not in mine]
        return sorted(own + theirs, key=lambda f: (f.service, f.instance))
