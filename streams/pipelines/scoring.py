"""Every numeric signal of a kind of series scored by the generic detector.

A pipeline holds one :class:`ScoreBlock` per kind of series it tracks (GPUs, processes,
service instances, scraped engines): the block gives each of the pipeline's rows that
it scores ``len(names)`` rows of a :class:`~ragwatch.detectors.generic.GenericBank`
(a *slot*), taken when the row is first scored and handed back when the pipeline frees
the row, and keeps the newest score, expected value and band of each signal (float32:
what readers show), and the highest score of the last hour with the value and expected
value then (the advisor ranks signals by it: an alert is explained by what moved around
its start, not only by what is anomalous at the moment it is read). Rules read
``<signal>_score``; status, ``/metrics`` and the advisor read the rest
(:meth:`ScoreBlock.scored`, :data:`~ragwatch.catalog.SCORE_FIELDS`).

The block learns on event time: the pipeline hands it the values of a wave's rows with
their sample times, so a replay gives the scores the live worker gave. A series is scored
at most once a minute of event time (``every_s``): its first sample in a new minute is
scored and learnt, the others of that minute are not looked at (:meth:`ScoreBlock.due`
says which rows to gather values for), as a 1-minute scrape of a gauge would see it. The
detector's memories are minutes to weeks, so it loses nothing it could use, and a GPU
sampled every 10 s costs a sixth of the work (a service instance's window closes, a
minute apart or more, are each scored).

>>> import numpy as np
>>> block = ScoreBlock(("util", "temp"))
>>> block.grow(4)
>>> for i in range(3):
...     _ = block.update(np.array([2]), np.array([60.0 * i]), np.array([[50.0, 60.0]]))
>>> block.learnt(2)  # one update a minute
3
>>> _ = block.update(np.array([2]), np.array([150.0]), np.array([[70.0, 60.0]]))
>>> block.learnt(2)  # the same minute as 120 s: not looked at
3
>>> block.scores(np.array([0, 2]))["util_score"].tolist()  # row 0 never scored: NaN
[nan, 0.0]
>>> block.release(np.array([2]))
>>> block.slots
0
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ragwatch.advisor import MIN_SCORE
from ragwatch.catalog import (
    ANOMALOUS_DIRECTION,
    ANOMALOUS_MOVE,
    ANOMALOUS_SCORE,
    CORROBORATION_GROUP,
    EVIDENCE,
    EXPLAINED_BY,
    LOAD,
    NOT_CORROBORATING,
    PEAK_S,
    SCORE_FIELDS,
    SCORE_SUMMARY,
    SCORED_ABOVE_ONLY,
)
from ragwatch.detectors.generic import GenericBank, GenericParams
from ragwatch.detectors.generic.bank import plain_list
from ragwatch.detectors.generic.params import VERSION
from ragwatch.schema import AnomalyFact

log = logging.getLogger(__name__)
F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
Rows = npt.NDArray[np.intp]
Bools = npt.NDArray[np.bool_]
FIELDS = SCORE_FIELDS[:-1]  # kept in float32 per bank row; the peak's time in float64
SCORE, YHAT, LOWER, UPPER, VALUE, PEAK, PEAK_VALUE, PEAK_YHAT = range(len(FIELDS))
HELD = len(FIELDS)  # and the held score, once held SUSTAIN_S (anomalous_signals counts it)
WIDTH = HELD + 1
SUSTAIN_S = 300.0  # a signal counts as anomalous once out of its band this long: not a burst
EVERY_S = 60.0  # a series is scored at most once a minute of event time (its mean since)
MAX_FACTS = 6  # the anomalous signals a series' facts carry to hints, at most
UP = np.ones(1, dtype=np.int_)  # a direction: above the expected value (_material)


class Checked(NamedTuple):
    """A row's dump loaded apart (:meth:`ScoreBlock.check`), to adopt."""

    bank: GenericBank
    last: F32
    peak_ts: F64
    held_since: F64


def score_names(names: Sequence[str]) -> tuple[str, ...]:
    """The signals a rule reads the scores of ``names`` by: ``<name>_score``, and the
    summary of them all (:data:`~ragwatch.catalog.SCORE_SUMMARY`)."""
    return (*(f"{n}_score" for n in names), *SCORE_SUMMARY)


class RowBands(Mapping[str, "list[float | None]"]):
    """One row's scored signals, as :meth:`ScoreBlock.scored` has them, each read when
    asked (``first``: the row's first bank row, -1: the row is not scored)."""

    __slots__ = ("_block", "_first")

    def __init__(self, block: ScoreBlock, first: int) -> None:
        self._block, self._first = block, first

    def __getitem__(self, name: str) -> list[float | None]:
        j = self._block.index.get(name)
        got = None if j is None or self._first < 0 else self._block._field_row(self._first + j)
        if got is None:
            raise KeyError(name)
        return got

    def __iter__(self) -> Iterator[str]:
        if self._first < 0:
            return iter(())
        at = self._block.peak_ts[self._first : self._first + self._block.k]
        return iter([n for n, a in zip(self._block.names, at.tolist(), strict=True) if a == a])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ScoreBlock:
    """The scores of ``names``, the signals of one kind of series, over a pipeline's rows
    (see the module docstring). ``params``: the generic detector's (its defaults if
    None); ``on`` False: nothing is scored (every score is NaN, no value); ``every_s``:
    a series is scored at most once in each span of this many event-time seconds."""

    def __init__(
        self,
        names: Sequence[str],
        params: GenericParams | None = None,
        *,
        on: bool = True,
        every_s: float = EVERY_S,
    ) -> None:
        self.on = on  # False: nothing is scored (RAGWATCH_SCORE_SIGNALS=false)
        self.every_s = every_s
        self.names = tuple(names)
        self.k = len(self.names)
        self.counted = np.array([n not in NOT_CORROBORATING for n in self.names])
        groups = [CORROBORATION_GROUP.get(n, n) for n in self.names]
        kinds = sorted({g for g, c in zip(groups, self.counted, strict=True) if c and g})
        # (k, groups): which group each counted signal is of (anomalous_signals counts groups)
        self.groups = np.array(
            [
                [c and g == kind for kind in kinds]
                for g, c in zip(groups, self.counted, strict=True)
            ],
            dtype=np.float64,
        ).reshape(self.k, len(kinds))
        self.direction = np.array([ANOMALOUS_DIRECTION.get(n, 0) for n in self.names])
        self.above_only = np.array([n in SCORED_ABOVE_ONLY for n in self.names])
        # (column, its tests) of each signal that counts only with evidence (EVIDENCE), and
        # (column, signal, bound) of each that a signal from a bound on explains (EXPLAINED_BY)
        self._tests = [(j, EVIDENCE[n]) for j, n in enumerate(self.names) if n in EVIDENCE]
        self._explained = [(j, *EXPLAINED_BY[n]) for j, n in enumerate(self.names)
                           if n in EXPLAINED_BY]  # fmt: skip
        # the signals :meth:`evidence` reads
        self.evidence_reads = sorted({name for _, bounds in self._tests for name, _ in bounds}
                                     | {name for _, name, _ in self._explained})  # fmt: skip
        self._columns = np.arange(self.k)
        self.index = {n: j for j, n in enumerate(self.names)}
        # (witness columns, moved columns) of the block's load (LOAD), if it has one
        self._load = next(((self._columns_of(w), self._columns_of(m)) for w, m in LOAD
                           if set(w) <= set(self.names)), None)  # fmt: skip
        self.bank = GenericBank(params or GenericParams(), capacity=16 * self.k)
        self.slot: Rows = np.zeros(0, dtype=np.intp)  # per pipeline row (-1: none)
        self.last = np.full((16 * self.k, WIDTH), np.nan, dtype=np.float32)
        self.peak_ts = np.full(16 * self.k, np.nan)
        self.held_since = np.full(16 * self.k, np.nan)  # out of its band since (NaN: not)
        self._free: list[int] = []
        self._taken = 0  # slots ever taken (the free ones among them in _free)
        self.afresh = 0  # snapshots' scores of another build, not adopted (see check)

    @property
    def slots(self) -> int:
        """Rows scored now."""
        return self._taken - len(self._free)

    def nbytes(self) -> int:
        """The memory of the scores (bank and newest values), bytes."""
        arrays = (self.last, self.peak_ts, self.held_since, self.slot)
        return int(self.bank.nbytes() + sum(a.nbytes for a in arrays))

    def grow(self, capacity: int) -> None:
        """The pipeline's rows go up to ``capacity``."""
        old = len(self.slot)
        if capacity > old:
            self.slot = np.concatenate([self.slot, np.full(capacity - old, -1, dtype=np.intp)])

    def release(self, rows: npt.ArrayLike) -> None:
        """The pipeline freed ``rows``: their slots go back (afresh when taken again)."""
        r = np.asarray(rows, dtype=np.intp)
        s = self.slot[r]
        self._free += s[s >= 0].tolist()
        self.slot[r] = -1

    def _take(self, rows: Rows) -> Rows:
        """The slots of ``rows``, taking one for each row without."""
        s = self.slot[rows]
        for i in np.flatnonzero(s < 0).tolist():
            if self._free:
                new = self._free.pop()
            else:
                new, self._taken = self._taken, self._taken + 1
            s[i] = self.slot[rows[i]] = new
            self._fresh(new)
        return s

    def _fresh(self, slot: int) -> None:
        need = (slot + 1) * self.k
        if need > self.bank.capacity:
            self.bank.reserve(max(need, 2 * self.bank.capacity))
        if need > len(self.last):
            more = max(need, 2 * len(self.last)) - len(self.last)
            fresh = np.full((more, WIDTH), np.nan, dtype=np.float32)
            self.last = np.concatenate([self.last, fresh])
            self.peak_ts = np.concatenate([self.peak_ts, np.full(more, np.nan)])
            self.held_since = np.concatenate([self.held_since, np.full(more, np.nan)])
        bank_rows = np.arange(slot * self.k, need)
        self.bank.reset(bank_rows)
        self.last[bank_rows] = np.nan
        self.peak_ts[bank_rows] = self.held_since[bank_rows] = np.nan

    def learnt(self, row: int) -> int:
        """How many values the detector has learnt of row ``row``'s first signal."""
        s = int(self.slot[row]) if row < len(self.slot) else -1
        return 0 if s < 0 else int(self.bank.n[s * self.k])

    def update(
        self, rows: Rows, ts: F64, values: npt.NDArray[np.float64], evidence: Bools | None = None
    ) -> F64:
        """Take the newest value of each signal of ``rows`` (distinct), sampled at
        ``ts``: ``values`` is ``(len(rows), len(names))``, NaN where a signal has no
        value; rows :meth:`due` are scored, then learnt. ``evidence``, as ``values``:
        False where a signal's move may not count in ``anomalous_signals``, however far
        out of its band (:meth:`evidence`; None: all may). Returns the scores and their
        summary, as :meth:`matrix`."""
        if not self.on or not len(rows):
            return np.full((len(rows), self.k + len(SCORE_SUMMARY)), np.nan)
        self.learn(rows, ts, values, evidence)
        return self.matrix(rows)

    def evidence(self, signals: Mapping[str, F64], n: int) -> Bools | None:
        """``(n, len(names))``: where each signal's own tests (:data:`~ragwatch.catalog.
        EVIDENCE`) reached their bounds in ``signals`` (arrays over ``n`` rows; NaN: no
        evidence) and no signal explains its move (:data:`~ragwatch.catalog.EXPLAINED_BY`;
        NaN explains nothing); True for a signal with neither. None: no signal of the
        block has either."""
        if not self._tests and not self._explained:
            return None
        out = np.ones((n, self.k), dtype=np.bool_)
        for j, bounds in self._tests:
            for name, bound in bounds:
                out[:, j] &= np.asarray(signals[name]) >= bound  # NaN: False
        for j, name, bound in self._explained:
            out[:, j] &= ~(np.asarray(signals[name]) >= bound)  # NaN: not explained
        return out

    def due(self, rows: Rows, ts: F64) -> npt.NDArray[np.bool_]:
        """Which of ``rows`` a sample at ``ts`` would be scored for: those in a new span
        of ``every_s`` since they last learnt (any of a series' signals: one that has no
        value never learns, and must not make its series due at every sample), and
        those never scored. None when scoring is off."""
        if not self.on:
            return np.zeros(len(rows), dtype=np.bool_)
        s = self.slot[rows]
        b = self._bank_rows(np.where(s >= 0, s, 0))
        last = np.where(s >= 0, np.fmax.reduce(self.bank.t[b], axis=1), np.nan)
        every = self.every_s
        out: npt.NDArray[np.bool_] = np.floor(ts / every) != np.floor(last / every)  # NaN: due
        return out

    def learn(
        self, rows: Rows, ts: F64, values: npt.NDArray[np.float64], evidence: Bools | None = None
    ) -> None:
        """:meth:`update` without the scores returned."""
        if not self.on or not len(rows):
            return
        due = self.due(rows, ts)
        if not due.all():
            rows, ts, values = rows[due], ts[due], np.asarray(values)[due]
            evidence = None if evidence is None else evidence[due]
        self.learn_due(rows, ts, values, evidence)

    def learn_due(
        self, rows: Rows, ts: F64, values: npt.NDArray[np.float64], evidence: Bools | None = None
    ) -> None:
        """:meth:`learn` of ``rows`` a caller found :meth:`due` already (the GPU path,
        which gathers ``values`` for those rows only)."""
        if self.on and len(rows):
            b = self._bank_rows(self._take(rows)).ravel()
            x, t = np.asarray(values, np.float64).ravel(), np.repeat(ts, self.k)
            self._score(b, t, x, None if evidence is None else evidence.ravel())

    def _score(self, b: Rows, t: F64, x: F64, evidence: Bools | None = None) -> None:
        """Score, then learn, bank rows ``b``'s values ``x`` at ``t`` (``evidence``: per
        bank row, whether its move may count; None: all may)."""
        got, col = self.bank.update(b, t, x), b % self.k
        # memory's normal shape is steps (caching allocators, reloads, batch jobs): the
        # held score would take each for a lasting deviation; its score is the onset's
        # (lasting growth is the leak detector's); some score above their expected value only
        with np.errstate(invalid="ignore"):
            cool = self.above_only[col] & (x < got.yhat)
        score = np.where(self.counted[col], got.score, got.onset)
        got = got._replace(score=np.where(cool, 0.0, score))
        last = self.last
        last[b, SCORE], last[b, YHAT] = got.score, got.yhat
        last[b, LOWER], last[b, UPPER] = got.lower, got.upper
        out = (got.held >= ANOMALOUS_SCORE) & _material(x, got.yhat, self.direction[col])
        if evidence is not None:
            out &= evidence
        if self._load is not None:
            out &= ~self._loaded(x, got.yhat)
        since = self.held_since[b] = np.where(out, np.fmin(self.held_since[b], t), np.nan)
        last[b, VALUE], last[b, HELD] = x, np.where(t - since >= SUSTAIN_S, got.held, 0.0)
        # the peak of the last PEAK_S: a higher score, or the first since it expired
        peak, at = last[b, PEAK], self.peak_ts[b]
        take = ~(got.score < peak) | ~(t - at <= PEAK_S)  # (NaN: none yet)
        taken = b[take]
        last[taken, PEAK], last[taken, PEAK_VALUE] = got.score[take], x[take]
        last[taken, PEAK_YHAT], self.peak_ts[taken] = got.yhat[take], t[take]

    def _columns_of(self, names: tuple[str, ...]) -> Rows:
        return np.array([self.index[n] for n in names if n in self.index], dtype=np.intp)

    def _loaded(self, x: F64, yhat: F64) -> Bools:
        """Per bank row (``x`` and ``yhat`` of whole slots, ``k`` a slot): whether its move
        up is its series' load (:data:`~ragwatch.catalog.LOAD`): every witness up too."""
        assert self._load is not None
        witness, moved = self._load
        xs, ys = x.reshape(-1, self.k), yhat.reshape(-1, self.k)
        up = _material(xs[:, witness], ys[:, witness], UP)
        out = np.zeros(xs.shape, dtype=np.bool_)
        with np.errstate(invalid="ignore"):
            out[:, moved] = np.all(up, axis=1)[:, None] & (xs[:, moved] > ys[:, moved])
        return out.ravel()

    def scores(self, rows: Rows) -> dict[str, F64]:
        """Every ``<name>_score`` of ``rows``, and their summary."""
        return dict(zip(score_names(self.names), self.matrix(rows).T, strict=True))

    def matrix(self, rows: Rows) -> F64:
        """``(len(rows), k + 2)``: each signal's newest score (NaN: not scored), then the
        highest of them and how many are held out of their band by at least
        :data:`~ragwatch.catalog.ANOMALOUS_SCORE` (NaN: the row is not scored)."""
        s = self.slot[rows]
        scored = s >= 0
        b = self._bank_rows(np.where(scored, s, 0))
        score = self.last[b, SCORE].astype(np.float64)  # (rows, k)
        if not scored.all():
            score[~scored] = np.nan
        return _with_summary(score, self.last[b, HELD], scored, self)

    def _bank_rows(self, slots: Rows) -> Rows:
        """``(len(slots), k)``: the bank rows of each slot's signals."""
        out: Rows = slots[:, None] * self.k + self._columns
        return out

    def scored(self, row: int) -> dict[str, list[float | None]]:
        """What status shows of row ``row``'s scored signals: ``{signal: [score, yhat,
        lower, upper, value, peak, peak_value, peak_yhat, peak_ts]}``
        (:data:`~ragwatch.catalog.SCORE_FIELDS`; None: no value), each signal that has
        been scored."""
        return dict(self.bands(row))

    def bands(self, row: int) -> Mapping[str, list[float | None]]:
        """:meth:`scored`, each signal read when asked (a chart reads one)."""
        s = int(self.slot[row]) if row < len(self.slot) else -1
        return RowBands(self, s * self.k if s >= 0 else -1)

    def _field_row(self, b: int) -> list[float | None] | None:
        """Bank row ``b``'s :meth:`scored` entry (None: never scored)."""
        at = float(self.peak_ts[b])
        if at != at:
            return None
        return [_round(v) for v in self.last[b, :HELD].tolist()] + [at]

    def anomalous(
        self, rows: Sequence[int], wheres: Sequence[str], min_score: float = MIN_SCORE
    ) -> list[AnomalyFact]:
        """The signals of ``rows`` (the series ``wheres`` names, in words) whose peak of
        the last hour reached ``min_score``, as facts (highest first, at most
        ``MAX_FACTS``)."""
        r = np.asarray(rows, dtype=np.intp)
        s = self.slot[r] if len(r) else r
        have = np.flatnonzero(s >= 0)
        if not len(have):
            return []
        b = self._bank_rows(s[have]).ravel()
        peak = self.last[b, PEAK].astype(np.float64)
        hit = np.flatnonzero(peak >= min_score)
        hit = hit[np.argsort(-peak[hit], kind="stable")][:MAX_FACTS]
        out = []
        for i in hit.tolist():
            bi, where = b[i], wheres[int(have[i // self.k])]
            value, yhat = (_round(float(self.last[bi, c])) for c in (PEAK_VALUE, PEAK_YHAT))
            at = float(self.peak_ts[bi])
            out.append(AnomalyFact(where, self.names[i % self.k], float(peak[i]), value, yhat, at))
        return out

    def dump(self, row: int) -> dict[str, Any] | None:
        """Row ``row``'s detector state and newest scores (None: not scored), plain data
        for a snapshot."""
        return self.dump_many([row])[0]

    def dump_many(self, rows: Sequence[int]) -> list[dict[str, Any] | None]:
        """:meth:`dump` of each of ``rows``, read together (a host's, a service's)."""
        s = self.slot[np.asarray(rows, dtype=np.intp)] if len(rows) else np.zeros(0, np.intp)
        have = np.flatnonzero(s >= 0)
        b = self._bank_rows(s[have]).ravel()
        bank = self.bank.dump(b)
        parts = {n: v for n, v in bank.items() if isinstance(v, list)}
        last = plain_list(self.last[b])
        peak_ts, since = plain_list(self.peak_ts[b]), plain_list(self.held_since[b])
        out: list[dict[str, Any] | None] = [None] * len(rows)
        for i, at in enumerate(have.tolist()):
            part = slice(i * self.k, (i + 1) * self.k)
            out[at] = {
                "names": list(self.names),
                "bank": {**bank, **{n: v[part] for n, v in parts.items()}},
                "last": last[part],
                "peak_ts": peak_ts[part],
                "held_since": since[part],
            }
        return out

    def check(self, state: Any) -> Checked | None:
        """A :meth:`dump` loaded apart (None for None); ValueError if it is not one (other
        shapes, missing parts): a snapshot is checked whole before a row changes. The
        scores of another build (other signals, another version of the detector's state
        or other parameters) are None, counted in :attr:`afresh`: those signals are learnt
        again (hours), and the rest of the snapshot (a leak's evidence) is kept."""
        if state is None:
            return None
        if not isinstance(state, Mapping):
            raise ValueError("scores: not a mapping")
        bank = state.get("bank")
        if (
            list(state.get("names") or ()) != list(self.names)
            or not isinstance(bank, Mapping)
            or bank.get("version") != VERSION
            or bank.get("params") != self.bank.params.as_dict()
        ):
            self.afresh += 1
            if self.afresh == 1:  # (one line, not one a series)
                log.info("scores of %s in a snapshot of another build: learnt afresh", self.names)
            return None
        probe = GenericBank(self.bank.params, capacity=self.k)
        try:
            probe.load(np.arange(self.k), state["bank"])
            last = np.array(state["last"], dtype=np.float32).reshape(self.k, WIDTH)
            peak_ts = np.array(state["peak_ts"], dtype=np.float64).reshape(self.k)
            since = np.array(state["held_since"], dtype=np.float64).reshape(self.k)
        except (AttributeError, KeyError, TypeError) as exc:
            raise ValueError(f"scores: {exc}") from None
        return Checked(probe, last, peak_ts, since)

    def adopt(self, row: int, checked: Checked | None) -> None:
        """Row ``row`` from a :meth:`check` ed dump (None: not scored, nothing to do)."""
        if checked is None:
            return
        probe, last, peak_ts, since = checked
        s = int(self._take(np.array([row], dtype=np.intp))[0])
        at = np.arange(s * self.k, (s + 1) * self.k)
        self.bank.load(at, probe.dump(np.arange(self.k)))
        self.last[at], self.peak_ts[at], self.held_since[at] = last, peak_ts, since


def _material(x: F64, yhat: F64, direction: npt.NDArray[np.int_]) -> npt.NDArray[np.bool_]:
    """Whether ``x`` is off its expected value by :data:`~ragwatch.catalog.ANOMALOUS_MOVE`
    of it at least (any move of an expected 0), in its ``direction`` (+1 above, -1 below,
    0 either: :data:`~ragwatch.catalog.ANOMALOUS_DIRECTION`)."""
    with np.errstate(invalid="ignore"):
        move = x - yhat
        out: npt.NDArray[np.bool_] = np.abs(move) >= ANOMALOUS_MOVE * np.abs(yhat)
        out &= (direction == 0) | (np.sign(move) == direction)
    return out


def _with_summary(score: F64, held: F64, scored: npt.NDArray[np.bool_], block: ScoreBlock) -> F64:
    """``score`` with two columns more, of the block's ``counted`` columns (those that
    corroborate each other): the highest score of each row, and how many of its groups
    (:data:`~ragwatch.catalog.CORROBORATION_GROUP`: one quantity seen several ways counts
    once) have a signal *held* out of its band by at least
    :data:`~ragwatch.catalog.ANOMALOUS_SCORE` (a deviation from the rhythm, not the news of
    a burst). Both NaN where a row is not ``scored``; 0 without a counted column."""
    n, k = score.shape
    out = np.empty((n, k + 2))
    out[:, :k] = score
    mine = score[:, block.counted]
    # the highest counted score (0: none scored yet): NaN > 0 is False
    out[:, k] = np.where(mine > 0, mine, 0.0).max(axis=1) if mine.shape[1] else 0.0
    out[:, k + 1] = (((held >= ANOMALOUS_SCORE) @ block.groups) > 0).sum(axis=1)  # NaN: not
    out[~scored, k:] = np.nan
    return out


def _round(v: float) -> float | None:
    """A float32's value as status shows it (None: NaN, no value)."""
    return None if v != v else float(f"{v:.6g}")
