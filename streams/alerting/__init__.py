"""Rules and the alert engine: the rule format (:mod:`.rules`, the shipped
``default_rules.yaml``) and the state machine of alerts in event time (:mod:`.engine`).
Imports only the core.
"""
