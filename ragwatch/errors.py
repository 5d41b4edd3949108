"""The one error tree of ragwatch.

Argument checks raise plain ``ValueError``; everything ragwatch itself decides is wrong
raises a subclass of :class:`RagwatchError`.
"""

from __future__ import annotations


class RagwatchError(Exception):
    """Base class of every error ragwatch raises on purpose."""


class ConfigError(RagwatchError):
    """A setting, a rules file or a missing binary stops ragwatch from starting."""


class SchemaError(RagwatchError, ValueError):
    """A message does not follow the wire format; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SinkError(RagwatchError):
    """A sink (Redis, a webhook, a topic) refused or failed a write."""
