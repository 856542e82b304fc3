"""Retrieval for an answer, overlapped with the prefill of the prompt's stable part.

The whole KV blocks of the stable part (system prompt, history, question) go to the engine as a
prefill-only request (``max_tokens=1``) while the question is embedded and searched, so they are
in the prefix cache when the full prompt arrives (``cached_tokens`` in ``done``). Skipped when
the stable part is shorter than one block, or with nothing to retrieve. Sources that do not fit
the context window are then dropped, lowest score first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rag_stream.generation.engine import Engine, Sampling
from rag_stream.generation.prompt import PromptLayout, Source
from rag_stream.retrieval.retriever import SearchHit


@dataclass(frozen=True)
class Retrieved:
    sources: list[Source]  # numbered 1..n, in the order of ``hits``
    hits: list[SearchHit]  # the hits kept
    dropped: int  # hits that did not fit the window
    retrieval_ms: float


async def _prefill(engine: Engine, request_id: str, ids: list[int], answer: Sampling) -> None:
    warm = Sampling(max_tokens=1, priority=answer.priority, affinity=answer.affinity)
    async for _ in engine.generate(request_id, ids, warm):
        pass


async def retrieve_while_prefilling(
    engine: Engine,
    request_id: str,
    layout: PromptLayout,
    search: Callable[[], Awaitable[list[SearchHit]]] | None,
    overlap: bool,
    on_sources: Callable[[Retrieved], None],
    sampling: Sampling,
) -> Retrieved:
    """Search (``None``: nothing to search) while the stable prompt is prefilled (at the
    answer's engine priority, on its replica); call ``on_sources`` as soon as the sources are
    known (before the prefill ends), then wait for the prefill. The sources are fitted so that
    ``sampling.max_tokens`` still fit the window."""
    block = engine.cache_block_size
    cacheable = layout.stable_ids[: len(layout.stable_ids) // block * block]
    prefill: asyncio.Task[None] | None = None
    if overlap and search is not None and cacheable:
        prefill = asyncio.create_task(
            _prefill(engine, f"{request_id}:prefill", cacheable, sampling)
        )
    try:
        started = time.monotonic()
        hits = await search() if search is not None else []
        retrieval_ms = (time.monotonic() - started) * 1000
        retrieved = fit_sources(engine, layout, sampling.max_tokens, hits, retrieval_ms)
        on_sources(retrieved)
        if prefill is not None:
            await prefill
        return retrieved
    finally:
        if prefill is not None and not prefill.done():
            prefill.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await prefill


def fit_sources(
    engine: Engine, layout: PromptLayout, max_tokens: int, hits: list[SearchHit], ms: float
) -> Retrieved:
    """Keep the best-scored hits whose text fits the window; number them 1..n in hit order."""
    room = engine.max_model_len - max_tokens - len(layout.full_ids(engine, []))
    drafts = [Source(i + 1, h.title, h.heading, h.text) for i, h in enumerate(hits)]
    costs = [layout.source_cost(engine, s) for s in drafts]
    keep = set(range(len(hits)))
    for i in sorted(keep, key=lambda i: hits[i].score):  # lowest score first
        if sum(costs[j] for j in keep) <= room:
            break
        keep.discard(i)
    kept = [hits[i] for i in sorted(keep)]
    sources = [Source(n + 1, h.title, h.heading, h.text) for n, h in enumerate(kept)]
    return Retrieved(sources, kept, len(hits) - len(kept), ms)
