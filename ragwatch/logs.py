"""Logging a problem that may repeat thousands of times without flooding the log.

>>> import logging, sys
>>> log = logging.getLogger("example")
>>> log.addHandler(logging.StreamHandler(sys.stdout)); log.propagate = False
>>> for n in range(1, 2001):
...     log_sometimes(log, n, "record dropped: %s", "queue full")  # doctest: +ELLIPSIS
record dropped: queue full (1 so far)
...
record dropped: queue full (10 so far)
record dropped: queue full (1000 so far)
record dropped: queue full (2000 so far)
"""

from __future__ import annotations

import logging


def log_sometimes(
    logger: logging.Logger, n: int, msg: str, *args: object, exc_info: bool = False
) -> None:
    """Warn about the ``n``-th occurrence of a problem: the first ten, then every
    thousandth, each with its count so far."""
    if n <= 10 or n % 1000 == 0:
        logger.warning(msg + " (%d so far)", *args, n, exc_info=exc_info)
