"""An embedder that takes longer, as a remote embedding service would, or as a test needs to
kill a process in the middle of a search. It wraps the real one and is given to create_app
through its embedder factory: the service itself has no such delay."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rag_stream.retrieval.embedder import Embedder, Vectors


class SlowEmbedder:
    """Each embedding waits ``delay_s`` first; with ``marker``, only the embedding of a single
    text (a search query) that holds it."""

    def __init__(self, inner: Embedder, delay_s: float, marker: str | None = None) -> None:
        self._inner = inner
        self._delay_s = delay_s
        self._marker = marker
        self.dimension = inner.dimension
        self.max_seq_length = inner.max_seq_length

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if self._marker is None or (len(texts) == 1 and self._marker in texts[0]):
            await asyncio.sleep(self._delay_s)
        return await self._inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self._inner.count_tokens(text)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._inner.token_offsets(text)
