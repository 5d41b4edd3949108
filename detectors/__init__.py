"""Pure-Python online detectors with river's protocol: ``learn_one(x)`` / ``score_one(x)``.

Nothing here imports Kafka, Faust, Redis or the other ragwatch rooms. ``x`` is a dict
with ``"value"`` (float) and ``"t"`` (event time, epoch seconds); scores are floats in
``[0, 1]``, higher = more anomalous. Build detectors by name:

>>> from ragwatch.detectors import make
>>> det = make("leak", window_s=7200)
>>> det.score_one({"value": 1e9, "t": 0.0})
0.0
"""

from ragwatch.detectors.base import REGISTRY, Detector, make, score_then_learn

__all__ = ["REGISTRY", "Detector", "make", "score_then_learn"]
