"""The order the test files are handed to pytest-xdist's workers, and the timings behind it.

``make test`` runs the files on four workers, a file each at a time (``--dist loadfile``,
``--no-loadscope-reorder``: in the order this hook leaves them). Two kinds of file share
the 2 cores: *busy* ones replay telemetry through the pipelines and use a core throughout;
*waiting* ones (marked ``integration``) start a worker against a real broker and Redis and
spend most of their time waiting on them (the integration tests alone: 356 s on three
workers for 280 s of CPU). pytest-xdist's own order, most tests first, leaves the waiting
files, with a test or two each, to the end: three busy files then share two cores for ten
minutes, and three waiting ones leave the cores half idle for the last four.
:func:`schedule` interleaves the two kinds in proportion to their time, longest first
within each, so that a waiting file runs beside busy ones all along (the parallel part:
696 s on three workers against 842 s in xdist's order; 636 s on four, where xdist's order
had been slower on four than on three).

The times are ``tests/durations.json`` (seconds a file took, setup and teardown included),
written by ``make durations`` (``pytest --write-durations tests/durations.json``: this
run's files replaced, files gone dropped). A file not in it counts as :data:`UNKNOWN_S`.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 5.0  # a file not timed yet (a new one)


def schedule(seconds: dict[str, float], waiting: set[str]) -> list[str]:
    """The files of ``seconds`` in the order to hand them out: the busy ones and the
    ``waiting`` ones each longest first (ties by name), merged so that each kind has used
    the same share of its total time at every point (the next file is of the kind further
    behind).

    >>> schedule({"a": 9.0, "b": 1.0, "c": 4.0, "w": 6.0, "v": 2.0}, {"w", "v"})
    ['a', 'w', 'c', 'v', 'b']
    """
    kinds = [sorted((f for f in seconds if (f in waiting) is w), key=lambda f: (-seconds[f], f))
             for w in (False, True)]  # fmt: skip
    totals = [sum(seconds[f] for f in k) or 1.0 for k in kinds]
    done, out = [0.0, 0.0], []
    while kinds[0] or kinds[1]:
        behind = [done[i] / totals[i] if kinds[i] else math.inf for i in (0, 1)]
        i = behind.index(min(behind))  # busy on a tie
        f = kinds[i].pop(0)
        done[i] += seconds[f]
        out.append(f)
    return out


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _times(path: Path) -> dict[str, float]:
    """The recorded times in ``path`` (none if it does not exist)."""
    return dict(json.loads(path.read_text())) if path.exists() else {}


@pytest.hookimpl(trylast=True)  # after tests/integration/conftest.py marked its tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    known = _times(DURATIONS)
    files = {f: known.get(f, UNKNOWN_S) for f in (_file(item.nodeid) for item in items)}
    waiting = {_file(i.nodeid) for i in items if i.get_closest_marker("integration")}
    rank = {f: n for n, f in enumerate(schedule(files, waiting))}
    items.sort(key=lambda item: rank[_file(item.nodeid)])  # stable: a file's own order kept


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-durations",
        metavar="PATH",
        help="record each test file's time (setup, call, teardown) into this JSON file",
    )


class _Timer:
    """Sums each file's test phases as their reports reach the process that reports them
    (the controller under xdist), and writes them at the end."""

    def __init__(self, path: Path) -> None:
        self.path, self.seconds = path, defaultdict[str, float](float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_file(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        new = {**_times(self.path), **{f: round(s, 1) for f, s in self.seconds.items()}}
        root = Path(__file__).parent.parent
        kept = {f: s for f, s in sorted(new.items()) if (root / f).exists()}
        self.path.write_text(json.dumps(kept, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--write-durations")
    if path and not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(_Timer(Path(path)), "ragwatch-durations")
