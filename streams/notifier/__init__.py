"""``ragwatch notify``: alerts topic in, notifications out to receivers.

:mod:`.service` (the process), :mod:`.routing` (routes, receivers, inhibition),
:mod:`.grouping`, :mod:`.outbox` (what is due, in Redis), :mod:`.notification` (what a
receiver is asked to deliver), :mod:`.delivery` (what every sender shares) and one module
per receiver: :mod:`.slack`, :mod:`.pagerduty`, :mod:`.webhook`. Imports only the core:
never the worker, the pipelines or the alerting.
"""
