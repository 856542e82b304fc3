"""A job's state rebuilt from its logged events is the state its first run had."""

from __future__ import annotations

from rag_stream.kinds.job.state import JobState
from rag_stream.schemas.events import (
    EVENT_ADAPTER,
    Citation,
    JobStarted,
    Outline,
    SectionDone,
    SectionStarted,
    StreamStarted,
    Token,
)


def _citation(i: int, n: int, chunk: str) -> Citation:
    return Citation(
        id=i,
        n=n,
        chunk_id=chunk,
        document_id="d",
        title="t",
        heading=None,
        snippet="s",
        offsets=(0, 1),
        score=0.5,
    )


EVENTS = [
    StreamStarted(id=0, stream_id="s", model="m", created=1.0),
    JobStarted(id=1, job_id="j", kb_id="k", title="T", sections=2),
    Outline(id=2, headings=["A", "B"], planned=False),
    SectionStarted(id=3, index=0, heading="A"),
    _citation(4, 1, "c1"),
    Token(id=5, index=0, text="Hello ", token_ids=[1, 2], section=0),
    Token(id=6, index=2, text="[1].", token_ids=[3], section=0),
    SectionDone(id=7, index=0, tokens=4, finish_reason="stop"),
    SectionStarted(id=8, index=1, heading="B"),
    _citation(9, 2, "c2"),
    _citation(10, 1, "c1"),
    Token(id=11, index=0, text="More", token_ids=[4], section=1),
]


def test_the_log_gives_the_outline_the_finished_sections_and_the_interrupted_one() -> None:
    # through JSON, as a takeover reads them
    logged = [EVENT_ADAPTER.validate_json(e.model_dump_json()) for e in EVENTS]
    state = JobState.from_log(logged)
    assert state.outline is not None and state.outline.headings == ["A", "B"]
    assert [s.index for s in state.finished] == [0]
    assert state.finished[0].text == "Hello [1]." and state.finished[0].cited() == [1]
    current = state.current
    assert current is not None and current.index == 1
    assert current.ids == [4] and current.text == "More"
    assert [c.n for c in current.citations] == [2, 1]
    assert state.known_sources() == {"c1": 1, "c2": 2}
    assert state.tail_ids(1, 2) == [2, 3] and state.tail_ids(0, 2) == []


def test_token_events_of_other_streams_have_no_section_field() -> None:
    plain = Token(id=1, index=0, text="a", token_ids=[1]).model_dump_json()
    assert "section" not in plain
    tagged = Token(id=1, index=0, text="a", token_ids=[1], section=2).model_dump_json()
    assert '"section":2' in tagged
