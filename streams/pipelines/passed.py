"""The metrics a scraped target passes through, scored by the generic detector.

The agents rename what ragwatch reads of vLLM, SGLang, llama.cpp, TGI, TEI, Triton and
dcgm-exporter to
``ragwatch_*`` names and pass every other metric through unchanged on
``ragwatch.metrics`` (up to their ``--series-cap``). The engine pipeline
(:mod:`.metrics`) reads its own names; :class:`PassedScores` scores the rest, each label
set a series of one signal: a gauge's value, a counter's rate. Prometheus' naming says
which is which (the exposition's ``# TYPE`` does not travel): ``_total``, ``_count`` and
``_sum`` are counters (a value below the last one: the counter restarted from zero, the
increase is the new value), the rest gauges; a histogram's ``_bucket`` series and
``_created`` timestamps are not scored (a histogram is read through its ``_sum`` and
``_count``). At most ``cap`` label sets a target are scored (the first seen; the others
counted in :attr:`PassedScores.dropped`), so a target with thousands of series costs at
most ``cap`` rows of the generic detector.

A scored series is named in status, ``/metrics`` and the advisor by its selector,
``name{label="value",...}``, beside the engine's own signals.

>>> from ragwatch.schema import MetricSample
>>> passed, mine = PassedScores(cap=2), {}
>>> for i in range(3):
...     passed.take(mine, 60.0 * i, [
...         MetricSample("DCGM_FI_DEV_SM_CLOCK", {"gpu": "0"}, 1980.0),
...         MetricSample("app_cache_hits_total", {}, 100.0 * i),
...         MetricSample("app_queue_depth", {}, 3.0)])  # over the cap of 2
>>> sorted(passed.scored(mine)), passed.dropped
(['DCGM_FI_DEV_SM_CLOCK{gpu="0"}', 'app_cache_hits_total'], 3)
>>> passed.scored(mine)["app_cache_hits_total"][4]  # the value scored: the rate
1.66667
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragwatch.schema import MetricSample
from ragwatch.streams.pipelines.scoring import ScoreBlock

MAX_PASSED = 64  # label sets scored per target
COUNTER_ENDS = ("_total", "_count", "_sum")
UNSCORED_ENDS = ("_bucket", "_created")
LabelKey = tuple[str, tuple[tuple[str, str], ...]]  # metric name, sorted labels


@dataclass(slots=True)
class Passed:
    """One scored label set: its row of the block, and for a counter its last value and
    time (NaN: a gauge, or no value yet)."""

    row: int
    last: float = math.nan
    ts: float = math.nan


def selector(key: LabelKey) -> str:
    """``name{label="value",...}`` (PromQL's selector; the name alone without labels).

    >>> selector(("up", (("job", 'a"b'),)))
    'up{job="a\\\\"b"}'
    """
    name, labels = key
    if not labels:
        return name

    def quoted(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return name + "{" + ",".join(f'{k}="{quoted(v)}"' for k, v in labels) + "}"


class PassedScores:
    """The passed-through metrics of every target, rows of one :class:`ScoreBlock` (see
    the module docstring); each target keeps its own ``{LabelKey: Passed}``."""

    def __init__(self, cap: int = MAX_PASSED, *, on: bool = True) -> None:
        self.block = ScoreBlock(("value",), on=on)
        self.cap = cap
        self.dropped = 0  # label sets beyond a target's cap (counted at each scrape)
        self._free: list[int] = []
        self._rows = 0

    def take(
        self, mine: dict[LabelKey, Passed], ts: float, samples: Iterable[MetricSample]
    ) -> None:
        """One scrape's passed-through samples of a target (``mine``: its label sets):
        score, then learn, each label set's value or rate."""
        if not self.block.on:
            return
        rows, values = [], []
        for sample in samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            p = mine.get(key)
            if p is None:
                if sample.name.endswith(UNSCORED_ENDS):
                    continue
                if len(mine) >= self.cap:
                    self.dropped += 1
                    continue
                p = mine[key] = Passed(self._row())
            x = sample.value
            if sample.name.endswith(COUNTER_ENDS):
                x, p.last, p.ts = _rate(p, ts, sample.value), sample.value, ts
            if p.row not in rows:  # (a label set twice in one scrape: the first)
                rows.append(p.row)
                values.append(x)
        if rows:
            v = np.array(values, dtype=np.float64)[:, None]
            self.block.learn(np.array(rows, dtype=np.intp), np.full(len(rows), ts), v)

    def scored(self, mine: Mapping[LabelKey, Passed]) -> dict[str, list[float | None]]:
        """Each scored label set's fields (:meth:`ScoreBlock.scored`), by its selector."""
        out = {}
        for key, p in sorted(mine.items()):
            got = self.block.scored(p.row).get("value")
            if got is not None:
                out[selector(key)] = got
        return out

    def release(self, mine: Mapping[LabelKey, Passed]) -> None:
        """A target dropped: its rows go back."""
        rows = [p.row for p in mine.values()]
        self.block.release(np.array(rows, dtype=np.intp))
        self._free += rows

    def dump(self, mine: Mapping[LabelKey, Passed]) -> list[dict[str, Any]]:
        """A target's label sets as plain data (a snapshot)."""
        return [
            {"name": k[0], "labels": dict(k[1]), "last": _plain(p.last), "ts": _plain(p.ts),
             "scores": self.block.dump(p.row)}
            for k, p in sorted(mine.items())
        ]  # fmt: skip

    def check(self, state: Sequence[Any]) -> list[Any]:
        """A :meth:`dump` loaded apart, to :meth:`adopt`; ValueError if it does not fit."""
        checked = []
        try:
            for d in state[: self.cap]:
                labels = tuple(sorted((str(k), str(v)) for k, v in d["labels"].items()))
                key = (str(d["name"]), labels)
                last, ts = (math.nan if d[f] is None else float(d[f]) for f in ("last", "ts"))
                checked.append((key, last, ts, self.block.check(d["scores"])))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"passed-through metrics: {exc}") from None
        return checked

    def adopt(self, mine: dict[LabelKey, Passed], checked: list[Any]) -> None:
        """A :meth:`check` ed dump into an empty ``mine``."""
        for key, last, ts, scores in checked:
            p = mine[key] = Passed(self._row(), last, ts)
            self.block.adopt(p.row, scores)

    def _row(self) -> int:
        if self._free:
            return self._free.pop()
        self._rows += 1
        self.block.grow(self._rows)
        return self._rows - 1


def _rate(p: Passed, ts: float, value: float) -> float:
    """A counter's rate since its last scrape (NaN: the first, or not later)."""
    if not ts > p.ts:
        return math.nan
    increase = value if value < p.last else value - p.last  # a reset: from zero
    return increase / (ts - p.ts)


def _plain(v: float) -> float | None:
    return None if math.isnan(v) else v
