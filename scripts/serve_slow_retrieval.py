"""The real service with retrieval made slower, as with a remote embedding service.

Used by scripts/bench_answers.py (variant c): every embedding call waits SLOW_RETRIEVAL_MS
first, so each answer's retrieval takes that much longer while the stable prompt prefills.
The delay is injected here, through create_app's embedder factory (tests/support/slow_embedder.py),
not by the service.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rag_stream.app import create_app
from rag_stream.preflight import preflight
from rag_stream.retrieval.embedder import Embedder, load_embedder
from rag_stream.settings import Settings, load_settings
from tests.support.slow_embedder import SlowEmbedder


def main() -> None:
    settings = load_settings()
    preflight(settings)
    delay_s = float(os.environ.get("SLOW_RETRIEVAL_MS", "0")) / 1000

    async def slow(s: Settings) -> Embedder:
        inner = await load_embedder(s.resolved_embedder)
        return SlowEmbedder(inner, delay_s)

    app = create_app(settings, embedder_factory=slow)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)


if __name__ == "__main__":
    main()
