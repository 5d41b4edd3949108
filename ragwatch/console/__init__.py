"""What people look at: ``ragwatch status`` (:mod:`.status`, :mod:`.status_view`),
``ragwatch serve`` (:mod:`.serve`: the HTTP API, ``/metrics`` via :mod:`.exporter`, the
OpenAPI document in :mod:`.openapi`, the live page in ``web/``). Reads Redis through
:mod:`ragwatch.store` only; imports nothing from ``ragwatch.streams``.
"""
