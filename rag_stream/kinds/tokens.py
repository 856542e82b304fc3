"""The token phase every kind ends with: engine steps -> UTF-8-safe ``token`` events + usage.

Written once for first runs and for continuations after a takeover: a continuation passes the
token ids already in the log, which extend the prompt and seed the detokenizer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from rag_stream.generation.detokenize import Detokenizer, TextDelta
from rag_stream.generation.engine import Engine, EngineStep, Sampling, drive
from rag_stream.generation.stop_strings import StopStrings, first_stop
from rag_stream.kinds.plan import TokenPlan
from rag_stream.schemas.events import Event, FinishReason, Timings, Token, Usage
from rag_stream.schemas.generate import Coalesce
from rag_stream.streaming.context import StreamContext


@dataclass
class TokenRun:
    """What a finished token phase reports, filled in as it runs."""

    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: FinishReason = "error"

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )

    def timings(self, request_started: float, **extra: float) -> Timings:
        end = self.finished_at or time.monotonic()
        first = self.first_token_at or end
        decode_ms = (end - first) * 1000
        tpot = decode_ms / (self.completion_tokens - 1) if self.completion_tokens > 1 else 0.0
        return Timings(
            ttft_ms=(first - request_started) * 1000,
            decode_ms=decode_ms,
            tpot_ms=tpot,
            **extra,
        )


async def run_tokens(
    engine: Engine,
    request_id: str,
    prompt: str | Sequence[int],
    sampling: Sampling,
    run: TokenRun,
    on_delta: Callable[[TextDelta], bool],
    generated: Sequence[int] = (),
) -> None:
    """Hand each text delta of one generation to ``on_delta`` as the engine makes it; ``run``
    holds usage and timings when it ends. ``on_delta`` returning False ends the generation
    there (the engine request is aborted, and no held tail follows).

    Deltas are made in the engine's own loop when it pushes its steps (``drive``), so
    ``on_delta`` must not block. ``generated`` are token ids already produced for this answer
    (crash takeover): they seed the detokenizer so the first new delta continues the text
    exactly.
    """
    detok = Detokenizer(engine.tokenizer, generated)
    stop_ids = engine.stop_token_ids
    cut = False

    def on_step(step: EngineStep) -> bool:
        nonlocal cut
        if step.token_ids and run.first_token_at is None:
            run.first_token_at = time.monotonic()
        run.prompt_tokens = step.prompt_tokens
        run.cached_tokens = step.cached_tokens
        run.completion_tokens += len(step.token_ids)
        # One token at a time, however many a step brings (an engine handing over a burst to
        # a reader that fell behind, or a speculative step): an event then holds what the
        # stream's coalescing rule says, not whatever the engine's pace happened to be.
        for token_id in step.token_ids:
            if token_id not in stop_ids:
                delta = detok.push(token_id)
                if delta is not None and not on_delta(delta):
                    cut = True
                    return False
        if step.finish_reason is not None:
            run.finish_reason = step.finish_reason
        return True

    await drive(engine, request_id, prompt, sampling, on_step)
    if not cut:
        tail = detok.finish()
        if tail is not None:
            on_delta(tail)
    run.finished_at = run.finished_at or time.monotonic()


@dataclass
class TokenOutput:
    """A stream's generated text: the pieces and ids already logged (by an earlier owner, after
    a takeover) followed by this run's, with this run's usage and timings."""

    logged_ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    run: TokenRun = field(default_factory=TokenRun)

    @classmethod
    def from_log(cls, logged: Sequence[Event]) -> TokenOutput:
        tokens = [e for e in logged if isinstance(e, Token)]
        return cls([t for e in tokens for t in e.token_ids], [e.text for e in tokens])

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _one_token(d: TextDelta, event_id: int) -> Token:
    return Token(id=event_id, index=d.index, text=d.text, token_ids=d.token_ids)


def _token(deltas: Sequence[TextDelta], event_id: int) -> Token:
    if len(deltas) == 1:
        return _one_token(deltas[0], event_id)
    return Token(
        id=event_id,
        index=deltas[0].index,
        text="".join(d.text for d in deltas),
        token_ids=[t for d in deltas for t in d.token_ids],
    )


class Coalescer:
    """Turns text deltas into ``token`` events of up to ``rule.tokens`` tokens, sent when that
    many are ready or ``rule.ms`` after the first of them (see ``Coalesce``). A character split
    across more tokens than that still comes whole, in one event."""

    def __init__(self, ctx: StreamContext, rule: Coalesce, out: TokenOutput) -> None:
        self._emit = ctx.emit  # (a job's context tags its tokens with their section there)
        self._rule = rule
        self._out = out
        self._pending: list[TextDelta] = []
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None
        self._alone = rule.tokens <= 1 or rule.ms <= 0  # every delta is an event of its own

    def add(self, delta: TextDelta) -> None:
        if self._alone:  # (nothing is ever pending: the common rule, made short)
            self._emit(partial(_one_token, delta))
            self._out.pieces.append(delta.text)
            return
        self._pending.append(delta)
        self._count += len(delta.token_ids)
        if self._count >= self._rule.tokens or self._rule.ms <= 0:
            self.flush()
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._rule.ms / 1000, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        pending, self._pending, self._count = self._pending, [], 0
        self._emit(partial(_token, pending))
        self._out.pieces.extend(d.text for d in pending)


async def token_phase(
    ctx: StreamContext, engine: Engine, plan: TokenPlan, out: TokenOutput
) -> FinishReason:
    """Generate the rest of the plan's answer as ``token`` events; ``out.run`` ends up with
    usage for the whole answer (logged tokens included)."""
    run, logged = out.run, out.logged_ids
    run.prompt_tokens = len(plan.prompt_ids)
    if plan.max_tokens - len(logged) <= 0 or _stopped_before(engine, plan, logged):
        run.finish_reason = "length" if plan.max_tokens <= len(logged) else "stop"
        run.completion_tokens = len(logged)
        return run.finish_reason
    ctx.on_stop(lambda: engine.abort(ctx.run_id))
    prompt = [*plan.prompt_ids, *logged]
    sampling = plan.sampling(len(logged))
    events = Coalescer(ctx, plan.coalesce, out)
    stops = StopStrings(plan.stop)
    writer = ctx.writer

    def on_delta(delta: TextDelta) -> bool:
        shown = stops.push(delta)
        if shown is not None:
            events.add(shown)
        if stops.hit:
            run.finish_reason = "stop"
            run.finished_at = time.monotonic()
            return False
        return writer.stop_reason is None  # stopped (ctx.check below raises): no more

    def on_delta_unstopped(delta: TextDelta) -> bool:  # (no stop strings: the common case)
        events.add(delta)
        return writer.stop_reason is None

    if not stops:
        on_delta = on_delta_unstopped
    try:
        await run_tokens(engine, ctx.run_id, prompt, sampling, run, on_delta, logged)
        ctx.check()
        tail = stops.finish()
        if tail is not None:
            events.add(tail)
    finally:
        events.flush()  # whatever was generated goes out, whatever ends the phase
    run.completion_tokens += len(logged)
    run.prompt_tokens = len(plan.prompt_ids)
    return run.finish_reason


def _stopped_before(engine: Engine, plan: TokenPlan, logged: Sequence[int]) -> bool:
    """A continuation of a stream whose logged tokens already hold a stop sequence (the process
    died after logging them, before ending the stream): the answer is over."""
    if not plan.stop or not logged:
        return False
    return first_stop(engine.tokenizer.decode(logged, skip_special_tokens=True), plan.stop) >= 0
