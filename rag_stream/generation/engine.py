"""The small interface every engine implements, and the values it exchanges."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

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


@dataclass(frozen=True)
class EngineStep:
    """New token ids since the previous step of one request."""

    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    finish_reason: FinishReason | None = None


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
