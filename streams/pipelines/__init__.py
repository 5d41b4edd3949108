"""Signal pipelines: telemetry envelopes in, signals and alert transitions out.

:mod:`.base` is the seam (``SignalPipeline``: domain, watermark, sweep mark, ``forget``,
``dump`` / ``adopt``, ``status``, ``charts``; the host | service domain and who owns an
alert). One module per kind of telemetry (:mod:`.gpu`, :mod:`.requests`, :mod:`.metrics`,
:mod:`.events`), the evidence windows and the series budget they share, the root-cause
hints (:mod:`.hints`), the chart points (:mod:`.charts`), and :mod:`.fleet` (``Pipelines``:
all of them behind one ``process``, looping over the seam). May import the core, the
detectors and :mod:`ragwatch.streams.alerting`; never Kafka, Faust or Redis.
"""
