"""The ``answer`` kind: a question on a knowledge base; citations first, then answer tokens.

1. ``accept`` checks the request, loads the conversation's history and lays out the prompt with
   its stable part (system prompt, history, question) first.
2. The first run saves the question's plan, retrieves while the engine prefills that stable
   part (``sources.py``), sends one ``citation`` per source as soon as they are known, saves the
   answer's plan (prompt token ids and what the finisher needs), then runs the token phase
   (the plans: ``answer_plans.py``).
3. A continuation after a takeover runs only the token phase, from the answer's plan and the
   logged ids; one that finds the question's plan (the process died while searching, before
   any citation went out) searches again first.
4. ``finish`` stores the question and the answer in the conversation and builds ``done``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from rag_stream.errors import InvalidRequest, PayloadTooLarge, StartInterrupted
from rag_stream.generation.markers import cited_markers
from rag_stream.generation.priority import ENGINE_PRIORITY, PriorityClass, priority_class
from rag_stream.generation.prompt import Turn, layout
from rag_stream.generation.sampling import fit_to_window
from rag_stream.kinds.answer.intent import Question
from rag_stream.kinds.answer.plans import SAVED_PLANS, AnswerJob, AnswerPlan, QuestionPlan
from rag_stream.kinds.answer.sources import Retrieved, retrieve_while_prefilling
from rag_stream.kinds.base import BaseKind
from rag_stream.kinds.tokens import TokenOutput, token_phase
from rag_stream.retrieval.retriever import SearchHit
from rag_stream.schemas.events import (
    Citation,
    CitationBody,
    Done,
    ErrorEvent,
    Event,
    FinishReason,
    Usage,
)
from rag_stream.settings import AnswersSettings
from rag_stream.store.conversations import get_conversation, save_answer
from rag_stream.store.db import retrying
from rag_stream.store.models import new_id
from rag_stream.store.repositories import resolve_kb
from rag_stream.store.streams import FinishedStream
from rag_stream.streaming.context import StreamContext


def _citation(n: int, hit: SearchHit, event_id: int) -> Citation:
    return Citation(id=event_id, **hit.cited_as(n).model_dump())


@dataclass
class AnswerRun:
    """One run of an answer stream: the first (``job`` set), a continuation (``plan`` set), or
    a continuation that searches again (``job`` and ``queue_ms`` set)."""

    kind: AnswerKind
    model: str
    conversation_id: str
    job: AnswerJob | None = None
    plan: AnswerPlan | None = None
    out: TokenOutput = field(default_factory=TokenOutput)
    accepted_at: float = field(default_factory=time.monotonic)
    priority: PriorityClass = "interactive"  # for the admission ticket (a continuation has none)
    queue_ms: float | None = None  # the first run's, when a continuation searches again

    @property
    def initial_plan(self) -> QuestionPlan | None:
        """The question, before the slot (queue_ms 0): a takeover while the stream still waits
        for it searches and answers from the start; the first run saves it again with its queue
        time, then the answer's plan once it has searched."""
        if self.job is None or self.plan is not None or self.queue_ms is not None:
            return None
        return QuestionPlan.of_job(self.job, self.conversation_id, 0.0)

    async def run(self, ctx: StreamContext) -> FinishReason:
        engine = await self.kind.engines.wait()
        if self.plan is None:
            assert self.job is not None
            if self.queue_ms is None:  # the first run: a takeover during retrieval needs this
                self.queue_ms = ctx.queue_ms
                await ctx.save_plan(
                    QuestionPlan.of_job(self.job, self.conversation_id, self.queue_ms)
                )
            self.plan = await self._retrieve(ctx, self.job, self.queue_ms)
            await ctx.save_plan(self.plan)
        return await token_phase(ctx, engine, self.plan, self.out)

    async def _retrieve(self, ctx: StreamContext, job: AnswerJob, queue_ms: float) -> AnswerPlan:
        engine = await self.kind.engines.wait()
        citations: list[CitationBody] = []

        def send_citations(found: Retrieved) -> None:
            ctx.check()
            for source, hit in zip(found.sources, found.hits, strict=True):
                citation = ctx.emit(partial(_citation, source.n, hit))
                citations.append(CitationBody.model_validate(citation, from_attributes=True))

        search = None
        if job.top_k:
            retriever = self.kind.retriever
            search = partial(
                retriever.search, job.kb_id, job.question, job.top_k, mmr=job.mmr, mode=job.mode
            )
        found = await retrieve_while_prefilling(
            engine,
            ctx.run_id,
            job.layout,
            search,
            self.kind.cfg.overlap,
            send_citations,
            job.sampling,
        )
        ctx.check()
        return AnswerPlan.of(
            job.layout.full_ids(engine, found.sources),
            job.sampling,
            coalesce=job.coalesce,
            stop=job.stop,
            queue_ms=queue_ms,
            kb_id=job.kb_id,
            question=job.question,
            conversation_id=self.conversation_id,
            citations=citations,
            dropped_sources=found.dropped,
            retrieval_ms=found.retrieval_ms,
        )

    async def log_lost(self, error: ErrorEvent) -> None:
        return None  # as after any error: the question stays in its conversation, unanswered

    async def finish(self, ctx: StreamContext, reason: FinishReason, event_id: int) -> Done:
        run = self.out.run
        run.finish_reason = reason
        plan = self.plan
        if plan is None:
            # ended before retrieval finished (cancelled, or left by every reader): nothing
            # was answered, so no conversation keeps it, but the stream is recorded as every
            # ended stream is (its text empty; GET /v1/usage counts the request)
            record = FinishedStream(
                tenant=ctx.tenant,
                stream_id=ctx.stream_id,
                kind=self.kind.name,
                model=self.model,
                finish_reason=reason,
                text="",
                usage=Usage().model_dump(),
            )
            await retrying(partial(self.kind.records.save, record))
            return Done(id=event_id, finish_reason=reason)
        text = self.out.text
        done = Done(
            id=event_id,
            finish_reason=reason,
            usage=run.usage(),
            timings=run.timings(
                ctx.started, queue_ms=plan.queue_ms, retrieval_ms=plan.retrieval_ms
            ),
            cited=cited_markers(text, range(1, len(plan.citations) + 1)),
            dropped_sources=plan.dropped_sources,
        )
        # (a database that restarts under the stream is waited for: the answer is whole, and
        # its end waits for the conversation to be saved; saving twice is a no-op)
        await retrying(
            lambda: save_answer(
                self.kind.sessions,
                tenant=ctx.tenant,
                stream_id=ctx.stream_id,
                model=self.model,
                kb_id=plan.kb_id,
                conversation_id=plan.conversation_id,
                question=plan.question,
                answer=text,
                citations=plan.citations,
                done=done,
            )
        )
        self.kind.metrics.observe_done(self.kind.name, done)
        self.kind.metrics.retrieval.observe(plan.retrieval_ms / 1000)
        return done


class AnswerKind(BaseKind[AnswerPlan | QuestionPlan]):
    name = "answer"
    plans = SAVED_PLANS

    @property
    def cfg(self) -> AnswersSettings:
        return self.settings.answers

    async def accept(self, q: Question, tenant: str) -> AnswerRun:
        """Check the question against the limits, find the KB (and the stored conversation's
        history), and lay out the prompt so the answer always has room (sources are dropped
        first)."""
        accepted_at = time.monotonic()
        history = q.history
        if q.conversation_id:
            async with self.sessions() as session:
                conv = await get_conversation(session, q.conversation_id, tenant=tenant)
            history = [Turn(m.role, m.content) for m in conv.messages if m.content]
        engine = self.engines.get()
        cfg = self.cfg
        question = q.text.strip()
        if len(question) > cfg.max_question_chars:
            raise PayloadTooLarge(
                f"question is {len(question)} characters; the limit is {cfg.max_question_chars}"
            )
        top_k = cfg.default_top_k if q.top_k is None else q.top_k
        if top_k > cfg.max_top_k:
            raise InvalidRequest(
                f"top_k must be between 0 and {cfg.max_top_k}, got {top_k}", param="top_k"
            )
        async with self.sessions() as session:
            kb = await resolve_kb(session, q.kb, tenant=tenant)
        lay = layout(engine, history, question, cfg.history_budget_tokens, q.instructions)
        ids = lay.full_ids(engine, [])  # the sources are not known yet: they come on top
        priority = priority_class(q.priority, len(ids), tenant, self.limits)
        job = AnswerJob(
            kb_id=kb.id,
            question=question,
            layout=lay,
            top_k=top_k,
            sampling=replace(
                fit_to_window(engine, ids, q.sampling),
                priority=ENGINE_PRIORITY[priority],
                affinity=_conversation_key(tenant, history, question),
            ),
            mmr=q.mmr,
            mode=q.mode,
            coalesce=q.coalesce,
            stop=list(q.stop),
        )
        conversation_id = q.conversation_id or new_id()
        return AnswerRun(
            self,
            engine.model_name,
            conversation_id,
            job=job,
            accepted_at=accepted_at,
            priority=priority,
        )

    def continuation(self, plan_json: str, logged: Sequence[Event]) -> AnswerRun:
        plan = self.read_plan(plan_json)
        if isinstance(plan, QuestionPlan):
            if any(e.type != "stream" for e in logged):
                # some citations went out and the rest are lost with the process: another
                # search could number them otherwise
                raise StartInterrupted(
                    "the stream's process died while sending its sources; ask again"
                )
            return AnswerRun(
                self,
                self.engines.get().model_name,
                plan.conversation_id,
                job=plan.job(),
                queue_ms=plan.queue_ms,
            )
        return AnswerRun(
            self,
            self.engines.get().model_name,
            plan.conversation_id,
            plan=plan,
            out=TokenOutput.from_log(logged),
        )


def _conversation_key(tenant: str, history: Sequence[Turn], question: str) -> str:
    """Which engine replica a conversation's requests go to (remote engines), so each turn
    meets the prefix the earlier ones cached: its first question, which every turn's prompt
    starts with, whether the client names the conversation (``conversation_id``) or sends the
    whole history (chat completions)."""
    first = next((t.content for t in history if t.role == "user"), question)
    return hashlib.blake2b(f"{tenant}\n{first}".encode(), digest_size=8).hexdigest()
