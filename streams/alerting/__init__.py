"""Rules and the alert engine: the signal catalog (:mod:`.catalog`: every signal and label
of each kind of series, declared once), the rule format (:mod:`.rules`, the shipped
``default_rules.yaml``) and the state machine of alerts in event time (:mod:`.engine`).
Imports only the core.
"""
