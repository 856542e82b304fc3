"""``generation/engine.drive`` on an engine that does not push its steps: the caller's task pulls
them from ``generate``, and a handler that says no more ends the request as the vLLM engine's
push does (aborted, its generator closed at once, no step after). The push itself, on real
vLLM: tests/integration/test_engine_push.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from rag_stream.generation.engine import EngineStep, PushesSteps, Sampling, drive


class PulledEngine:
    """Steps of one token each; records aborts and whether its generator was closed."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.closed = False

    async def generate(
        self, request_id: str, prompt: str | Sequence[int], sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        try:
            for i in range(sampling.max_tokens):
                last = i == sampling.max_tokens - 1
                yield EngineStep([i], 3, 0, "length" if last else None)
        finally:
            self.closed = True

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


async def test_every_step_reaches_the_handler_until_the_last() -> None:
    engine = PulledEngine()
    assert not isinstance(engine, PushesSteps)
    seen: list[EngineStep] = []

    def on_step(step: EngineStep) -> bool:
        seen.append(step)
        return True

    await drive(engine, "r", [1, 2, 3], Sampling(5), on_step)  # type: ignore[arg-type]
    assert [s.token_ids for s in seen] == [[0], [1], [2], [3], [4]]
    assert seen[-1].finish_reason == "length"
    assert engine.aborted == [] and engine.closed


async def test_a_handler_that_says_no_more_aborts_the_request_and_closes_its_steps() -> None:
    engine = PulledEngine()
    seen: list[EngineStep] = []

    def on_step(step: EngineStep) -> bool:
        seen.append(step)
        return len(seen) < 2

    await drive(engine, "r", [1, 2, 3], Sampling(100), on_step)  # type: ignore[arg-type]
    assert len(seen) == 2 and seen[-1].finish_reason is None  # still running when told
    assert engine.aborted == ["r"]
    assert engine.closed  # at once, not whenever the generator is collected
