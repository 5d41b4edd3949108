"""A service's request outliers: its outlier detector, its clusters, and news of a new one.

The instances of a service share one :class:`~ragwatch.detectors.request_outliers.
RequestOutliers` over the ``(context_tokens, output_tokens)`` of their ``ok`` records
(errors are counted by ``errors_ratio`` and would otherwise form a cluster of their own),
each record scored before it is learned (:meth:`ServiceClusters.score`). At a bucket's
close the request pipeline asks :meth:`ServiceClusters.new_cluster` whether a cluster of at
least ``new_cluster_size`` core points and 1 % of the window appeared more than 4 eps from
every cluster of the previous check (once the window holds 200 points), made of requests
unusual for the service; the news goes to the instance whose records landed away from
the known clusters most. While that cluster lasts, the records landing in its cells are
counted apart (``clustered``).

Unusual for the service, not only for the window: real traffic comes in bursts and its
mix shifts through the day, so a kind of request the window has not held for an hour
comes back as a dense new cluster many times a day. Each record learnt goes into the
service's :class:`~ragwatch.detectors.request_shapes.ShapeMemory` (decayed counts of shapes
over days; at the bucket's close, where it settles an hour later, so a new kind of request
cannot vouch for itself while it gathers), and a new cluster is news only when fewer than
``FAMILIAR_SHARE`` of its core points have shapes familiar to that memory. Until
``MIN_MASS`` requests have settled (a fresh service, or a snapshot from before the memory)
clusters are judged by their distance alone, as before.

Scoring is the request path's hot loop. The records of a run are first *certified*
together (:meth:`~ragwatch.detectors.request_outliers.RequestOutliers.certified`: those
whose sequential score is 0.0 by density, found with array operations) and learnt in
blocks (``learn_points``); only the others are scored one at a time, with the same
scores, labels and window as scoring every record in turn.

>>> from ragwatch.detectors.request_outliers import RequestOutliers
>>> svc = ServiceClusters(RequestOutliers(), "rag")
>>> pts = [(3000.0 + i % 7, 250.0 + i % 5) for i in range(300)]
>>> svc.score(pts, ScoredRun()).outliers
0
>>> run = svc.score([(12000.0, 20.0)], ScoredRun())
>>> run.outliers, run.labels.most_common(1)
(1, [('long context, short output', 1)])
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from ragwatch.detectors.request_outliers import REQUEST_FEATURES, Cluster, RequestOutliers
from ragwatch.detectors.request_shapes import ShapeMemory

MAX_LABELS_PER_BUCKET = 20  # label_one sorts the window: label the first few outliers only
CLUSTER_RESCAN = 60  # buckets between scans of a service's clusters without novelty
CLUSTER_ACTIVE_RESCAN = 5  # ... while a flagged cluster lasts (is it still there?)
CLUSTER_SHARE = 0.01  # of the window's points: the smallest cluster that is news
CLUSTER_WARMUP = 200  # points the outlier window holds before a cluster is news
# A cluster most of whose core points are shapes the service's memory knows is a burst or
# a mix shift of known requests, not news (a majority: a known kind with a few stragglers
# is known; a new kind beside a known one, more than half new, is news).
FAMILIAR_SHARE = 0.5
BUCKET_S = 60.0  # the request pipeline's default bucket: event time when none is given
SCATTER_POINTS = 400  # the newest requests the live page's scatter draws
USUAL, AWAY, FLAGGED = 0, 1, 2  # a scatter point: in the clusters, away, in a new one
Point = tuple[float, float]
Key = tuple[int, ...]


@dataclass
class ScoredRun:
    """What scoring a run of records found (added to its bucket's counts): outliers (score
    >= 0.5), their labels (the first ``MAX_LABELS_PER_BUCKET`` of the bucket), novel records
    (away from the known clusters), and per record whether it is the active cluster's."""

    outliers: int = 0
    novel: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    clustered: list[bool] = field(default_factory=list)


@dataclass
class ServiceClusters:
    """Per-service state shared by its instances: the outlier detector and its clusters.
    (Snapshots of version 6 name it ``requests._Service``: the same fields.)"""

    detector: RequestOutliers
    name: str = ""
    instances: set[str] = field(default_factory=set)
    known: list[tuple[float, ...]] = field(default_factory=list)  # previous check's centroids
    checked: int | None = None  # bucket of the previous cluster check
    flag: float = 0.0
    size: float = 0.0  # the new cluster's size, when flagged
    scanned: int | None = None  # bucket of the previous scan of the clusters
    dense: frozenset[tuple[int, ...]] = frozenset()  # the detector's dense cells at that scan
    novel: int = 0  # records outside them since
    active: tuple[float, ...] | None = None  # centroid of the flagged cluster, while it lasts
    active_instance: str | None = None  # the instance it was raised on
    active_label: str | None = None  # what its requests look like ("long context, ...")
    active_cells: frozenset[tuple[int, ...]] = frozenset()  # its cells and their neighbours
    # the shapes served over days; records learnt since the last bucket close, 2 doubles
    # each, that the memory takes at the close (one array operation a bucket, none a record)
    memory: ShapeMemory = field(default_factory=ShapeMemory, compare=False)
    fresh: array[float] = field(default_factory=lambda: array("d"), repr=False, compare=False)

    def memory_state(self) -> dict[str, Any]:
        """The shape memory and the records waiting for it, as plain data."""
        return {"memory": self.memory.dump(), "fresh": self.fresh.tobytes()}

    def restore_memory(self, state: Mapping[str, Any] | None) -> None:
        """:meth:`memory_state`'s data back; None (a snapshot from before the memory)
        leaves a fresh one. ValueError, with nothing changed, if it does not fit."""
        if state is None:
            self.memory, self.fresh = ShapeMemory(), array("d")
            return
        memory = ShapeMemory.load(state.get("memory"))
        raw = state.get("fresh")
        if not isinstance(raw, bytes | bytearray) or len(raw) % 16:
            raise ValueError("service clusters: fresh records are not pairs of doubles")
        fresh = array("d", np.frombuffer(raw, dtype="<f8").tolist())
        self.memory, self.fresh = memory, fresh

    # -- records --------------------------------------------------------------------------

    def score(self, points: Sequence[Point], run: ScoredRun, labelled: int = 0) -> ScoredRun:
        """Score then learn ``points`` (the ``ok`` records of a run, in order), adding to
        ``run``; ``labelled``: outliers of the bucket before this run (labels stop at
        ``MAX_LABELS_PER_BUCKET``)."""
        det = self.detector
        self.fresh.extend(chain.from_iterable(points))
        i = 0
        while i < len(points) and det.features != REQUEST_FEATURES:  # the first picks them
            self._one(points[i], det.cell(points[i]), run, labelled, first=True)
            i += 1
        if i == len(points):
            return run
        rest = points[i:] if i else points
        keys = det.cells(rest)
        ok = det.certified(np.asarray(rest, dtype=np.float64))
        active, dense = self.active_cells, self.dense
        run.clustered.extend([k in active for k in keys])
        novel = sum(1 for k in keys if k not in dense)
        self.novel += novel
        run.novel += novel
        flags = ok.tolist()
        j = 0
        while j < len(rest):
            if flags[j]:  # a block of certified points: learnt together
                e = j + 1
                while e < len(rest) and flags[e]:
                    e += 1
                det.learn_points(np.asarray(rest[j:e], dtype=np.float64), keys[j:e])
                j = e
                continue
            self._score_one(rest[j], keys[j], run, labelled)
            det.learn_point(rest[j], keys[j])
            j += 1
        return run

    def _one(self, p: Point, key: Key, run: ScoredRun, labelled: int, first: bool) -> None:
        """A record before the detector picked its features: the dict protocol."""
        det = self.detector
        run.clustered.append(key in self.active_cells)
        x = {"context_tokens": p[0], "output_tokens": p[1], "t": 0.0}
        if det.score_one(x) >= 0.5:
            self._outlier(p, run, labelled)
        det.learn_one(x)
        if key not in self.dense:
            self.novel += 1
            run.novel += 1

    def _score_one(self, p: Point, key: Key, run: ScoredRun, labelled: int) -> None:
        if self.detector.score_point(p, key) >= 0.5:
            self._outlier(p, run, labelled)

    def _outlier(self, p: Point, run: ScoredRun, labelled: int) -> None:
        run.outliers += 1
        if labelled + run.outliers <= MAX_LABELS_PER_BUCKET:
            run.labels[self.detector.label_point(p)] += 1

    # -- clusters -------------------------------------------------------------------------

    def new_cluster(
        self,
        b: int,
        new_cluster_size: int,
        novel_score: Callable[[str], float],
        at: float | None = None,
    ) -> float:
        """Whether a sizeable cluster of shapes unusual for the service appeared far from
        the known clusters (once per bucket).

        Scanning the clusters is the costliest step of the pipeline, so it runs only once
        ``min_samples`` records landed outside the dense cells of the last scan (a new
        cluster far from the known ones is made of such records), every
        ``CLUSTER_ACTIVE_RESCAN`` buckets while a flagged cluster lasts, and every
        ``CLUSTER_RESCAN`` buckets to keep the known clusters current. ``novel_score``:
        an instance's recent novel records (who gets the news); ``at``: the event time of
        bucket ``b``'s end (the memory decays to it; by default ``(b + 1) * BUCKET_S``)."""
        self._remember((b + 1) * BUCKET_S if at is None else at)
        if self.checked == b:
            return self.flag
        self.checked, self.flag = b, 0.0
        since = math.inf if self.scanned is None else b - self.scanned
        due = since >= (CLUSTER_ACTIVE_RESCAN if self.active is not None else CLUSTER_RESCAN)
        if not (self.novel >= self.detector.min_samples or due):
            return 0.0
        self.scanned, self.novel = b, 0
        det = self.detector
        # A cluster must hold 1 % of the window: a fragment of the usual traffic's tail is
        # a few points; before CLUSTER_WARMUP points nothing is news.
        size = max(new_cluster_size, math.ceil(len(det) * CLUSTER_SHARE))
        clusters = [c for c in det.clusters() if c.size >= size]
        if len(det) < CLUSTER_WARMUP:
            self.known = [c.centroid for c in clusters]
            return 0.0
        self.dense = det.around(cell for c in clusters for cell in c.cells)
        far, known = 4 * det.eps, self.known
        new = [
            c
            for c in clusters
            if known and all(math.dist(c.centroid, k) > far for k in known)
            and not self._familiar(c)
        ]  # fmt: skip
        self.flag = 1.0 if new else 0.0
        self.size = float(max(c.size for c in new)) if new else 0.0
        self.known = [c.centroid for c in clusters]
        if new:
            biggest = max(new, key=lambda c: c.size)
            self.active, self.active_cells = biggest.centroid, det.around(biggest.cells)
            self.active_instance = self._novel_instance(novel_score)
            self.active_label = det.describe(self.active)
        elif self.active is not None:  # the flagged cluster lasts while one stays near it
            near = [c for c in clusters if math.dist(c.centroid, self.active) <= far]
            self.active = near[0].centroid if near else None
            self.active_cells = det.around(near[0].cells) if near else frozenset()
        return self.flag

    def _remember(self, at: float) -> None:
        """The records learnt since the last close into the memory, and its clock to
        ``at``."""
        if self.fresh:
            pts, self.fresh = np.frombuffer(self.fresh, dtype=np.float64), array("d")
            self.memory.add(pts.reshape(-1, 2), at)
        self.memory.age(at)

    def scatter(self, n: int = SCATTER_POINTS) -> dict[str, Any]:
        """The newest ``n`` requests of the window as the live page draws them:
        ``[context, output, kind]``, kind :data:`USUAL` (in or next to the cells of the
        clusters of the last scan), :data:`AWAY` (away from them: the outliers) or
        :data:`FLAGGED` (in the new cluster flagged now), and the clusters' centroids.
        A few dict lookups a point: no scan of the clusters.

        >>> from ragwatch.detectors.request_outliers import RequestOutliers
        >>> svc = ServiceClusters(RequestOutliers(), "rag")
        >>> _ = svc.score([(3000.0 + i % 7, 250.0 + i % 5) for i in range(300)], ScoredRun())
        >>> _ = svc.new_cluster(0, 10, lambda inst: 0.0)
        >>> _ = svc.score([(12000.0, 20.0)], ScoredRun())
        >>> view = svc.scatter(3)
        >>> view["points"], view["clusters"]
        ([[3004.0, 253.0, 0], [3005.0, 254.0, 0], [12000.0, 20.0, 1]], [[3003.0, 252.0]])
        """
        det = self.detector
        points = det.points()[-n:] if len(det) else []
        scanned = self.scanned is not None
        out = []
        for p in points:
            cell = det.cell(p)
            kind = FLAGGED if cell in self.active_cells else USUAL
            if kind == USUAL and scanned and cell not in self.dense:
                kind = AWAY
            out.append([*p, kind])
        return {
            "features": list(det.features or REQUEST_FEATURES),
            "points": out,
            "clusters": [[round(v, 1) for v in c] for c in self.known],
            "flagged": None if self.active is None else [round(v, 1) for v in self.active],
            "label": self.active_label,
        }

    def _familiar(self, cluster: Cluster) -> bool:
        """Whether the cluster's requests are of kinds the service has served before."""
        mem = self.memory
        if not (mem.trusted and cluster.points):
            return False
        return float(mem.familiar(cluster.points).mean()) >= FAMILIAR_SHARE

    def _novel_instance(self, novel_score: Callable[[str], float]) -> str | None:
        """The instance whose recent records landed away from the known clusters most."""
        best, name = 0.0, None
        for inst in sorted(self.instances):
            score = novel_score(inst)
            if score > best:
                best, name = score, inst
        return name
