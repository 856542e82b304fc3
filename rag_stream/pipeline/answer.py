"""Answers: retrieval overlapped with the prefill of the stable prompt, citations, then tokens.

1. The whole KV blocks of the stable part of the prompt (system, history, question) go to the
   engine as a prefill-only request (``max_tokens=1``) while the question is embedded and
   searched, so they are in the prefix cache when the full prompt arrives (``cached_tokens`` in
   ``done``). Skipped when the stable part is shorter than one block or top_k is 0.
2. Sources that do not fit the context window are dropped lowest score first.
3. One ``citation`` event per source, then the plan (prompt token ids) is saved for takeover,
   then the token phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.generation.engine import Engine, FinishReason, Sampling
from rag_stream.generation.prompt import PromptLayout, Source, Turn
from rag_stream.metrics import Metrics
from rag_stream.pipeline.context import Finalizer, StreamContext
from rag_stream.pipeline.phases import token_phase
from rag_stream.pipeline.plan import Plan
from rag_stream.retrieval.retriever import Retriever, SearchHit
from rag_stream.schemas.events import Citation, Done
from rag_stream.settings import AnswersSettings
from rag_stream.store.conversations import save_answer

_MARKER = re.compile(r"\[(\d{1,3})\]")


@dataclass(frozen=True)
class AnswerJob:
    kb_id: str
    question: str
    conversation_id: str
    history: list[Turn]
    layout: PromptLayout
    top_k: int
    sampling: Sampling
    mmr: bool
    accepted_at: float


async def _prefill(engine: Engine, request_id: str, ids: list[int]) -> None:
    async for _ in engine.generate(request_id, ids, Sampling(max_tokens=1)):
        pass


def fit_sources(
    engine: Engine, job: AnswerJob, hits: list[SearchHit]
) -> tuple[list[Source], list[SearchHit], int]:
    """Keep the best-scored hits whose text fits the window; number them 1..n in hit order."""
    room = engine.max_model_len - job.sampling.max_tokens - len(job.layout.full_ids(engine, []))
    drafts = [Source(i + 1, h.title, h.heading, h.text) for i, h in enumerate(hits)]
    costs = [job.layout.source_cost(engine, s) for s in drafts]
    keep = set(range(len(hits)))
    for i in sorted(keep, key=lambda i: hits[i].score):  # lowest score first
        if sum(costs[j] for j in keep) <= room:
            break
        keep.discard(i)
    kept = [hits[i] for i in sorted(keep)]
    sources = [Source(n + 1, h.title, h.heading, h.text) for n, h in enumerate(kept)]
    return sources, kept, len(hits) - len(kept)


def _citation(n: int, hit: SearchHit, event_id: int) -> Citation:
    return Citation(
        id=event_id,
        n=n,
        chunk_id=hit.chunk_id,
        document_id=hit.document_id,
        title=hit.title,
        heading=hit.heading,
        snippet=hit.text,
        offsets=(hit.start, hit.end),
        score=hit.score,
    )


async def answer_body(
    ctx: StreamContext, job: AnswerJob, retriever: Retriever, cfg: AnswersSettings
) -> None:
    engine = ctx.engine
    ctx.queue_ms = (time.monotonic() - job.accepted_at) * 1000
    prefill: asyncio.Task[None] | None = None
    # Only whole KV blocks are cached, so prefill just those; with no retrieval to overlap,
    # or less than one block, a separate prefill would only cost time.
    block = engine.cache_block_size
    cacheable = job.layout.stable_ids[: len(job.layout.stable_ids) // block * block]
    if cfg.overlap and job.top_k and cacheable:
        prefill = asyncio.create_task(_prefill(engine, f"{ctx.request_id}:prefill", cacheable))
    try:
        started = time.monotonic()
        if cfg.retrieval_delay_ms:
            await asyncio.sleep(cfg.retrieval_delay_ms / 1000)
        hits = (
            await retriever.search(job.kb_id, job.question, job.top_k, mmr=job.mmr)
            if job.top_k
            else []
        )
        ctx.retrieval_ms = (time.monotonic() - started) * 1000
        ctx.check()
        # the citations go out as soon as they are known, before the prefill is done
        sources, kept, dropped = fit_sources(engine, job, hits)
        citations = []
        for source, hit in zip(sources, kept, strict=True):
            citation = ctx.emit(partial(_citation, source.n, hit))
            citations.append(citation.model_dump(exclude={"id", "type"}))
        if prefill is not None:
            await prefill
    finally:
        if prefill is not None and not prefill.done():
            prefill.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await prefill
    ctx.check()
    plan = Plan(
        kind="answer",
        prompt_ids=job.layout.full_ids(engine, sources),
        max_tokens=job.sampling.max_tokens,
        temperature=job.sampling.temperature,
        top_p=job.sampling.top_p,
        seed=job.sampling.seed,
        context={
            "kb_id": job.kb_id,
            "question": job.question,
            "conversation_id": job.conversation_id,
            "citations": citations,
            "dropped_sources": dropped,
            "retrieval_ms": ctx.retrieval_ms,
            "queue_ms": ctx.queue_ms,
        },
    )
    await ctx.save_plan(plan)
    await token_phase(ctx, plan)


def cited_markers(text: str, sources: int) -> list[int]:
    return sorted({n for n in map(int, _MARKER.findall(text)) if 1 <= n <= sources})


def make_answer_finalizer(
    sessions: async_sessionmaker[AsyncSession], metrics: Metrics
) -> Finalizer:
    async def finalize(ctx: StreamContext, reason: FinishReason, event_id: int) -> Done:
        ctx.run.finish_reason = reason
        if ctx.plan is None:  # ended before retrieval finished: nothing to keep
            return Done(id=event_id, finish_reason=reason)
        c = ctx.plan.context
        text = "".join(ctx.text)
        done = Done(
            id=event_id,
            finish_reason=reason,
            usage=ctx.run.usage(),
            timings=ctx.run.timings(
                ctx.started, queue_ms=c["queue_ms"], retrieval_ms=c["retrieval_ms"]
            ),
            cited=cited_markers(text, len(c["citations"])),
            dropped_sources=c["dropped_sources"],
        )
        await save_answer(
            sessions,
            stream_id=ctx.stream_id,
            model=ctx.engine.model_name,
            kb_id=c["kb_id"],
            conversation_id=c["conversation_id"],
            question=c["question"],
            answer=text,
            citations=c["citations"],
            done=done,
        )
        metrics.observe_done("answer", done)
        metrics.retrieval.observe(c["retrieval_ms"] / 1000)
        return done

    return finalize
