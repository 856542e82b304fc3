"""Plain generation: a prompt in; ``stream``, ``token``... and ``done`` events out."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import InvalidRequest, PayloadTooLarge
from rag_stream.generation.engine import Engine, FinishReason, Sampling
from rag_stream.metrics import Metrics
from rag_stream.pipeline.context import Finalizer, StreamContext
from rag_stream.pipeline.phases import token_phase
from rag_stream.pipeline.plan import Plan
from rag_stream.schemas.events import Done
from rag_stream.settings import LimitsSettings
from rag_stream.store.models import StreamRecord


def make_sampling(
    limits: LimitsSettings,
    max_tokens: int | None,
    temperature: float,
    top_p: float,
    seed: int | None,
) -> Sampling:
    wanted = limits.default_max_tokens if max_tokens is None else max_tokens
    if not 1 <= wanted <= limits.max_tokens:
        raise InvalidRequest(f"max_tokens must be between 1 and {limits.max_tokens}, got {wanted}")
    return Sampling(max_tokens=wanted, temperature=temperature, top_p=top_p, seed=seed)


def fit_to_window(engine: Engine, prompt_ids: Sequence[int], sampling: Sampling) -> Sampling:
    """Refuse prompts that fill the window; shorten max_tokens to what still fits."""
    room = engine.max_model_len - len(prompt_ids)
    if room < 1:
        raise PayloadTooLarge(
            f"prompt is {len(prompt_ids)} tokens; the model's context window is "
            f"{engine.max_model_len} tokens"
        )
    if sampling.max_tokens <= room:
        return sampling
    return Sampling(room, sampling.temperature, sampling.top_p, sampling.seed)


def generation_plan(prompt_ids: Sequence[int], sampling: Sampling) -> Plan:
    return Plan(
        kind="generate",
        prompt_ids=list(prompt_ids),
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
    )


async def generate_body(ctx: StreamContext, plan: Plan) -> None:
    await ctx.save_plan(plan)
    await token_phase(ctx, plan)


def make_generate_finalizer(
    sessions: async_sessionmaker[AsyncSession], metrics: Metrics
) -> Finalizer:
    async def finalize(ctx: StreamContext, reason: FinishReason, event_id: int) -> Done:
        ctx.run.finish_reason = reason
        usage = ctx.run.usage()
        async with sessions() as session:
            await session.merge(
                StreamRecord(
                    id=ctx.stream_id,
                    kind="generate",
                    model=ctx.engine.model_name,
                    conversation_id=None,
                    finish_reason=reason,
                    text="".join(ctx.text),
                    usage=usage.model_dump(),
                )
            )
            await session.commit()
        done = Done(
            id=event_id,
            finish_reason=reason,
            usage=usage,
            timings=ctx.run.timings(ctx.started, queue_ms=ctx.queue_ms),
        )
        metrics.observe_done("generate", done)
        return done

    return finalize


def elapsed_ms(since: float) -> float:
    return (time.monotonic() - since) * 1000
