"""A Python client for rag-stream's HTTP API, sync (``Client``) and async (``AsyncClient``).

Every endpoint answers with the server's own pydantic models (``rag_stream.schemas``); an error
answer raises the server's typed error (``rag_stream.errors``: ``NotFound``,
``InvalidRequest``, ... with ``status_code``, ``code`` and ``message``). ``ask``, ``generate``,
``follow`` and ``follow_job`` yield the stream's typed events and resume by themselves after a
dropped connection, so the caller sees one stream with ids 0, 1, 2, ...::

    from rag_stream.client import Client

    with Client() as client:
        for event in client.ask("docs", "How do I resume a stream?"):
            if event.type == "token":
                print(event.text, end="", flush=True)

Chat completions (``/v1/chat/completions``) are left to the ``openai`` SDK. This package
imports nothing from the server but its schemas and errors.
"""

from rag_stream.client.async_client import AsyncClient
from rag_stream.client.async_stream import AsyncEventStream
from rag_stream.client.calls import Readiness
from rag_stream.client.errors import StreamInterrupted
from rag_stream.client.options import Reconnect, RetryPolicy
from rag_stream.client.sync_client import Client
from rag_stream.client.sync_stream import EventStream

__all__ = [
    "AsyncClient",
    "AsyncEventStream",
    "Client",
    "EventStream",
    "Readiness",
    "Reconnect",
    "RetryPolicy",
    "StreamInterrupted",
]
