"""A test double for the Engine interface: emits a fixed text's tokens as fast as it can.

Used by protocol-level unit tests and to measure the SSE/event-log layer alone (benchmarks);
never by the service itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from rag_stream.generation.engine import EngineStep, Sampling, Tokenizer

DEFAULT_TEXT = (
    "Resumable streams survive the client, the network and the server. 断点续传不会丢失任何词元。 "
)


class StubEngine:
    def __init__(
        self,
        tokenizer: Tokenizer,
        text: str = DEFAULT_TEXT,
        model_name: str = "stub",
        max_model_len: int = 8192,
        delay_s: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.stop_token_ids: frozenset[int] = frozenset()
        self.cache_block_size = 128
        self._ids = tokenizer.encode(text, add_special_tokens=False)
        self._delay = delay_s
        self._aborted: set[str] = set()

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "

    async def generate(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        n_prompt = len(self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt)
        # the token at absolute position p is always the same, so a continuation from
        # prompt + generated ids (crash takeover) picks up exactly where the first run stopped
        try:
            for i in range(sampling.max_tokens):
                if request_id in self._aborted:
                    yield EngineStep([], n_prompt, 0, "cancelled")
                    return
                await asyncio.sleep(self._delay)
                token = self._ids[(n_prompt + i) % len(self._ids)]
                last = i == sampling.max_tokens - 1
                yield EngineStep([token], n_prompt, 0, "length" if last else None)
        finally:
            self._aborted.discard(request_id)  # (soaks run on this engine: keep nothing)

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    def reachable(self) -> bool:
        return True

    async def wait_dead(self) -> None:
        await asyncio.get_running_loop().create_future()  # never

    async def close(self) -> None:
        return None
