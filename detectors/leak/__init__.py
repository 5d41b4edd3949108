"""The leak detector: :class:`LeakBank` (many series in arrays, the one implementation) and
:class:`LeakDetector` (one series, a one-row view with river's protocol)."""

from ragwatch.detectors.leak.bank import (
    GB,
    ROUNDING,
    LeakBank,
    LeakEstimate,
    LeakParams,
    theil_sen,
)
from ragwatch.detectors.leak.view import LeakDetector

__all__ = [
    "GB",
    "ROUNDING",
    "LeakBank",
    "LeakDetector",
    "LeakEstimate",
    "LeakParams",
    "theil_sen",
]
