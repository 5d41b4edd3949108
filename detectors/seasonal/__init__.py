"""The seasonal baseline: :class:`SeasonalBank` (many series in arrays, the one
implementation) and :class:`SeasonalBaseline` (one series, a one-row view with river's
protocol); :mod:`~.view` describes what it models."""

from ragwatch.detectors.seasonal.bank import SeasonalBank
from ragwatch.detectors.seasonal.params import DAY, DAY_LIMIT, SeasonalParams
from ragwatch.detectors.seasonal.view import Forecast, Relearned, SeasonalBaseline

__all__ = [
    "DAY",
    "DAY_LIMIT",
    "Forecast",
    "Relearned",
    "SeasonalBank",
    "SeasonalBaseline",
    "SeasonalParams",
]
