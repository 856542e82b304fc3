"""The in-process vLLM engine hands each step to its request's handler from inside vLLM's own
output handler (``PushesSteps``, real vLLM, tiny model, float32): the same greedy tokens as
pulling them through ``generate``, no task of the caller's woken a step, and a request the
handler ends (by saying no more, by raising, or by its caller being cancelled) is aborted in the
engine, not left running for nobody.

Every kind's token phase goes through this path on the real engine, so the suite's other
real-engine tests (takeovers, stop strings, cancels, coalescing) run on it too; this module
checks what only shows from inside: where the handler runs, and what the engine still holds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rag_stream.generation.engine import EngineStep, PushesSteps, Sampling, drive
from rag_stream.generation.vllm_engine import VLLMEngine
from rag_stream.settings import load_settings

pytestmark = pytest.mark.engine

PROMPT = "The history of the printing press begins"
LONG = Sampling(max_tokens=1500)  # far more than any test here lets it make
_AFTER = itertools.count()


@pytest.fixture(scope="module")
async def engine(tiny_model: Path) -> AsyncIterator[VLLMEngine]:
    settings = load_settings(
        model=str(tiny_model),
        dtype="float32",
        engine={"max_model_len": 2048, "kv_cache_gb": 0.25, "max_num_seqs": 4, "cpu_threads": 1},
    )
    started = await VLLMEngine.start(settings)
    yield started
    await started.close()


class Recorder:
    """A step handler keeping every step, and whether vLLM's output handler called it."""

    def __init__(self, engine: VLLMEngine) -> None:
        self._engine = engine
        self.steps: list[EngineStep] = []
        self.in_handler: list[bool] = []

    def __call__(self, step: EngineStep) -> bool:
        self.steps.append(step)
        self.in_handler.append(asyncio.current_task() is self._engine._llm.output_handler)
        return True


def _held(engine: VLLMEngine) -> list[str]:
    """The requests vLLM's front end still holds (an aborted or finished one is gone)."""
    return list(engine._llm.output_processor.request_states)


async def test_steps_come_from_the_output_handler_and_match_pulling(engine: VLLMEngine) -> None:
    assert isinstance(engine, PushesSteps)
    pulled = [s async for s in engine.generate("pull", PROMPT, Sampling(max_tokens=24))]
    on_step = Recorder(engine)
    await drive(engine, "push", PROMPT, Sampling(max_tokens=24), on_step)
    steps, in_handler = on_step.steps, on_step.in_handler
    assert in_handler and all(in_handler)
    assert [t for s in steps for t in s.token_ids] == [t for s in pulled for t in s.token_ids]
    assert len([t for s in steps for t in s.token_ids]) == 24
    assert steps[-1].finish_reason == "length"
    assert all(s.finish_reason is None for s in steps[:-1])
    assert _held(engine) == []


async def test_a_handler_that_says_no_more_ends_the_request(engine: VLLMEngine) -> None:
    seen: list[EngineStep] = []

    def on_step(step: EngineStep) -> bool:
        seen.append(step)
        return sum(len(s.token_ids) for s in seen) < 3

    await drive(engine, "enough", PROMPT, LONG, on_step)
    # still running when it was told (no finish reason), then never heard from again
    assert all(s.finish_reason is None for s in seen)
    assert sum(len(s.token_ids) for s in seen) == 3
    assert _held(engine) == []
    assert await _answers(engine)  # the engine goes on serving


async def test_a_handler_that_raises_ends_the_request_with_its_error(engine: VLLMEngine) -> None:
    calls = 0

    def on_step(step: EngineStep) -> bool:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ValueError("the handler's own fault")
        return True

    with pytest.raises(ValueError, match="the handler's own fault"):
        await drive(engine, "raising", PROMPT, LONG, on_step)
    assert calls == 2
    assert _held(engine) == []
    assert await _answers(engine)


async def test_cancelling_the_caller_aborts_the_request(engine: VLLMEngine) -> None:
    running = asyncio.Event()

    def on_step(step: EngineStep) -> bool:
        running.set()
        return True

    task = asyncio.create_task(drive(engine, "cancelled", PROMPT, LONG, on_step))
    await running.wait()
    assert len(_held(engine)) == 1  # it runs, steps coming
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _held(engine) == []
    assert await _answers(engine)


async def _answers(engine: VLLMEngine, tokens: int = 4) -> list[int]:
    ids: list[int] = []

    def on_step(step: EngineStep) -> bool:
        ids.extend(step.token_ids)
        return True

    await drive(engine, f"after-{next(_AFTER)}", PROMPT, Sampling(max_tokens=tokens), on_step)
    return ids


async def test_a_vllm_whose_collectors_take_no_put_is_pulled(engine: VLLMEngine) -> None:
    """``_collectors_take_put`` found the installed vLLM's contract (the test above pushes);
    where a release lacks it, the engine pulls its steps, with the same tokens, rather than
    wait for calls that never come."""
    on_step = Recorder(engine)
    pushed = await _answers(engine, 12)
    engine._pushes = False
    try:
        await drive(engine, "pulled", PROMPT, Sampling(max_tokens=12), on_step)
    finally:
        engine._pushes = True
    steps, in_handler = on_step.steps, on_step.in_handler
    assert in_handler and not any(in_handler)
    assert [t for s in steps for t in s.token_ids] == pushed
    assert _held(engine) == []
