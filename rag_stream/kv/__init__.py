"""KV-cache snapshots in Redis: a vLLM KV connector and its settings glue.

``connector`` is loaded by vLLM inside its engine processes (it imports vLLM and torch);
``config`` and ``metrics`` are light and used by the service.
"""
