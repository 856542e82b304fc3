"""Embedding for background ingests, at the lowest CPU priority.

A large upload embeds for minutes on the cores that also prefill and decode answers. At full
priority and on every core (ONNX Runtime's default: a spinning thread a core) it more than
doubled interactive answers' time to first token on 2 cores (docs/benchmarks.md). Here its
model runs single-threaded (``OnnxEmbedder.single_threaded``: no pool, no spinning) on one
thread of its own whose nice value is 19, so the scheduler gives the engine and the query
embeddings the CPU whenever they want it and the ingest the rest.

Only the ONNX backend can be held to one thread this way; another embedder is used as it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.onnx_embedder import OnnxEmbedder, Vectors

log = logging.getLogger(__name__)

NICE = 19


def _lower_this_thread() -> None:
    # On Linux a nice value belongs to a thread (its native id), not to the whole process.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError) as exc:
        log.warning("ingest: could not lower the embedding thread's priority: %s", exc)


class LowPriorityEmbedder:
    def __init__(self, model: OnnxEmbedder) -> None:
        self._model = model
        self.dimension = model.dimension
        self.max_seq_length = model.max_seq_length
        self._thread = ThreadPoolExecutor(
            1, thread_name_prefix="ingest-embed", initializer=_lower_this_thread
        )

    async def embed(self, texts: Sequence[str]) -> Vectors:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._model.encode_sync, texts)

    def count_tokens(self, text: str) -> int:
        return self._model.count_tokens(text)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._model.token_offsets(text)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def low_priority(embedder: Embedder) -> Embedder:
    """``embedder`` for background work (blocking: it loads a model session, ~0.3 s)."""
    if isinstance(embedder, OnnxEmbedder):
        return LowPriorityEmbedder(embedder.single_threaded())
    return embedder
