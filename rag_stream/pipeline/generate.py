"""Plain generation: a prompt in, ``stream``, ``token``... and ``done`` events out."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence

from rag_stream.errors import InvalidRequest, PayloadTooLarge, RagStreamError
from rag_stream.generation.engine import Engine, Sampling
from rag_stream.pipeline.tokens import TokenRun, run_tokens
from rag_stream.schemas.events import Done, ErrorEvent, Event, StreamStarted, Token
from rag_stream.settings import LimitsSettings

log = logging.getLogger(__name__)


def new_stream_id() -> str:
    return secrets.token_urlsafe(24)  # 192 random bits


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


def error_event(event_id: int, exc: BaseException) -> ErrorEvent:
    if isinstance(exc, RagStreamError):
        return ErrorEvent(id=event_id, code=exc.code, message=exc.message)
    log.exception("stream failed", exc_info=exc)
    return ErrorEvent(id=event_id, code="internal_error", message="generation failed unexpectedly")


async def generate_events(
    engine: Engine, prompt_ids: Sequence[int], sampling: Sampling, stream_id: str
) -> AsyncIterator[Event]:
    started = time.monotonic()
    next_id = 0
    yield StreamStarted(
        id=next_id, stream_id=stream_id, model=engine.model_name, created=time.time()
    )
    next_id += 1
    run = TokenRun()
    finished = False
    try:
        async for delta in run_tokens(engine, stream_id, prompt_ids, sampling, run):
            yield Token(id=next_id, index=delta.index, text=delta.text, token_ids=delta.token_ids)
            next_id += 1
        finished = True
        yield Done(
            id=next_id,
            finish_reason=run.finish_reason,
            usage=run.usage(),
            timings=run.timings(started),
        )
    except Exception as exc:
        finished = True
        yield error_event(next_id, exc)
    finally:
        if not finished:  # the consumer went away: free the engine slot
            await engine.abort(stream_id)
