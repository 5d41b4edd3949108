"""``ragwatch worker``: the Faust app that feeds the pipelines.

:mod:`.app` (topics, the per-message loop, the timer), :mod:`.acks` (offsets committed
only behind snapshots), :mod:`.marks` (sweep marks per partition), :mod:`.snapshot`
(host and service state in Redis), :mod:`.transport` (the fetch wait), :mod:`.main`
(run until SIGTERM). Imports the core, the pipelines and the alerting; never the notifier.
"""
