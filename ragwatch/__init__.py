"""ragwatch: Kafka-native anomaly detection for GPU fleets serving LLM / RAG traffic.

The shared core lives here: the event schema (:mod:`ragwatch.schema`) and its codec
(:mod:`ragwatch.codec`), the settings object (:mod:`ragwatch.config`), the error tree
(:mod:`ragwatch.errors`), the embedded dev stack and the CLI. The subpackages
``ragwatch.agents``, ``ragwatch.streams`` and ``ragwatch.detectors`` hold the node agents,
the Faust workers and the pure-Python detectors.
"""

__version__ = "0.1.0"
