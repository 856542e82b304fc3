"""An event's JSON is made once and shared by the log and the SSE frame (``as_json``): it must
be the JSON of the event as it is, whatever was done to make it."""

from __future__ import annotations

import pydantic
import pytest

from rag_stream.schemas.events import EVENT_ADAPTER, Done, Event, Token
from rag_stream.streaming.sse import frame


def test_as_json_is_the_events_json_and_the_frames_data() -> None:
    # a started, two tokens (one with a job's section) and a done: the field shapes events have
    events: list[Event] = [
        EVENT_ADAPTER.validate_python(
            {"id": 0, "type": "stream", "stream_id": "s", "model": "m", "created": 1.5}
        ),
        Token(id=1, index=0, text='a "quoted"\nline', token_ids=[7]),
        Token(id=2, index=1, text="你", token_ids=[8, 9], section=0),
        Done(id=3, finish_reason="stop"),
    ]
    for event in events:
        assert event.as_json == event.model_dump_json()
        assert EVENT_ADAPTER.validate_json(event.as_json) == event
        assert frame(event).decode().split("data: ", 1)[1] == event.as_json + "\n\n"


def test_a_copy_with_other_fields_has_its_own_json() -> None:
    token = Token(id=4, index=3, text="x", token_ids=[1])
    before = token.as_json  # cached on the original first
    moved = token.model_copy(update={"section": 2})
    assert moved.as_json == moved.model_dump_json() != before
    assert '"section":2' in moved.as_json and "section" not in before
    done = Done(id=5, finish_reason="cancelled")
    assert '"abandoned":false' in done.as_json
    assert '"abandoned":true' in done.model_copy(update={"abandoned": True}).as_json


def test_events_cannot_change_after_their_json_is_made() -> None:
    token = Token(id=6, index=5, text="y", token_ids=[2])
    assert token.as_json
    with pytest.raises(pydantic.ValidationError):
        token.text = "z"  # type: ignore[misc]
