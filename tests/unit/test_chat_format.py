"""The chat-completions renderer on made-up events: frames, ids, sources, annotations, resume."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rag_stream.api.chat_format import ChatChunks
from rag_stream.schemas.events import (
    Citation,
    Done,
    ErrorEvent,
    Event,
    StreamStarted,
    Token,
    Usage,
)
from rag_stream.schemas.openai import ChatCompletionRequest, ChatWire

WIRE = ChatWire(model="kb:docs", kb="docs", chunk_url_base="http://h:1", include_usage=True)


def _citation(i: int, n: int) -> Citation:
    return Citation(
        id=i,
        n=n,
        chunk_id=f"c{n}",
        document_id="d",
        title=f"T{n}",
        heading=None,
        snippet=f"snippet {n}",
        offsets=(0, 5),
        score=1.0 / n,
    )


def _events() -> list[Event]:
    pieces = ["Quimby ", "[1]", " and ", "[2", "]", "; not [9]."]
    return [
        StreamStarted(id=0, stream_id="S", model="m", created=1700000000.5),
        _citation(1, 1),
        _citation(2, 2),
        *[Token(id=3 + i, index=i, text=p, token_ids=[i]) for i, p in enumerate(pieces)],
        Done(
            id=3 + len(pieces),
            finish_reason="stop",
            usage=Usage(prompt_tokens=300, completion_tokens=6, cached_tokens=256),
        ),
    ]


def _parse(raw: bytes) -> list[tuple[str | None, Any]]:
    """(id, data) per frame; data is JSON, or the string [DONE]."""
    frames = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        data = fields["data"]
        frames.append((fields.get("id"), data if data == "[DONE]" else json.loads(data)))
    return frames


def test_a_stream_renders_as_openai_chunks() -> None:
    events = _events()
    chunks = ChatChunks(WIRE)
    frames = _parse(chunks.frames(events[:3]) + chunks.frames(events[3:]))
    ids = [f[0] for f in frames]
    first = frames[0][1]
    assert first["id"] == "chatcmpl-S" and first["created"] == 1700000000
    assert first["object"] == "chat.completion.chunk" and first["model"] == "kb:docs"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "usage" in first and first["usage"] is None  # include_usage: null until the end
    # both citations in one chunk, with the id of the last one
    assert ids[1] == "2"
    sources = frames[1][1]
    assert [s["n"] for s in sources["search_results"]] == [1, 2]
    assert sources["citations"] == [
        "http://h:1/v1/kbs/docs/chunks/c1",
        "http://h:1/v1/kbs/docs/chunks/c2",
    ]
    assert sources["search_results"][0]["url"] == sources["citations"][0]
    contents = [f[1]["choices"][0]["delta"]["content"] for f in frames[2:8]]
    assert "".join(contents) == "Quimby [1] and [2]; not [9]."
    assert ids[2:8] == [str(i) for i in range(3, 9)]
    # the end: annotations, finish, usage, [DONE]; only [DONE] carries the done event's id
    annotations, finish, usage, done = frames[8:]
    assert [annotations[0], finish[0], usage[0]] == [None, None, None]
    assert done == ("9", "[DONE]")
    marks = annotations[1]["choices"][0]["delta"]["annotations"]
    text = "".join(contents)
    assert [(m["url_citation"]["start_index"], m["url_citation"]["end_index"]) for m in marks] == [
        (7, 10),
        (15, 18),
    ]
    for m in marks:
        cite = m["url_citation"]
        assert m["type"] == "url_citation"
        assert text[cite["start_index"] : cite["end_index"]] == f"[{cite['title'][1:]}]"
    assert finish[1]["choices"][0]["finish_reason"] == "stop"
    assert usage[1]["choices"] == []
    assert usage[1]["usage"] == {
        "prompt_tokens": 300,
        "completion_tokens": 6,
        "total_tokens": 306,
        "prompt_tokens_details": {"cached_tokens": 256},
    }


def _answer(pieces: list[str], sources: int = 3) -> list[Event]:
    cites = [_citation(1 + i, 1 + i) for i in range(sources)]
    first = 1 + sources
    tokens = [Token(id=first + i, index=i, text=p, token_ids=[i]) for i, p in enumerate(pieces)]
    done = Done(id=first + len(pieces), finish_reason="stop")
    return [StreamStarted(id=0, stream_id="S", model="m", created=1.0), *cites, *tokens, done]


def _annotations(frames: list[tuple[str | None, Any]]) -> list[dict[str, Any]]:
    return [
        a["url_citation"]
        for _, data in frames
        if isinstance(data, dict) and data.get("choices")
        for a in data["choices"][0]["delta"].get("annotations", [])
    ]


def test_annotations_name_each_cited_source_once_in_n_order() -> None:
    # Open WebUI numbers sources as they arrive: "[3] ... [1] ... [3]" must still give 1 then 3
    text = ["See [3]", " then [1]", " and [3] again."]
    frames = _parse(ChatChunks(WIRE).frames(_answer(text)))
    marks = _annotations(frames)
    assert [m["title"] for m in marks] == ["T1", "T3"]
    whole = "".join(text)
    assert [whole[m["start_index"] : m["end_index"]] for m in marks] == ["[1]", "[3]"]
    assert marks[1]["start_index"] == whole.index("[3]")  # the first [3]


def test_open_webui_shape_sends_one_source_event_per_source_before_the_answer() -> None:
    wire = WIRE.model_copy(update={"sources": "open-webui"})
    frames = _parse(ChatChunks(wire).frames(_answer(["No markers at all."])))
    events = [data["event"] for _, data in frames if isinstance(data, dict) and "event" in data]
    first_content = next(
        i
        for i, (_, d) in enumerate(frames)
        if isinstance(d, dict) and d.get("choices") and d["choices"][0]["delta"].get("content")
    )
    event_at = [i for i, (_, d) in enumerate(frames) if isinstance(d, dict) and "event" in d]
    assert event_at and max(event_at) < first_content  # every chip before the first token
    assert [e["type"] for e in events] == ["source"] * 3
    first = events[0]["data"]
    url = "http://h:1/v1/kbs/docs/chunks/c1"
    assert first["source"] == {"id": url, "name": "[1] T1", "url": url}
    assert first["document"] == ["snippet 1"] and first["distances"] == [1.0]
    assert first["metadata"] == [{"source": url, "name": "[1] T1", "external": True}]
    assert [e["data"]["source"]["name"] for e in events] == ["[1] T1", "[2] T2", "[3] T3"]
    # no choices in those chunks, and only the last one carries an event id (the last source's)
    chunks = [frames[i] for i in event_at]
    assert all(d["choices"] == [] for _, d in chunks)
    assert [i for i, _ in chunks] == [None, None, "3"]
    assert not any("search_results" in d for _, d in frames if isinstance(d, dict))


def test_open_webui_shape_has_no_annotations_its_chips_came_first() -> None:
    wire = WIRE.model_copy(update={"sources": "open-webui"})
    frames = _parse(ChatChunks(wire).frames(_answer(["Cited [2]", " and [1]."])))
    assert _annotations(frames) == []
    assert frames[-1][1] == "[DONE]"


@pytest.mark.parametrize("cursor", [0, 2, 5, 8])
def test_a_resume_shows_only_what_follows_the_cursor_and_the_same_end(cursor: int) -> None:
    events = _events()
    whole = ChatChunks(WIRE).frames(events)
    resumed = ChatChunks(WIRE, after=cursor).frames(events)
    frames = _parse(resumed)
    shown_ids = {int(i) for i, _ in frames if i is not None}
    assert shown_ids and min(shown_ids) > cursor
    # the frames after the cursor are exactly the tail of an uninterrupted rendering
    assert whole.endswith(resumed)


def test_an_error_event_becomes_an_openai_error_then_done() -> None:
    chunks = ChatChunks(WIRE)
    raw = chunks.frames(
        [
            StreamStarted(id=0, stream_id="S", model="m", created=1.0),
            ErrorEvent(id=1, code="engine_unavailable", message="the engine stopped"),
        ]
    )
    frames = _parse(raw)
    error = frames[1][1]["error"]
    assert error == {
        "message": "the engine stopped",
        "type": "server_error",
        "param": None,
        "code": "engine_unavailable",
    }
    assert frames[2] == ("1", "[DONE]")


def test_a_cancelled_stream_says_so_in_stop_reason() -> None:
    frames = _parse(
        ChatChunks(WIRE).frames(
            [
                StreamStarted(id=0, stream_id="S", model="m", created=1.0),
                Done(id=1, finish_reason="cancelled"),
            ]
        )
    )
    choice = frames[1][1]["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "cancelled"


def _request(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3}, "n"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"tool_choice": "required", "tools": [{"function": {"name": "f"}}]}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"unheard_of": True}, "unheard_of"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages",
        ),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "messages",
        ),
    ],
)
def test_unsupported_requests_name_the_field(fields: dict[str, Any], param: str) -> None:
    from pydantic import ValidationError

    from rag_stream.schemas.openai import UnsupportedParameter

    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(_request(**fields))
    refused = [e["ctx"]["error"] for e in caught.value.errors() if "error" in e.get("ctx", {})]
    assert len(refused) == 1
    assert isinstance(refused[0], UnsupportedParameter) and refused[0].param == param


def test_an_assistant_turn_may_be_empty() -> None:
    # (a tool call's turn, in histories other servers wrote)
    turns = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "b"},
    ]
    assert ChatCompletionRequest.model_validate(_request(messages=turns)).messages[1].text == ""


def test_defaults_of_unsupported_fields_pass() -> None:
    body = ChatCompletionRequest.model_validate(
        _request(
            frequency_penalty=0,
            logprobs=False,
            tools=[],
            tool_choice="none",
            response_format={"type": "text"},
            stop="END",
            messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        )
    )
    assert body.stops == ["END"] and body.messages[0].text == "hello"


def test_offered_tools_are_accepted_when_no_call_is_required() -> None:
    # what Open WebUI sends with every message: its built-in tools, the choice left to the model
    tool = {
        "type": "function",
        "function": {
            "name": "get_current_timestamp",
            "description": "the time now",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for choice in ({}, {"tool_choice": "auto"}, {"tool_choice": "none"}):
        body = ChatCompletionRequest.model_validate(
            _request(tools=[tool] * 36, parallel_tool_calls=True, **choice)
        )
        assert body.tools is not None and body.tools[0].function.name == "get_current_timestamp"
