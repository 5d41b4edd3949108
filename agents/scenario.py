"""One place that turns a scenario name into the simulators that play it.

``ragwatch agent --source sim``, ``ragwatch demo`` and ``bench/quality.py`` all build their
simulated world here, so a scenario means the same telemetry everywhere: a fleet of GPU
hosts (:class:`~ragwatch.agents.sim.FleetSimulator`) and, with ``services > 0``, the RAG
services running on them (:class:`~ragwatch.agents.sim_requests.RequestSimulator`). The
request fault hits the instance that runs on the leaking GPU's host, so GPU and request
alerts can be joined by host.

>>> world = build("all", hosts=2, gpus=1, services=1, start_ts=1_767_225_600.0)
>>> world.requests.fault_target.host == world.fleet.leak_target[0]
True
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from ragwatch.agents.sim import FleetSimulator, SimConfig, host_name
from ragwatch.agents.sim_requests import SCENARIOS, RequestSimConfig, RequestSimulator
from ragwatch.schema import Envelope

GPU_LEAK_SCENARIOS = ("leak", "oom", "all")  # scenarios in which a GPU process leaks
REQUEST_SCENARIOS = ("throughput", "retrieval", "outliers", "oom", "all")  # need --services


@dataclass(frozen=True)
class World:
    """The simulators of one scenario; ``requests`` is None without services."""

    scenario: str
    fleet: FleetSimulator
    requests: RequestSimulator | None

    @property
    def fault_start_ts(self) -> float:
        """Event time at which the scenario's fault starts."""
        cfg = self.fleet.config
        return cfg.start_ts + cfg.leak_start_s

    def envelopes(self, *, hours: float) -> Iterator[Envelope]:
        """``hours`` of event time, tick by tick: GPU envelopes, device events, requests.

        Consumes the simulators (build a new world to play it again)."""
        fleet = self.fleet.ticks()
        requests = self.requests.ticks() if self.requests is not None else None
        n = round(hours * 3600 / self.fleet.config.interval_s)
        for _, envelopes, events in itertools.islice(fleet, n):
            yield from envelopes
            yield from events
            if requests is not None:
                yield from next(requests)[1]


def build(
    scenario: str,
    *,
    hosts: int = 4,
    gpus: int = 2,
    services: int = 2,
    seed: int = 0,
    interval_s: float = 10.0,
    start_ts: float = 1_767_225_600.0,
    heal_after_s: float | None = None,
    base_qps: float = 20.0,
) -> World:
    """The fleet and request simulators of ``scenario``; ValueError on a bad combination.
    ``heal_after_s``: the request faults end that long after they start; ``base_qps``:
    each instance's daily mean of requests per second (a tenth of them recorded)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    if services < 1 and scenario in REQUEST_SCENARIOS:
        raise ValueError(f"scenario {scenario!r} needs request telemetry (--services)")
    cfg = SimConfig(
        hosts=hosts,
        gpus=gpus,
        seed=seed,
        scenario="leak" if scenario in GPU_LEAK_SCENARIOS else "healthy",
        interval_s=interval_s,
        start_ts=start_ts,
    )
    fleet = FleetSimulator(cfg)
    requests = None
    if services > 0:
        leak = fleet.leak_target
        requests = RequestSimulator(
            RequestSimConfig(
                services=services,
                instances=2,
                seed=seed,
                scenario=scenario,
                start_ts=start_ts,
                batch_s=interval_s,
                base_qps=base_qps,
                fault_start_s=cfg.leak_start_s,
                fault_end_s=None if heal_after_s is None else cfg.leak_start_s + heal_after_s,
                hosts=tuple(host_name(h) for h in range(hosts)),
                fault_host=leak[0] if leak is not None else None,
            )
        )
    return World(scenario, fleet, requests)
