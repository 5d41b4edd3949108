"""``ragwatch worker``: run the Faust app until SIGTERM/SIGINT.

Faust's worker handles the signals: it stops the agents, commits the offsets of what
they processed and closes Redis. Notifications go out from ``ragwatch notify``.
"""

from __future__ import annotations

from ragwatch.config import Settings
from ragwatch.kafka_admin import check_kafka, ensure_topics
from ragwatch.streams.worker.app import build_app


def run_worker(settings: Settings) -> int:
    from faust.worker import Worker

    app = build_app(settings)  # loads the rules first: a bad file fails before any I/O
    check_kafka(settings, "worker")  # one line and exit 2, not seconds of aiokafka retries
    settings.state_subdir("faust")  # an unwritable state dir: one line, exit 2
    ensure_topics(settings, command="worker")
    worker = Worker(app, loglevel=settings.log_level, redirect_stdouts=False, quiet=True)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
