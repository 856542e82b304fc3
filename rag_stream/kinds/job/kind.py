"""The ``job`` kind: a long document from a knowledge base, one section after another.

A job is one stream (so one event log with contiguous ids, one lease, resume and takeover):
``stream``, ``job``, ``outline``, then per section ``section``, its ``citation``s, ``token``s
(tagged with the section) and ``section_done``, then ``done`` (or ``error``).

1. ``accept`` checks the request against ``jobs.*``, finds the KB, checks the longest section
   prompt fits the window, and stores the job (``queued``).
2. ``run`` plans the outline when none was given (``job_outline.py``), then for each section
   (``job_section.py``): retrieval (heading + instructions + title), a prompt fitted to the
   window (``job_prompt.py``), the plan saved (the section's prompt ids and sources), its
   events, the token phase at ``batch`` priority, and the finished section written to SQL in a
   session of its own.
3. A continuation rebuilds the state from the log (``job_state.py``): finished sections stay as
   they are, and the interrupted one continues from its saved prompt ids plus its logged token
   ids, exactly as an answer's token phase does after a takeover.
4. ``finish`` writes the job's end to SQL and builds ``done`` (usage summed over sections).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter

from rag_stream.errors import EngineDied, RagStreamError
from rag_stream.generation.engine import Engine
from rag_stream.generation.priority import ENGINE_PRIORITY, PriorityClass
from rag_stream.kinds.base import BaseKind
from rag_stream.kinds.job import section as job_section
from rag_stream.kinds.job.accept import check_request
from rag_stream.kinds.job.outline import plan_outline
from rag_stream.kinds.job.section import SectionPlan
from rag_stream.kinds.job.state import JobState, SectionState
from rag_stream.kinds.tokens import TokenRun
from rag_stream.schemas.events import (
    Done,
    ErrorEvent,
    Event,
    FinishReason,
    JobStarted,
    Outline,
    Timings,
    Usage,
)
from rag_stream.schemas.jobs import JobRequest, JobSpec
from rag_stream.settings import JobsSettings
from rag_stream.store.jobs import (
    FinishedSection,
    create_job,
    finish_job,
    mark_running,
    save_sections,
    set_stream,
)
from rag_stream.store.repositories import resolve_kb
from rag_stream.store.streams import FinishedStream
from rag_stream.streaming.context import StreamContext

logger = logging.getLogger(__name__)
BATCH = ENGINE_PRIORITY["batch"]


class JobPlan(BaseModel):
    """Saved in the stream's meta at the start and again before each section's events."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["job"] = "job"
    job_id: str
    kb_id: str
    spec: JobSpec
    queue_ms: float = 0.0
    current: SectionPlan | None = None


def _finished(section: SectionState) -> FinishedSection:
    assert section.done is not None
    return FinishedSection(
        index=section.index,
        heading=section.heading,
        text=section.text,
        tokens=section.done.tokens,
        finish_reason=section.done.finish_reason,
        citations=section.citations,
    )


@dataclass
class JobRun:
    """One run of a job's stream: the first, or a continuation after a takeover."""

    kind: JobKind
    model: str
    plan: JobPlan
    state: JobState = field(default_factory=JobState)
    first: bool = True
    accepted_at: float = field(default_factory=time.monotonic)
    conversation_id: str | None = None
    priority: PriorityClass = "batch"
    retrieval_ms: float = 0.0
    runs: list[TokenRun] = field(default_factory=list)  # this process's sections

    @property
    def initial_plan(self) -> JobPlan:
        """Saved as soon as the stream exists: a process that dies before the job's turn
        comes (it waits for a batch slot) leaves a job another process can run."""
        return self.plan

    @property
    def _affinity(self) -> str:
        """The job's outline and sections go to one engine replica (remote engines)."""
        return f"job:{self.plan.job_id}"

    async def run(self, ctx: StreamContext) -> FinishReason:
        try:
            return await self._run(ctx)
        except EngineDied:
            raise  # not a failure of the job: another process continues it
        except RagStreamError as exc:
            if ctx.writer.stop_reason is None:  # a real failure, not a stop or a takeover
                await self._failed(exc.code, exc.message)
            raise
        except Exception:
            if ctx.writer.stop_reason is None:
                await self._failed("internal_error", "the job failed unexpectedly")
            raise

    async def _failed(self, code: str, message: str) -> None:
        try:
            await finish_job(self.kind.sessions, self.plan.job_id, "failed", (code, message))
        except Exception:
            logger.exception("job %s: could not record its failure", self.plan.job_id)

    def _emit(self, ctx: StreamContext, make: Callable[[int], Event]) -> Event:
        event = ctx.emit(make)
        self.state.add(event)
        return event

    async def _run(self, ctx: StreamContext) -> FinishReason:
        engine = await self.kind.engines.wait()
        ctx.check()
        plan, state = self.plan, self.state
        if self.first:
            self.plan = plan = plan.model_copy(update={"queue_ms": ctx.queue_ms})
        spec = plan.spec
        if state.started is None:
            self._emit(
                ctx,
                lambda i: JobStarted(
                    id=i,
                    job_id=plan.job_id,
                    kb_id=plan.kb_id,
                    title=spec.title,
                    sections=spec.sections,
                ),
            )
        if state.outline is None:
            headings = spec.outline or await self._plan_outline(ctx, engine)
            ctx.check()
            planned = spec.outline is None
            self._emit(ctx, lambda i: Outline(id=i, headings=headings, planned=planned))
        assert state.outline is not None
        headings = state.outline.headings
        await mark_running(self.kind.sessions, plan.job_id, headings)
        await save_sections(self.kind.sessions, plan.job_id, [_finished(s) for s in state.finished])
        for index in range(len(headings)):
            section = state.sections.get(index)
            if section is None or section.done is None:
                await self._section(ctx, engine, index)
            ctx.check()
        return "stop"

    async def _plan_outline(self, ctx: StreamContext, engine: Engine) -> list[str]:
        cfg = self.kind.cfg
        return await plan_outline(
            ctx,
            engine,
            self.plan.spec,
            cfg.outline_tokens,
            cfg.max_heading_chars,
            BATCH,
            affinity=self._affinity,
        )

    async def _section(self, ctx: StreamContext, engine: Engine, index: int) -> None:
        kind, state = self.kind, self.state
        plan = self.plan.current
        if plan is None or plan.index != index:
            plan = await job_section.prepare(
                engine,
                kind.retriever,
                self.plan.kb_id,
                self.plan.spec,
                state,
                index,
                kind.cfg.tail_tokens,
                BATCH,
                self._affinity,
            )
            self.retrieval_ms += plan.retrieval_ms
            self.plan = self.plan.model_copy(update={"current": plan})
            await ctx.save_plan(self.plan)  # before the section's first event
        ctx.check()
        self.runs.append(await job_section.write(ctx, engine, plan, state))
        await save_sections(kind.sessions, self.plan.job_id, [_finished(state.sections[index])])

    async def log_lost(self, error: ErrorEvent) -> None:
        """The job's row would otherwise say ``running`` for good; its finished sections stay
        in SQL (the result shows them)."""
        await self._failed(error.code, error.message)

    def _timings(self, ctx: StreamContext) -> Timings:
        firsts = [r.first_token_at for r in self.runs if r.first_token_at is not None]
        lasts = [r.finished_at for r in self.runs if r.finished_at is not None]
        tokens = sum(r.completion_tokens for r in self.runs)
        if not firsts or not lasts:
            return Timings(queue_ms=self.plan.queue_ms, retrieval_ms=self.retrieval_ms)
        decode_ms = (max(lasts) - min(firsts)) * 1000
        return Timings(
            queue_ms=self.plan.queue_ms,
            retrieval_ms=self.retrieval_ms,
            ttft_ms=(min(firsts) - ctx.started) * 1000,
            decode_ms=decode_ms,
            tpot_ms=decode_ms / (tokens - 1) if tokens > 1 else 0.0,
        )

    async def finish(self, ctx: StreamContext, reason: FinishReason, event_id: int) -> Done:
        kind, state = self.kind, self.state
        finished = [s for s in state.finished if s.done is not None]
        usage = Usage(
            prompt_tokens=sum(s.done.prompt_tokens for s in finished if s.done),
            completion_tokens=sum(s.done.tokens for s in finished if s.done),
            cached_tokens=sum(s.done.cached_tokens for s in finished if s.done),
        )
        done = Done(id=event_id, finish_reason=reason, usage=usage, timings=self._timings(ctx))
        total = len(state.outline.headings) if state.outline else None
        complete = total is not None and len(finished) == total
        status = "cancelled" if reason == "cancelled" else "completed" if complete else "failed"
        await save_sections(kind.sessions, self.plan.job_id, [_finished(s) for s in finished])
        await finish_job(kind.sessions, self.plan.job_id, status)
        await kind.records.save(
            FinishedStream(
                tenant=ctx.tenant,
                stream_id=ctx.stream_id,
                kind=kind.name,
                model=self.model,
                finish_reason=reason,
                text="",  # the document is in job_sections
                usage=usage.model_dump(),
            )
        )
        kind.metrics.observe_done(kind.name, done)
        return done


class JobKind(BaseKind[JobPlan]):
    name = "job"
    detached = True  # a job runs to its end whether or not anyone reads it
    plans = TypeAdapter(JobPlan)

    @property
    def cfg(self) -> JobsSettings:
        return self.settings.jobs

    async def accept(self, body: JobRequest, tenant: str) -> JobRun:
        """Check the request, find the KB, store the job (queued) and plan its first run."""
        engine = self.engines.get()
        async with self.sessions() as session:
            kb = await resolve_kb(session, body.kb, tenant=tenant)
        spec = check_request(engine, self.cfg, body)
        job = await create_job(self.sessions, tenant=tenant, kb_id=kb.id, spec=spec)
        plan = JobPlan(job_id=job.id, kb_id=kb.id, spec=spec)
        return JobRun(self, engine.model_name, plan)

    async def started(self, stream_id: str, producer: JobRun) -> None:
        await set_stream(self.sessions, producer.plan.job_id, stream_id)

    async def not_started(self, producer: JobRun, error: Exception) -> None:
        if isinstance(error, RagStreamError):
            reason = (error.code, error.message)
        else:
            reason = ("internal_error", "the job's stream could not be started")
        await finish_job(self.sessions, producer.plan.job_id, "failed", reason)

    def continuation(self, plan_json: str, logged: Sequence[Event]) -> JobRun:
        plan = self.read_plan(plan_json)
        return JobRun(
            self, self.engines.get().model_name, plan, JobState.from_log(logged), first=False
        )
