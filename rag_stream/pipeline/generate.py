"""The ``generate`` kind: a prompt in; ``stream``, ``token``... and ``done`` events out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import PayloadTooLarge
from rag_stream.generation.engine import Engine, Sampling
from rag_stream.generation.priority import ENGINE_PRIORITY, PriorityClass, priority_class
from rag_stream.generation.sampling import fit_to_window, sampling_for
from rag_stream.generation.slot import EngineSlot
from rag_stream.metrics import Metrics
from rag_stream.pipeline.plan import TokenPlan
from rag_stream.pipeline.tokens import TokenOutput, token_phase
from rag_stream.schemas.events import Done, ErrorEvent, Event, FinishReason
from rag_stream.schemas.generate import Coalesce, GenerateRequest
from rag_stream.settings import LimitsSettings
from rag_stream.store.streams import save_stream
from rag_stream.streaming.context import StreamContext
from rag_stream.streaming.event_log import StreamMeta
from rag_stream.streaming.kinds import plan_error


class GeneratePlan(TokenPlan):
    kind: Literal["generate"] = "generate"


@dataclass
class GenerateRun:
    """One run of a generate stream (its first, or a continuation after a takeover)."""

    kind: GenerateKind
    plan: GeneratePlan
    model: str
    out: TokenOutput = field(default_factory=TokenOutput)
    conversation_id: str | None = None
    first: bool = True
    accepted_at: float = field(default_factory=time.monotonic)
    priority: PriorityClass = "interactive"  # for the admission ticket (a continuation has none)

    async def run(self, ctx: StreamContext) -> FinishReason:
        engine = await self.kind.engines.wait()
        if self.first:
            self.plan = self.plan.model_copy(update={"queue_ms": ctx.queue_ms})
            await ctx.save_plan(self.plan)
        return await token_phase(ctx, engine, self.plan, self.out)

    async def log_lost(self, error: ErrorEvent) -> None:
        return None  # nothing kept outside the log (usage is recorded by finish only)

    async def finish(self, ctx: StreamContext, reason: FinishReason, event_id: int) -> Done:
        run = self.out.run
        run.finish_reason = reason
        usage = run.usage()
        await save_stream(
            self.kind.sessions,
            tenant=ctx.tenant,
            stream_id=ctx.stream_id,
            kind=self.kind.name,
            model=self.model,
            finish_reason=reason,
            text=self.out.text,
            usage=usage.model_dump(),
        )
        done = Done(
            id=event_id,
            finish_reason=reason,
            usage=usage,
            timings=run.timings(ctx.started, queue_ms=self.plan.queue_ms),
        )
        self.kind.metrics.observe_done(self.kind.name, done)
        return done


class GenerateKind:
    name = "generate"

    def __init__(
        self,
        engines: EngineSlot,
        sessions: async_sessionmaker[AsyncSession],
        metrics: Metrics,
        limits: LimitsSettings,
    ) -> None:
        self.engines = engines
        self.sessions = sessions
        self.metrics = metrics
        self.limits = limits

    def accept(self, body: GenerateRequest, coalesce: Coalesce, tenant: str) -> GenerateRun:
        """Check the request against the limits and the window; plan its generation."""
        engine = self.engines.get()
        self._check_size(len(body.prompt))
        sampling = sampling_for(
            self.limits, body.max_tokens, body.temperature, body.top_p, body.seed
        )
        text = body.prompt
        if body.chat:
            text = engine.chat_prompt([{"role": "user", "content": body.prompt}])
        return self._run(engine, text, sampling, coalesce, [], body.priority, tenant)

    def accept_chat(
        self,
        messages: Sequence[dict[str, str]],
        sampling: Sampling,
        coalesce: Coalesce,
        stop: Sequence[str],
        priority: PriorityClass,
        tenant: str,
    ) -> GenerateRun:
        """Generate the assistant's next message after ``messages`` (role/content pairs)."""
        engine = self.engines.get()
        self._check_size(sum(len(m["content"]) for m in messages))
        text = engine.chat_prompt(messages)
        return self._run(engine, text, sampling, coalesce, stop, priority, tenant)

    def _check_size(self, chars: int) -> None:
        if chars > self.limits.max_prompt_chars:
            raise PayloadTooLarge(
                f"prompt is {chars} characters; the limit is {self.limits.max_prompt_chars}"
            )

    def _run(
        self,
        engine: Engine,
        text: str,
        sampling: Sampling,
        coalesce: Coalesce,
        stop: Sequence[str],
        requested: PriorityClass,
        tenant: str,
    ) -> GenerateRun:
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        priority = priority_class(requested, len(ids), tenant, self.limits)
        fitted = replace(fit_to_window(engine, ids, sampling), priority=ENGINE_PRIORITY[priority])
        plan = GeneratePlan.of(ids, fitted, coalesce=coalesce, stop=list(stop))
        return GenerateRun(self, plan, engine.model_name, priority=priority)

    async def can_continue(self, meta: StreamMeta) -> bool:
        return await self.engines.serves(meta.model)

    def continuation(self, plan_json: str, logged: Sequence[Event]) -> GenerateRun:
        try:
            plan = GeneratePlan.model_validate_json(plan_json)
        except ValidationError as exc:
            raise plan_error(self.name, exc) from None
        engine = self.engines.get()
        return GenerateRun(self, plan, engine.model_name, TokenOutput.from_log(logged), first=False)
