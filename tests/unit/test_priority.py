"""Priority classes: a long prompt runs as batch, and the class reaches the engine and survives a
takeover (the plan in Redis carries it); the engine's step size is checked at start."""

from __future__ import annotations

from typing import Any

import pytest

from rag_stream.errors import ConfigError
from rag_stream.generation.engine import Sampling
from rag_stream.generation.priority import priority_class
from rag_stream.generation.slot import EngineSlot
from rag_stream.kinds.base import KindDeps
from rag_stream.kinds.generate.intent import Prompt, prompt_from_request
from rag_stream.kinds.generate.kind import GenerateKind
from rag_stream.metrics import Metrics
from rag_stream.schemas.generate import Coalesce, GenerateRequest
from rag_stream.settings import LimitsSettings, load_settings
from tests.support.fakes import stub_engine

LIMITS = LimitsSettings(long_prompt_tokens=100, long_prompt_interactive_tenants=["search"])


@pytest.mark.parametrize(
    ("requested", "tokens", "tenant", "expected"),
    [
        ("interactive", 99, "local", "interactive"),
        ("interactive", 100, "local", "batch"),  # the limit itself is long
        ("batch", 5, "local", "batch"),  # a short prompt may still ask for batch
        ("interactive", 5000, "search", "interactive"),  # a tenant allowed long prompts
        ("batch", 5000, "search", "batch"),  # ... which may still ask for batch
    ],
)
def test_a_long_prompt_is_batch_unless_its_tenant_may_keep_it_interactive(
    requested: Any, tokens: int, tenant: str, expected: str
) -> None:
    assert priority_class(requested, tokens, tenant, LIMITS) == expected


def _kind() -> GenerateKind:
    slot = EngineSlot()
    slot.set(stub_engine())  # one token per UTF-8 byte
    settings = load_settings(limits=LIMITS.model_dump())
    return GenerateKind(KindDeps(slot, None, None, None, Metrics(), settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prompt", "asked", "expected", "engine_priority"),
    [
        ("x" * 99, "interactive", "interactive", 0),
        ("x" * 100, "interactive", "batch", 1),
        ("short", "batch", "batch", 1),
    ],
)
async def test_the_class_reaches_the_ticket_the_engine_and_a_takeover(
    prompt: str, asked: Any, expected: str, engine_priority: int
) -> None:
    kind = _kind()
    request = GenerateRequest(prompt=prompt, priority=asked)
    run = await kind.accept(prompt_from_request(request, LIMITS, Coalesce()), "local")
    assert run.priority == expected  # what the route gives the admission ticket
    assert run.plan.sampling().priority == engine_priority  # what vLLM is asked
    later = kind.continuation(run.plan.model_dump_json(), [])
    assert later.plan.sampling(already_generated=3).priority == engine_priority


async def test_a_chat_asks_for_its_class_too() -> None:
    messages = [{"role": "user", "content": "hi"}]
    prompt = Prompt(Sampling(max_tokens=8), Coalesce(), messages=messages, priority="batch")
    run = await _kind().accept(prompt, "local")
    assert run.priority == "batch" and run.plan.sampling().priority == 1


def test_a_step_must_hold_a_token_of_every_running_sequence() -> None:
    with pytest.raises(ConfigError, match=r"RAG_STREAM_ENGINE: .*\(16\) must be at least max_n"):
        load_settings(engine={"max_num_seqs": 32, "max_num_batched_tokens": 16})
    assert load_settings(engine={"max_num_batched_tokens": 512}).engine.max_num_batched_tokens
