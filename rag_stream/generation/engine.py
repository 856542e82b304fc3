"""The small interface every engine implements, and the values it exchanges."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rag_stream.schemas.events import FinishReason


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # keep generating past end-of-sequence (benchmarks: fixed lengths)
    # Waiting requests are taken lowest first (generation/priority.py): 0 interactive, 1 batch.
    priority: int = 0
    # Requests with the same key go to the same engine replica (remote engines): a
    # conversation's key, so its turns find their prefix cached there. None: the prompt's start.
    affinity: str | None = None


@dataclass(slots=True)  # (not frozen: one a token, and a frozen init costs four times as much)
class EngineStep:
    """New token ids since the previous step of one request."""

    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    finish_reason: FinishReason | None = None


# What a caller does with each step of its request (``drive``); False ends the request there.
StepHandler = Callable[[EngineStep], bool]


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class Engine(Protocol):
    model_name: str
    max_model_len: int
    tokenizer: Tokenizer
    stop_token_ids: frozenset[int]
    # Prefix caching reuses whole KV blocks of this many tokens (128 on the CPU build).
    cache_block_size: int

    def generate(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        """Stream the tokens of one request; the last step has a finish_reason."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def reachable(self) -> bool:
        """Whether a request can be served now: an in-process engine whose core is alive, or
        at least one healthy replica."""
        ...

    async def wait_dead(self) -> None:
        """Return once this engine can never serve again (an in-process engine whose core
        died); an engine that can recover (remote replicas) never returns."""
        ...

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """The model's chat template applied to messages, ready for generation."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class PushesSteps(Protocol):
    """An engine that hands each step to its request's handler itself, as the step comes out of
    the engine (vLLM's output handler hands one engine step's outputs to all its requests in
    one turn of the event loop): no task of the caller's wakes for a step."""

    async def push_steps(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling, on_step: StepHandler
    ) -> None:
        """Call ``on_step`` with each step of one request and return once the request ended:
        after its last step, after ``on_step`` returned False (the request is then aborted and
        hears no more), or with the error that ended it (an exception of ``on_step``'s
        included). ``on_step`` runs inside the engine's own loop: it must not block."""
        ...


async def drive(
    engine: Engine,
    request_id: str,
    prompt: str | Sequence[int],
    sampling: Sampling,
    on_step: StepHandler,
) -> None:
    """Run one request, handing each of its steps to ``on_step`` (see ``PushesSteps``): pushed by
    an engine that can, else pulled from ``generate`` by the calling task."""
    if isinstance(engine, PushesSteps):
        await engine.push_steps(request_id, prompt, sampling, on_step)
        return
    await pull_steps(engine, request_id, prompt, sampling, on_step)


async def pull_steps(
    engine: Engine,
    request_id: str,
    prompt: str | Sequence[int],
    sampling: Sampling,
    on_step: StepHandler,
) -> None:
    """``drive`` by the calling task: each step pulled from ``generate``."""
    steps = engine.generate(request_id, prompt, sampling)
    try:
        async for step in steps:
            if not on_step(step):
                await engine.abort(request_id)
                return
            if step.finish_reason is not None:
                return
    finally:
        if isinstance(steps, AsyncGenerator):
            await steps.aclose()
