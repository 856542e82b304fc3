"""The token phase shared by every pipeline: engine steps -> UTF-8-safe text deltas + usage."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from rag_stream.generation.detokenize import Detokenizer, TextDelta
from rag_stream.generation.engine import Engine, FinishReason, Sampling
from rag_stream.schemas.events import Timings, Usage


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
    generated: Sequence[int] = (),
) -> AsyncIterator[TextDelta]:
    """Yield text deltas of one generation; ``run`` holds usage and timings when it ends.

    ``generated`` are token ids already produced for this answer (crash takeover): they seed the
    detokenizer so the first new delta continues the text exactly.
    """
    detok = Detokenizer(engine.tokenizer, generated)
    async for step in engine.generate(request_id, prompt, sampling):
        if step.token_ids and run.first_token_at is None:
            run.first_token_at = time.monotonic()
        run.prompt_tokens = step.prompt_tokens
        run.cached_tokens = step.cached_tokens
        run.completion_tokens += len(step.token_ids)
        ids = [t for t in step.token_ids if t not in engine.stop_token_ids]
        delta = detok.push(ids) if ids else None
        if delta is not None:
            yield delta
        if step.finish_reason is not None:
            run.finish_reason = step.finish_reason
            break
    tail = detok.finish()
    if tail is not None:
        yield tail
    run.finished_at = time.monotonic()
