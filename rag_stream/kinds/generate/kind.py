"""The ``generate`` kind: a prompt in; ``stream``, ``token``... and ``done`` events out.

Its intent is a ``Prompt`` (intent.py: the translations into one from each request that asks
for it)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import TypeAdapter

from rag_stream.errors import PayloadTooLarge
from rag_stream.generation.priority import ENGINE_PRIORITY, PriorityClass, priority_class
from rag_stream.generation.sampling import fit_to_window
from rag_stream.kinds.base import BaseKind
from rag_stream.kinds.generate.intent import Prompt
from rag_stream.kinds.plan import TokenPlan
from rag_stream.kinds.tokens import TokenOutput, token_phase
from rag_stream.schemas.events import Done, ErrorEvent, Event, FinishReason
from rag_stream.store.streams import FinishedStream
from rag_stream.streaming.context import StreamContext


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

    @property
    def initial_plan(self) -> GeneratePlan | None:
        """The plan before the slot (queue_ms 0): a takeover while the stream still waits for
        it starts the text over; the first run saves it again with its queue time."""
        return self.plan if self.first else None

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
        await self.kind.records.save(
            FinishedStream(
                tenant=ctx.tenant,
                stream_id=ctx.stream_id,
                kind=self.kind.name,
                model=self.model,
                finish_reason=reason,
                text=self.out.text,
                usage=usage.model_dump(),
            )
        )
        done = Done(
            id=event_id,
            finish_reason=reason,
            usage=usage,
            timings=run.timings(ctx.started, queue_ms=self.plan.queue_ms),
        )
        self.kind.metrics.observe_done(self.kind.name, done)
        return done


class GenerateKind(BaseKind[GeneratePlan]):
    name = "generate"
    plans = TypeAdapter(GeneratePlan)

    async def accept(self, prompt: Prompt, tenant: str) -> GenerateRun:
        """Check the prompt against the limits and the window; plan its generation."""
        engine = self.engines.get()
        if prompt.chars > self.limits.max_prompt_chars:
            raise PayloadTooLarge(
                f"prompt is {prompt.chars} characters; the limit is {self.limits.max_prompt_chars}"
            )
        text = engine.chat_prompt(prompt.messages) if prompt.messages else prompt.text
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        priority = priority_class(prompt.priority, len(ids), tenant, self.limits)
        sampling = fit_to_window(engine, ids, prompt.sampling)
        fitted = replace(sampling, priority=ENGINE_PRIORITY[priority])
        plan = GeneratePlan.of(ids, fitted, coalesce=prompt.coalesce, stop=list(prompt.stop))
        return GenerateRun(self, plan, engine.model_name, priority=priority)

    def continuation(self, plan_json: str, logged: Sequence[Event]) -> GenerateRun:
        plan = self.read_plan(plan_json)
        engine = self.engines.get()
        return GenerateRun(self, plan, engine.model_name, TokenOutput.from_log(logged), first=False)
