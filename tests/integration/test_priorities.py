"""Interactive requests overtake batch ones waiting in the engine's queue (real vLLM, tiny model).

The engine runs one sequence at a time (``max_num_seqs=1``). A batch request is running; three
more wait for the engine: two that asked for ``batch`` and one that asked for ``interactive``
with a long prompt (``limits.long_prompt_tokens``), which makes it batch too. Then a short
interactive request arrives. Under the ``priority`` policy it starts as soon as the running
request ends, before the three that came earlier; under ``fcfs`` it starts last, so the test
fails if the class never reaches the engine. Requests are planned by the ``generate`` kind, as
the API plans them, and sent with their plan's sampling, as the token phase sends them.

The engine cores are stopped (SIGSTOP, tests/support/brake.py) while the four queue up, so the
running request cannot end before they are all waiting, however slow the machine; it then needs
only a few steps more than the engine takes to read them.

Each policy is one module fixture that runs the scenario on its engine and returns the order in
which the requests got their first token; both engines start at once, when the module begins.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest

from rag_stream.generation.slot import EngineSlot
from rag_stream.generation.vllm_engine import VLLMEngine
from rag_stream.kinds.base import KindDeps
from rag_stream.kinds.generate.intent import prompt_from_request
from rag_stream.kinds.generate.kind import GenerateKind
from rag_stream.metrics import Metrics
from rag_stream.schemas.generate import Coalesce, GenerateRequest
from rag_stream.settings import load_settings
from tests.support.brake import Brake, engine_cores

pytestmark = pytest.mark.engine

Policy = Literal["priority", "fcfs"]
LONG_PROMPT = 64  # tokens: limits.long_prompt_tokens here
# (name, priority asked for, prompt, tokens), in the order they are sent. The first keeps the
# engine busy while the others queue behind it.
REQUESTS = [
    ("running", "batch", "The first request.", 200),
    ("batch-1", "batch", "The second request.", 40),
    ("batch-2", "batch", "The third request.", 40),
    ("long", "interactive", "A long prompt. " + "word " * 2 * LONG_PROMPT, 40),
    ("interactive", "interactive", "A short question.", 40),
]
EXPECTED = {
    "priority": ["running", "interactive", "batch-1", "batch-2", "long"],
    "fcfs": ["running", "batch-1", "batch-2", "long", "interactive"],
}


async def _first_tokens(engine: VLLMEngine, kind: GenerateKind) -> dict[str, float]:
    """Send REQUESTS in order: the first alone until it generates, then the others 50 ms apart;
    the time of each one's first token."""
    first: dict[str, float] = {}
    running = asyncio.Event()

    async def one(name: str, asked: Literal["interactive", "batch"], prompt: str, n: int) -> None:
        request = GenerateRequest(prompt=prompt, max_tokens=n, priority=asked)
        run = await kind.accept(prompt_from_request(request, kind.limits, Coalesce()), "local")
        # random weights may end early at EOS: lengths are fixed so the queue really forms
        sampling = replace(run.plan.sampling(), ignore_eos=True)
        async for step in engine.generate(f"prio-{name}", run.plan.prompt_ids, sampling):
            if step.token_ids and name not in first:
                first[name] = time.monotonic()
                running.set()

    tasks = [asyncio.create_task(one(*REQUESTS[0]))]
    await asyncio.wait_for(running.wait(), 60)
    # the engine cores this process spawned (both policies'), not those of servers it started
    # (a run without lanes has them as grandchildren)
    brake = Brake(engine_cores(os.getpid(), direct=True))
    brake.stop()
    try:
        for request in REQUESTS[1:]:
            tasks.append(asyncio.create_task(one(*request)))
            await asyncio.sleep(0.05)  # arrival order is what fcfs goes by
    finally:
        brake.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    return first


async def _scenario(started: asyncio.Task[VLLMEngine]) -> list[str]:
    engine = await started
    slot = EngineSlot()
    slot.set(engine)
    settings = load_settings(limits={"long_prompt_tokens": LONG_PROMPT})
    kind = GenerateKind(KindDeps(slot, None, None, None, Metrics(), settings))  # type: ignore[arg-type]
    first = await _first_tokens(engine, kind)
    return sorted(first, key=first.__getitem__)


@pytest.fixture(scope="module")
async def engines(tiny_model: Path) -> AsyncIterator[dict[Policy, asyncio.Task[VLLMEngine]]]:
    def start(policy: Policy) -> asyncio.Task[VLLMEngine]:
        settings = load_settings(
            model=str(tiny_model),
            dtype="float32",
            engine={
                "max_model_len": 2048,
                "kv_cache_gb": 0.25,
                "max_num_seqs": 1,
                "scheduling_policy": policy,
                # one thread, as the test profile: on two cores shared with the other lane, a
                # second thread waits on a busy core at every step (drafts stay on, the default)
                "cpu_threads": 1,
            },
        )
        return asyncio.create_task(VLLMEngine.start(settings))

    started = {"priority": start("priority"), "fcfs": start("fcfs")}
    yield started
    for task in started.values():
        await (await task).close()


@pytest.fixture(scope="module")
async def priority_order(engines: dict[Policy, asyncio.Task[VLLMEngine]]) -> list[str]:
    return await _scenario(engines["priority"])


@pytest.fixture(scope="module")
async def fcfs_order(engines: dict[Policy, asyncio.Task[VLLMEngine]]) -> list[str]:
    return await _scenario(engines["fcfs"])


def test_interactive_overtakes_batch_requests_waiting_in_the_engine(
    priority_order: list[str],
) -> None:
    assert priority_order == EXPECTED["priority"]


def test_without_priorities_the_same_requests_run_in_arrival_order(
    fcfs_order: list[str],
) -> None:
    assert fcfs_order == EXPECTED["fcfs"]
