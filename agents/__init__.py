"""The agents: what runs on GPU hosts and in RAG services, with a minimal install.

Sources (:mod:`.nvml`, :mod:`.prom` with :mod:`.prom_map`, the simulators :mod:`.sim`,
:mod:`.sim_requests`, :mod:`.scenario`), the SDK (:mod:`.sdk`), the publisher with its
spool (:mod:`.publisher`, :mod:`.spool`) and the runner. Imports the core only: never
``ragwatch.streams``, Faust, river or Redis.
"""
