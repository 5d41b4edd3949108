"""The detector protocol and the registry behind :func:`make`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable


@runtime_checkable
class Detector(Protocol):
    """What every ragwatch detector implements (river's anomaly-detector protocol)."""

    def learn_one(self, x: dict[str, Any]) -> None:
        """Update the state with one observation."""

    def score_one(self, x: dict[str, Any]) -> float:
        """Score one observation in [0, 1] without changing the state."""

    def clone(self) -> Detector:
        """A fresh, unfitted detector with the same parameters."""


D = TypeVar("D")
REGISTRY: dict[str, Callable[..., Detector]] = {}


def register(name: str) -> Callable[[D], D]:
    """Class decorator: make a detector buildable as ``make(name, **params)``."""

    def deco(cls: D) -> D:
        if name in REGISTRY:
            raise ValueError(f"detector {name!r} registered twice")
        REGISTRY[name] = cls  # type: ignore[assignment]
        return cls

    return deco


def make(name: str, **params: Any) -> Detector:
    """Build a registered detector by name; unknown names list the known ones."""
    _load_builtin()
    try:
        factory = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown detector {name!r}; known: {known}") from None
    return factory(**params)


def score_then_learn(det: Detector, x: dict[str, Any]) -> float:
    """Score first, then learn, so no point scores itself."""
    score = det.score_one(x)
    det.learn_one(x)
    return score


@functools.cache
def _load_builtin() -> None:
    """Import every module of this package once: their @register decorators fill REGISTRY.
    (Cached: pipelines make a detector per new series, thousands a second on a replay.)"""
    import importlib
    import pkgutil

    import ragwatch.detectors as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "base":
            importlib.import_module(f"ragwatch.detectors.{info.name}")
