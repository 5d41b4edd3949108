"""The two stream processes: the worker and the notifier.

- :mod:`~ragwatch.streams.pipelines`: signal pipelines, one per kind of telemetry (GPU,
  requests, engine metrics, device events) and the fleet of them, with their hints and
  chart points. Pure: no Kafka, Faust or Redis.
- :mod:`~ragwatch.streams.alerting`: rules (the shipped ``default_rules.yaml``) and the
  alert engine (``for``, ``keep_firing_for``, resolve) in event time.
- :mod:`~ragwatch.streams.worker`: the Faust app (``ragwatch worker``): topics in,
  pipelines, snapshots and acks, transitions out to the alerts topic and Redis.
- :mod:`~ragwatch.streams.notifier`: ``ragwatch notify``: routing, grouping, silences,
  the outbox and one module per receiver. It imports only the core, never the worker.

Data flows one way: pipelines -> alerting -> worker -> (alerts topic) -> notifier.
"""
