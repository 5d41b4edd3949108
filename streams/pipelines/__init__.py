"""Signal pipelines: telemetry envelopes in, signals and alert transitions out.

One module per kind of telemetry (:mod:`.gpu`, :mod:`.requests`, :mod:`.metrics`,
:mod:`.events`), the evidence windows and the series budget they share, the root-cause
hints, the chart points, and :mod:`.fleet` (``Pipelines``: all of them behind one
``process``). May import the core, the detectors and :mod:`ragwatch.streams.alerting`;
never Kafka, Faust or Redis.
"""
