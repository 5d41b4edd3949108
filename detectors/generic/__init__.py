"""The generic streaming detector: :class:`GenericBank` (many series in arrays, the one
implementation; its module says what it detects) and :class:`GenericDetector` (one series,
a one-row view with river's protocol)."""

from ragwatch.detectors.generic.bank import GenericBank, Scored
from ragwatch.detectors.generic.params import GenericParams
from ragwatch.detectors.generic.view import GenericDetector

__all__ = ["GenericBank", "GenericDetector", "GenericParams", "Scored"]
