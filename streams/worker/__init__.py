"""``ragwatch worker``: the Faust app that feeds the pipelines.

:mod:`.loop` (``WorkerLoop``: every message, rebalance and tick, and the checkpoint
order), :mod:`.topics` (the input topic table), :mod:`.batches` (a batch of the messages
at hand), :mod:`.app` (the Faust app and its Redis side, ``Delivery``),
:mod:`.acks` (offsets committed only behind snapshots), :mod:`.marks` (sweep marks per
partition), :mod:`.snapshot` (host and service state in Redis), :mod:`.transport` (the
fetch wait), :mod:`.main` (run until SIGTERM). Imports the core, the pipelines and the
alerting; never the notifier.
"""
