"""Rules and the alert engine: the rule format (:mod:`.rules`, the shipped
``default_rules.yaml``; the signals a rule may name are the core's catalog,
:mod:`ragwatch.catalog`) and the state machine of alerts in event time (:mod:`.engine`).
Imports only the core.
"""
