"""The real service with the stub engine at a set pace, for tests where timing is the point.

``python -m tests.support.stub_server`` reads the usual settings from the environment, plus
``STUB_TOKEN_DELAY_S`` (seconds per token) and, optionally, ``STUB_RTT_MS``: the round-trip time
every connection is said to have (for ``"coalesce": "auto"``; without it, the kernel's), and
``STUB_TEXT``: the text the engine repeats (its default holds Chinese characters, three tokens
each, sent as one event once whole; an ASCII text makes every token an event), and
``STUB_SLOW_QUERY_S``: how long the embedding of a search query holding ``(slow)`` takes (a
retrieval a test can kill the process in), and ``STUB_REQUEST_LOG``: a file each engine request's
sampling is appended to (tests/support/fakes.py, ``RecordingStubEngine``). Tokens are bytes
(``ByteTokenizer``), so a stream's length in tokens, and so its duration, is known in advance on
any machine.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import uvicorn

from rag_stream.app import create_app
from rag_stream.cli import uvicorn_options
from rag_stream.generation.engine import Engine
from rag_stream.preflight import migrate
from rag_stream.retrieval.embedder import Embedder, load_embedder
from rag_stream.settings import Settings, load_settings
from tests.support.fakes import RecordingStubEngine, stub_engine
from tests.support.slow_embedder import SlowEmbedder


def main() -> None:
    settings = load_settings()
    # the service's own loggers at the configured level, as `rag-stream serve` sets them up
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    migrate(settings)
    delay = float(os.environ.get("STUB_TOKEN_DELAY_S", "0"))
    text = os.environ.get("STUB_TEXT")

    request_log = os.environ.get("STUB_REQUEST_LOG")

    async def paced(_: Settings) -> Engine:
        options: dict[str, Any] = {"delay_s": delay, **({"text": text} if text else {})}
        if request_log:
            return RecordingStubEngine(request_log, **options)
        return stub_engine(**options)

    slow_s = float(os.environ.get("STUB_SLOW_QUERY_S", "0"))

    async def embedder(settings: Settings) -> Embedder:
        inner = await load_embedder(
            settings.resolved_embedder,
            batch_size=settings.ingest.embed_batch_size,
            backend=settings.embedder_backend,
        )
        return SlowEmbedder(inner, slow_s, marker="(slow)") if slow_s else inner

    rtt = os.environ.get("STUB_RTT_MS")
    if rtt is None:
        app = create_app(settings, engine_factory=paced, embedder_factory=embedder)
    else:
        app = create_app(
            settings,
            engine_factory=paced,
            embedder_factory=embedder,
            rtt_source=lambda _scope: float(rtt),
        )
    uvicorn.run(app, **uvicorn_options(settings))  # as `rag-stream serve` runs it


if __name__ == "__main__":
    main()
