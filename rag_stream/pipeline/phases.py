"""The token phase every pipeline ends with, written once for first runs and takeovers."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from rag_stream.generation.detokenize import TextDelta
from rag_stream.pipeline.context import StreamContext
from rag_stream.pipeline.plan import Plan
from rag_stream.pipeline.tokens import run_tokens
from rag_stream.schemas.events import Token


def _token(delta: TextDelta, event_id: int) -> Token:
    return Token(id=event_id, index=delta.index, text=delta.text, token_ids=delta.token_ids)


async def token_phase(ctx: StreamContext, plan: Plan, generated: Sequence[int] = ()) -> None:
    """Generate from the plan's prompt plus ``generated`` (ids already in the log), emitting
    token events; ``ctx.run`` ends up with usage for the whole answer."""
    ctx.run.prompt_tokens = len(plan.prompt_ids)
    remaining = plan.max_tokens - len(generated)
    if remaining <= 0:
        ctx.run.finish_reason = "length"
        ctx.run.completion_tokens = len(generated)
        return
    prompt = [*plan.prompt_ids, *generated]
    async for delta in run_tokens(
        ctx.engine, ctx.request_id, prompt, plan.sampling(len(generated)), ctx.run, generated
    ):
        ctx.emit(partial(_token, delta))
        ctx.text.append(delta.text)
        ctx.check()
    ctx.run.completion_tokens += len(generated)
    ctx.run.prompt_tokens = len(plan.prompt_ids)
    ctx.check()
