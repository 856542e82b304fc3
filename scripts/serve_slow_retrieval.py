"""The real service with retrieval made slower, as with a remote embedding service.

Used by scripts/bench_answers.py (variant c): every embedding call waits SLOW_RETRIEVAL_MS
first, so each answer's retrieval takes that much longer while the stable prompt prefills.
The delay is injected here, through create_app's embedder factory, not by the service.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rag_stream.app import create_app
from rag_stream.preflight import preflight
from rag_stream.retrieval.embedder import Embedder, SentenceTransformerEmbedder
from rag_stream.settings import Settings, load_settings


class SlowEmbedder:
    def __init__(self, inner: SentenceTransformerEmbedder, delay_s: float) -> None:
        self._inner = inner
        self._delay_s = delay_s
        self.dimension = inner.dimension
        self.max_seq_length = inner.max_seq_length

    async def embed(self, texts: Sequence[str]) -> Any:
        await asyncio.sleep(self._delay_s)
        return await self._inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self._inner.count_tokens(text)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._inner.token_offsets(text)


def main() -> None:
    settings = load_settings()
    preflight(settings)
    delay_s = float(os.environ.get("SLOW_RETRIEVAL_MS", "0")) / 1000

    async def slow(s: Settings) -> Embedder:
        inner = await SentenceTransformerEmbedder.load(s.resolved_embedder)
        return SlowEmbedder(inner, delay_s)

    app = create_app(settings, embedder_factory=slow)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)


if __name__ == "__main__":
    main()
