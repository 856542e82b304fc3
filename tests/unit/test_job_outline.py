"""Parsing a planned outline: exactly N headings or nothing; a job's engine requests share one
replica key."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from rag_stream.generation.engine import EngineStep, Sampling
from rag_stream.kinds.job.outline import OutlineFailed, parse_outline, plan_outline
from rag_stream.kinds.job.section import SectionPlan
from rag_stream.schemas.jobs import JobSpec


@pytest.mark.parametrize(
    "reply",
    [
        "Origins\nThe keepers\nThe lamp",
        "1. Origins\n2. The keepers\n3. The lamp",
        "Here is the outline:\n\n- Origins\n- The keepers\n- The lamp\n",
        "## Origins\n## The keepers\n## The lamp",
        "1) **Origins**\n2) **The keepers**\n3) **The lamp**",
        "Section 1: Origins\nSection 2: The keepers\nSection 3: The lamp",
        "I. Origins\nII. The keepers\nIII. The lamp",
    ],
)
def test_numbering_bullets_and_an_introduction_are_stripped(reply: str) -> None:
    assert parse_outline(reply, 3, 200) == ["Origins", "The keepers", "The lamp"]


@pytest.mark.parametrize(
    "reply",
    [
        "Origins\nThe keepers",  # too few
        "Origins\nThe keepers\nThe lamp\nThe storm",  # too many
        "1.\n2.\n3.",  # numbers only
        "",
        "Origins:\nKeepers:\nLamp:",  # sub-point introductions, not headings
        "Origins\nThe keepers\n" + "x" * 201,  # a heading over the limit
    ],
)
def test_anything_but_exactly_n_headings_is_refused(reply: str) -> None:
    assert parse_outline(reply, 3, 200) is None


class _Recording:
    """A stub engine that records the sampling of each request (the replica routing key)."""

    def __init__(self) -> None:
        from tests.support.fakes import stub_engine

        self._engine = stub_engine()
        self.tokenizer = self._engine.tokenizer
        self.stop_token_ids = self._engine.stop_token_ids
        self.affinities: list[str | None] = []

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return self._engine.chat_prompt(messages)

    def generate(
        self, request_id: str, prompt: str, sampling: Sampling
    ) -> AsyncIterator[EngineStep]:
        self.affinities.append(sampling.affinity)
        return self._engine.generate(request_id, prompt, sampling)

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)


class _Running:
    """A stream context that is never stopped (what plan_outline asks of one)."""

    run_id = "r"

    def check(self) -> None:
        return None

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        return None


async def test_a_planned_outline_goes_where_the_job_sections_go() -> None:
    engine = _Recording()
    spec = JobSpec(title="T", sections=3, section_tokens=32, top_k=2)
    with pytest.raises(OutlineFailed):  # the stub's text is no outline: both attempts run
        await plan_outline(_Running(), engine, spec, 8, 200, 1, affinity="job:abc")  # type: ignore[arg-type]
    assert engine.affinities == ["job:abc", "job:abc"]


def test_a_section_plan_keeps_its_replica_key_through_the_log() -> None:
    # a takeover rebuilds the section's request from the saved plan: same replica
    plan = SectionPlan.of(
        [1, 2, 3], Sampling(max_tokens=8, affinity="job:abc"), index=0, heading="H", citations=[]
    )
    again = SectionPlan.model_validate_json(plan.model_dump_json())
    assert again.sampling(already_generated=2).affinity == "job:abc"
