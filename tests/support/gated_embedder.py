"""An embedder an ingestion test holds at a batch of its choice, to act while an ingest runs:
it wraps the real one, counts the batches of several texts (an ingest's; a search query is one
text and passes untouched), and makes batch number ``hold_at`` (from 1) and every later one
wait until the test calls ``release``. ``held`` is set once a batch is waiting."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rag_stream.retrieval.embedder import Embedder, Vectors


class GatedEmbedder:
    def __init__(self, inner: Embedder, hold_at: int = 1) -> None:
        self._inner = inner
        self.hold_at = hold_at
        self.dimension = inner.dimension
        self.max_seq_length = inner.max_seq_length
        self.batches = 0  # ingest batches begun
        self.held = asyncio.Event()
        self._open = asyncio.Event()

    def release(self) -> None:
        self._open.set()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if len(texts) > 1:
            self.batches += 1
            if self.batches >= self.hold_at and not self._open.is_set():
                self.held.set()
                await self._open.wait()
        return await self._inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self._inner.count_tokens(text)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._inner.token_offsets(text)
