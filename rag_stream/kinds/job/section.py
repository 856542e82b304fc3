"""One section of a job: its plan (retrieval and a fitted prompt), then its events.

``prepare`` retrieves the section's sources and fits its prompt; the caller saves the plan
before any of the section's events, so a takeover always finds the plan its events came from.
``write`` sends ``section`` and the ``citation``s not yet logged, runs the token phase from the
tokens already logged (none on a first run), and ends with ``section_done``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from rag_stream.generation.engine import Engine, Sampling
from rag_stream.kinds.job.prompt import fit_section
from rag_stream.kinds.job.state import JobState
from rag_stream.kinds.plan import TokenPlan
from rag_stream.kinds.tokens import TokenOutput, TokenRun, token_phase
from rag_stream.retrieval.retriever import Retriever, SearchHit
from rag_stream.schemas.events import (
    Citation,
    CitationBody,
    Event,
    SectionDone,
    SectionStarted,
    Token,
)
from rag_stream.schemas.jobs import JobSpec
from rag_stream.streaming.context import StreamContext


class SectionPlan(TokenPlan):
    """The section being written: its prompt (the token phase's plan) and its sources."""

    kind: Literal["job_section"] = "job_section"
    index: int
    heading: str
    citations: list[CitationBody]
    retrieval_ms: float = 0.0
    dropped_sources: int = 0


@dataclass
class _SectionContext(StreamContext):
    """The stream's context for one section's token phase: its ``token`` events carry the
    section's index, and its engine requests an id of their own."""

    section: int = 0
    state: JobState = field(default_factory=JobState)

    def emit(self, make: Callable[[int], Event]) -> Event:
        def tagged(event_id: int) -> Event:
            event = make(event_id)
            if isinstance(event, Token):
                return event.model_copy(update={"section": self.section})
            return event

        event = super().emit(tagged)
        self.state.add(event)
        return event


async def _search(retriever: Retriever, kb_id: str, query: str, spec: JobSpec) -> list[SearchHit]:
    """The best ``top_k`` hits, equal scores in chunk-id order: stores may order ties
    differently (hybrid fusion gives exact ties), and a takeover in another process must
    rebuild the same prompts, so a few more are asked for and the cut is made here."""
    if not spec.top_k:
        return []
    hits = await retriever.search(kb_id, query, spec.top_k * 2, mode=spec.mode)
    return sorted(hits, key=lambda h: (-h.score, h.chunk_id))[: spec.top_k]


async def prepare(
    engine: Engine,
    retriever: Retriever,
    kb_id: str,
    spec: JobSpec,
    state: JobState,
    index: int,
    tail_tokens: int,
    priority: int,
    affinity: str,
) -> SectionPlan:
    """Retrieve on heading + instructions + title and fit the section's prompt; ``affinity``
    keeps a job's sections on one engine replica, where its title and outline are cached."""
    assert state.outline is not None
    headings = state.outline.headings
    query = "\n".join(p for p in (headings[index], spec.instructions, spec.title) if p)
    started = time.monotonic()
    hits = await _search(retriever, kb_id, query, spec)
    retrieval_ms = (time.monotonic() - started) * 1000
    tail = state.tail_ids(index, tail_tokens)
    fitted = fit_section(engine, spec, headings, index, tail, hits, state.known_sources())
    citations = [hit.cited_as(n) for n, hit in fitted.cited]
    sampling = Sampling(
        max_tokens=spec.section_tokens,
        temperature=spec.temperature,
        seed=spec.seed,
        priority=priority,
        affinity=affinity,
    )
    return SectionPlan.of(
        fitted.prompt_ids,
        sampling,
        index=index,
        heading=headings[index],
        citations=citations,
        retrieval_ms=retrieval_ms,
        dropped_sources=fitted.dropped,
    )


async def write(ctx: StreamContext, engine: Engine, plan: SectionPlan, state: JobState) -> TokenRun:
    """The section's events, from where the log left it; its token phase's usage."""

    def emit(make: Callable[[int], Event]) -> None:
        state.add(ctx.emit(make))

    index = plan.index
    if index not in state.sections:
        emit(lambda i: SectionStarted(id=i, index=index, heading=plan.heading))
    section = state.sections[index]
    logged = {c.n for c in section.citations}
    for body in plan.citations:
        if body.n not in logged:  # all of them, unless a takeover came in between

            def citation(i: int, body: CitationBody = body) -> Event:
                return Citation(id=i, **body.model_dump())

            emit(citation)
    out = TokenOutput(list(section.ids), list(section.pieces))
    sctx = _SectionContext(
        ctx.stream_id,
        f"{ctx.run_id}:s{index}",
        ctx.writer,
        ctx.event_log,
        ctx.accepted_at,
        ctx.tenant,
        ctx.started,
        section=index,
        state=state,
    )
    reason = await token_phase(sctx, engine, plan, out)
    run = out.run
    emit(
        lambda i: SectionDone(
            id=i,
            index=index,
            tokens=run.completion_tokens,
            finish_reason=reason,
            prompt_tokens=run.prompt_tokens,
            cached_tokens=run.cached_tokens,
        )
    )
    return run
