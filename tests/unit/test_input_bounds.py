"""Every number a request carries is bounded where it is declared, and resume cursors are read
strictly: what the engine, SQL or Redis cannot hold is a 422 naming the field, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from rag_stream.api.cursor import resume_cursor as _cursor
from rag_stream.errors import ConfigError, InvalidRequest
from rag_stream.schemas.answers import AnswerRequest
from rag_stream.schemas.generate import GenerateRequest
from rag_stream.schemas.streams import EVENT_ID_MAX
from rag_stream.settings import LimitsSettings, load_settings

GENERATE = {"prompt": "hi"}
ANSWER = {"kb": "docs", "question": "why?"}
REQUESTS = [(GenerateRequest, GENERATE), (AnswerRequest, ANSWER)]


def _refused_field(model: type[BaseModel], body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(json.dumps(body))
    (error,) = caught.value.errors()
    return ".".join(str(p) for p in error["loc"])


@pytest.mark.parametrize(("model", "base"), REQUESTS)
@pytest.mark.parametrize("seed", [2**64, 2**70, 2**63, -(2**63) - 1])
def test_seeds_beyond_64_bits_are_refused(
    model: type[BaseModel], base: dict[str, Any], seed: int
) -> None:
    assert _refused_field(model, {**base, "seed": seed}) == "seed"


@pytest.mark.parametrize(("model", "base"), REQUESTS)
@pytest.mark.parametrize("seed", [0, 2**63 - 1, -(2**63), -1])
def test_every_signed_64_bit_seed_is_accepted(
    model: type[BaseModel], base: dict[str, Any], seed: int
) -> None:
    assert model.model_validate({**base, "seed": seed}).model_dump()["seed"] == seed


@pytest.mark.parametrize(("model", "base"), REQUESTS)
@pytest.mark.parametrize("max_tokens", [0, 1_000_001, 2**64])
def test_max_tokens_is_bounded_before_the_settings_limit(
    model: type[BaseModel], base: dict[str, Any], max_tokens: int
) -> None:
    assert _refused_field(model, {**base, "max_tokens": max_tokens}) == "max_tokens"


@pytest.mark.parametrize("top_k", [-1, 1001, 2**64])
def test_top_k_is_bounded(top_k: int) -> None:
    assert _refused_field(AnswerRequest, {**ANSWER, "top_k": top_k}) == "top_k"


def test_the_schemas_publish_the_bounds() -> None:
    """Clients (and fuzzers) read the limits from /openapi.json."""
    for model in (GenerateRequest, AnswerRequest):
        props = model.model_json_schema()["properties"]
        for name in ("seed", "max_tokens"):
            (integer,) = [s for s in props[name]["anyOf"] if s["type"] == "integer"]
            upper = {"maximum", "exclusiveMaximum"} & set(integer)  # (seed: below 2^63)
            assert "minimum" in integer and upper, (model.__name__, name)
    top_k = AnswerRequest.model_json_schema()["properties"]["top_k"]["anyOf"][0]
    assert (top_k["minimum"], top_k["maximum"]) == (0, 1000)


@pytest.mark.parametrize("header", [None, "", " ", "\t  "])
def test_an_absent_or_empty_last_event_id_replays_from_the_start(header: str | None) -> None:
    assert _cursor(header, None) == -1


@pytest.mark.parametrize(
    ("header", "expected"), [("0", 0), ("17", 17), (" 5 ", 5), ("007", 7), ("0" * 30 + "1", 1)]
)
def test_last_event_id_headers_that_are_event_ids(header: str, expected: int) -> None:
    assert _cursor(header, None) == expected


def test_the_query_parameter_wins_over_the_header() -> None:
    assert _cursor("9", "3") == 3
    assert _cursor("", "0") == 0


@pytest.mark.parametrize("query", ["+1", "1_0", " 1", "-0", "1.0", "\u0661"])
def test_the_query_cursor_is_read_as_strictly_as_the_header(query: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _cursor(None, query)
    assert caught.value.message.startswith("last_event_id") and caught.value.param == (
        "last_event_id"
    )


@pytest.mark.parametrize(
    ("header", "needle"),
    [
        ("-3", "must be >= 0"),
        ("abc", "must be an integer event id"),
        ("1_0", "must be an integer event id"),
        ("+1", "must be an integer event id"),
        ("1.5", "must be an integer event id"),
        ("\u00b2", "must be an integer event id"),  # a digit to str.isdigit(), not to int()
        (str(EVENT_ID_MAX + 1), f"must be at most {EVENT_ID_MAX}"),
        (str(2**64), f"must be at most {EVENT_ID_MAX}"),
        ("9" * 5000, f"must be at most {EVENT_ID_MAX}"),  # beyond what int() parses
    ],
)
def test_bad_last_event_id_headers_are_422_naming_the_header(header: str, needle: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _cursor(header, None)
    message = caught.value.message
    assert message.startswith("Last-Event-ID") and needle in message
    assert len(message) < 200  # a huge header is not echoed back whole


def test_the_body_read_timeout_is_a_setting_that_must_be_positive() -> None:
    assert LimitsSettings().body_read_timeout_s == 30
    with pytest.raises(ConfigError, match="RAG_STREAM_LIMITS__BODY_READ_TIMEOUT_S"):
        load_settings(limits={"body_read_timeout_s": 0})
