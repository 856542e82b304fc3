"""Hostile inputs through the HTTP API (the service in the test process on the stub engine,
tests/support/inprocess.py; SQLite, and PostgreSQL where the database is the point; vLLM's own
bounds on a real server process): numbers past what the engine or SQL can hold, odd resume
cursors, NUL characters, over-long form fields, the offsets of every datetime the API returns,
and bodies no JSON parser can read. Each gets a 4xx naming the problem, or a correct answer;
never a 500."""

from __future__ import annotations

import gzip
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from rag_stream.schemas.openai import OPENAI_PATHS
from tests.support.inprocess import InProcess, InProcessFactory
from tests.support.inprocess import read_stream as aread_stream
from tests.support.server import ServerProcess
from tests.support.sse import read_stream

INT64_MAX = 2**63 - 1

pytestmark = pytest.mark.in_process(limits__max_tokens=4000)


@pytest.fixture(scope="module")
async def pg_app(in_process_factory: InProcessFactory) -> AsyncIterator[InProcess]:
    """The service on a fresh PostgreSQL database."""
    async with in_process_factory(database="postgresql", limits__max_tokens=4000) as service:
        yield service


@pytest.fixture(scope="module")
def client(in_process_module: InProcess) -> httpx.AsyncClient:
    """On SQLite."""
    return in_process_module.client


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def any_db_client(request: pytest.FixtureRequest) -> httpx.AsyncClient:
    if request.param == "sqlite":
        return request.getfixturevalue("in_process_module").client  # type: ignore[no-any-return]
    return request.getfixturevalue("pg_app").client  # type: ignore[no-any-return]


async def _kb(client: httpx.AsyncClient) -> str:
    name = f"kb-{uuid.uuid4().hex[:8]}"
    (await client.post("/v1/kbs", json={"name": name})).raise_for_status()
    (
        await client.post(
            f"/v1/kbs/{name}/documents",
            json={"title": "Herons", "text": "# Herons\n\nThe heron waits in shallow water."},
        )
    ).raise_for_status()
    return name


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "type", "param"}
    assert error["type"] == "invalid_request_error"
    message: str = error["message"]
    return message


# 1. Integers the engine cannot serialize


SEEDS_TOO_WIDE = [2**64, 2**70, 2**63, -(2**63) - 1]


@pytest.mark.parametrize("seed", SEEDS_TOO_WIDE)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_seed_beyond_64_bits_is_a_422_before_any_stream_starts(
    client: httpx.AsyncClient, seed: int, stream: bool
) -> None:
    kb = await _kb(client)
    for path, body in (
        ("/v1/generate", {"prompt": "hi"}),
        ("/v1/answers", {"kb": kb, "question": "Where do herons wait?"}),
    ):
        r = await client.post(path, json={**body, "seed": seed, "max_tokens": 4, "stream": stream})
        message = _error(r, 422)
        assert message.startswith("seed:"), message
        assert str(INT64_MAX) in message or str(-(2**63)) in message


@pytest.mark.parametrize(
    ("field", "value"), [("max_tokens", 10**12), ("max_tokens", 2**64), ("top_k", 2**64)]
)
async def test_other_integers_are_bounded_with_the_field_named(
    client: httpx.AsyncClient, field: str, value: int
) -> None:
    body: dict[str, Any] = {"kb": "any", "question": "q", field: value, "stream": False}
    r = await client.post("/v1/answers", json=body)
    assert _error(r, 422).startswith(f"{field}:")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/generate", {"prompt": "q", "max_tokens": True}, "max_tokens"),
        ("/v1/answers", {"kb": "k", "question": "q", "top_k": "7"}, "top_k"),
        ("/v1/answers", {"kb": "k", "question": "q", "mmr": 0}, "mmr"),
        ("/v1/answers", {"kb": "k", "question": "q", "max_tokens": 7.0}, "max_tokens"),
        ("/v1/jobs", {"kb": "k", "title": "t", "sections": "7"}, "sections"),
        ("/v1/kbs/k/search", {"query": "q", "top_k": "3"}, "top_k"),
        ("/v1/chat/completions", {"model": "m", "messages": [], "max_tokens": True}, "max_tokens"),
    ],
)
async def test_json_values_of_the_wrong_type_are_refused_not_converted(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], field: str
) -> None:
    r = await client.post(path, json=body)
    assert r.status_code in (400, 422), r.text  # (OpenAI's 400 on its routes)
    assert field in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    ("field", "value"), [("max_tokens", 4001), ("top_k", 1000), ("max_completion_tokens", 10**6)]
)
async def test_openai_routes_answer_limits_with_a_400_naming_the_field(
    client: httpx.AsyncClient, field: str, value: int
) -> None:
    """OpenAI's status and ``param`` for values past the server's limits, which are checked
    once the request is read (the limits are settings, not the schema's bounds)."""
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    made = await client.post("/v1/kbs", json={"name": f"b-{uuid.uuid4().hex[:6]}"})
    for name in (model, f"kb:{made.json()['name']}"):
        body = {"model": name, "messages": [{"role": "user", "content": "q"}], field: value}
        r = await client.post("/v1/chat/completions", json=body)
        if field == "top_k" and name == model:
            continue  # (the plain model retrieves nothing: top_k is not read)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field.replace("max_completion_tokens", "max_tokens"), error
        assert error["type"] == "invalid_request_error"


@pytest.mark.engine
def test_seeds_at_both_ends_of_the_range_generate_on_vllm(tiny_server: ServerProcess) -> None:
    """The bound is what vLLM takes: its ends work; one past them was a 500."""
    with httpx.Client(base_url=tiny_server.url, timeout=120) as client:
        for seed in (INT64_MAX, -(2**63)):
            body = {"prompt": "Tell me", "max_tokens": 3, "temperature": 1.0, "seed": seed}
            r = client.post("/v1/generate", json={**body, "stream": False})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] > 0
            frames = read_stream(client, "POST", "/v1/generate", json=body)
            assert frames[-1].event == "done", frames[-1]
        r = client.post("/v1/generate", json={"prompt": "hi", "seed": 2**64, "stream": False})
        assert _error(r, 422).startswith("seed:")


# 2. Numeric query parameters


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"offset": str(2**63)}, "offset"),
        ({"offset": str(2**31)}, "offset"),
        ({"offset": "-1"}, "offset"),
        ({"limit": str(2**64)}, "limit"),
    ],
)
async def test_document_paging_numbers_beyond_their_bounds_are_422(
    any_db_client: httpx.AsyncClient, params: dict[str, str], field: str
) -> None:
    r = await any_db_client.get(f"/v1/kbs/{await _kb(any_db_client)}/documents", params=params)
    assert _error(r, 422).startswith(f"query.{field}:")


async def test_the_largest_offset_is_an_empty_page(any_db_client: httpx.AsyncClient) -> None:
    kb = await _kb(any_db_client)
    page = await any_db_client.get(f"/v1/kbs/{kb}/documents", params={"offset": 2**31 - 1})
    assert page.status_code == 200, page.text
    assert page.json()["data"] == [] and page.json()["next_offset"] is None


async def _finished_stream(client: httpx.AsyncClient) -> str:
    r = await client.post(
        "/v1/generate", json={"prompt": "cursor", "max_tokens": 3, "stream": False}
    )
    r.raise_for_status()
    return str(r.json()["stream_id"])


@pytest.mark.parametrize(
    ("headers", "params", "needle"),
    [
        ({}, {"last_event_id": str(2**63)}, "last_event_id must be at most"),
        ({}, {"last_event_id": str(2**70)}, "last_event_id must be at most"),
        ({}, {"last_event_id": "-1"}, "last_event_id must be >= 0"),
        ({}, {"last_event_id": "1_0"}, "last_event_id must be an integer"),
        ({"Last-Event-ID": str(2**63)}, {}, "Last-Event-ID must be at most"),
        ({"Last-Event-ID": str(2**64 + 5)}, {}, "Last-Event-ID must be at most"),
        ({"Last-Event-ID": "1_0"}, {}, "Last-Event-ID must be an integer"),
    ],
)
async def test_resume_cursors_beyond_64_bits_are_422(
    client: httpx.AsyncClient, headers: dict[str, str], params: dict[str, str], needle: str
) -> None:
    sid = await _finished_stream(client)
    r = await client.get(f"/v1/streams/{sid}/events", headers=headers, params=params)
    assert needle in _error(r, 422)


# 3. An empty Last-Event-ID


async def test_an_empty_last_event_id_replays_the_whole_stream(
    client: httpx.AsyncClient,
) -> None:
    """(Only white space is the same: tests/unit/test_input_bounds.py; clients refuse to send
    such a header.)"""
    sid = await _finished_stream(client)
    path = f"/v1/streams/{sid}/events"
    everything = await aread_stream(client, "GET", path)
    replayed = await aread_stream(client, "GET", path, headers={"Last-Event-ID": ""})
    assert [f.id for f in everything] == list(range(len(everything)))
    assert everything[-1].event == "done"
    assert replayed == everything


# 4. Datetimes carry their offset, on SQLite and PostgreSQL


def _utc(value: str) -> datetime:
    assert value.endswith(("Z", "+00:00")), value
    parsed = datetime.fromisoformat(value)
    assert parsed.utcoffset() == timedelta(0), value
    return parsed


async def test_every_datetime_the_api_returns_is_utc_with_an_offset(
    any_db_client: httpx.AsyncClient,
) -> None:
    began = datetime.now(UTC)
    client = any_db_client
    kb = await _kb(client)
    seen = [(await client.get(f"/v1/kbs/{kb}")).json()["created_at"]]
    # this test's KB only: the shared app holds other tests' KBs, made long before
    listed = (await client.get("/v1/kbs")).json()["data"]
    seen += [k["created_at"] for k in listed if k["name"] == kb]
    docs = (await client.get(f"/v1/kbs/{kb}/documents")).json()["data"]
    seen += [d["created_at"] for d in docs]
    detail = await client.get(f"/v1/kbs/{kb}/documents/{docs[0]['id']}")
    seen.append(detail.json()["created_at"])
    answer = (
        await client.post(
            "/v1/answers",
            json={"kb": kb, "question": "Where?", "max_tokens": 4, "stream": False},
        )
    ).json()
    conversation = (await client.get(f"/v1/conversations/{answer['conversation_id']}")).json()
    seen.append(conversation["created_at"])
    seen += [m["created_at"] for m in conversation["messages"]]
    assert len(seen) >= 7
    for value in seen:
        # the moment itself survives the round trip (not local time read back as UTC)
        assert abs(_utc(value) - began) < timedelta(minutes=10), value


# NUL characters (PostgreSQL refuses them in text) and over-long form fields


async def test_nul_characters_never_reach_postgresql_as_such(pg_app: InProcess) -> None:
    client = pg_app.client
    kb = await _kb(client)
    r = await client.post(
        f"/v1/kbs/{kb}/documents",
        json={"title": "a\x00b", "text": "nul \x00 inside", "source": "s\x00"},
    )
    assert r.status_code == 201, r.text
    stored = (await client.get(f"/v1/kbs/{kb}/documents/{r.json()['id']}")).json()
    assert (stored["title"], stored["source"]) == ("a\ufffdb", "s\ufffd")
    for path in (
        "/v1/kbs/%00",
        f"/v1/kbs/{kb}/documents/%00",
        f"/v1/kbs/{kb}/documents/a%00b",
        "/v1/conversations/%00",
        "/v1/streams/%00",
    ):
        assert _error(await client.get(path), 404), path
    r = await client.post(
        "/v1/answers",
        json={"kb": kb, "question": "q\x00?", "conversation_id": "\x00", "stream": False},
    )
    _error(r, 404)
    r = await client.post("/v1/answers", json={"kb": kb, "question": "q\x00?", "stream": False})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("fields", "filename", "needle"),
    [
        ({"source": "s" * 1025}, "a.txt", "source: "),
        ({"title": "t" * 513}, "a.txt", "title: "),
        ({}, "f" * 1100 + ".txt", "source (the file name, by default): "),
    ],
)
async def test_form_fields_follow_the_json_fields_limits(
    any_db_client: httpx.AsyncClient, fields: dict[str, str], filename: str, needle: str
) -> None:
    kb = await _kb(any_db_client)
    r = await any_db_client.post(
        f"/v1/kbs/{kb}/documents",
        files={"file": (filename, uuid.uuid4().hex.encode(), "text/plain")},
        data=fields,
    )
    message = _error(r, 422)
    assert message.startswith(needle), message
    assert "characters" in message


# Moments at the ends of the calendar (GET /v1/usage)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"to": "0001-01-01T00:00:00+01:00"}, "to"),  # 31 December of year 0 in UTC
        ({"from": "9999-12-31T23:59:59-01:00"}, "from"),  # year 10000 in UTC
    ],
)
async def test_a_usage_period_with_no_utc_time_is_a_422_naming_it(
    any_db_client: httpx.AsyncClient, query: dict[str, str], param: str
) -> None:
    r = await any_db_client.get("/v1/usage", params=query)
    assert _error(r, 422) == f"{param} is outside the years 1 to 9999 in UTC"
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("query", "period"),
    [
        # the default 30 days before `to` stop at the first moment of year 1
        ({"to": "0001-01-05T00:00:00Z"}, ("0001-01-01T00:00:00Z", "0001-01-05T00:00:00Z")),
        (
            {"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T23:59:59.999999Z"},
            ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z"),
        ),
        (
            {"from": "9999-12-31T22:59:59-01:00", "to": "9999-12-31T23:59:59Z"},
            ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"),
        ),
    ],
)
async def test_usage_periods_at_the_ends_of_the_calendar_are_answered(
    any_db_client: httpx.AsyncClient, query: dict[str, str], period: tuple[str, str]
) -> None:
    client = any_db_client
    # a stream to count, or not: all of them ended within the widest period
    await client.post("/v1/generate", json={"prompt": "hi", "max_tokens": 4, "stream": False})
    r = await client.get("/v1/usage", params=query)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["from"], body["to"]) == period
    widest = query.get("to", "").startswith("9999") and query.get("from", "").startswith("0001")
    assert (body["total"]["requests"] > 0) == widest


# Bodies that cannot be decoded as JSON: the same answer from every route that takes JSON


def _json_routes(service: InProcess, kb: str) -> list[str]:
    """Every route FastAPI reads a JSON body for (so a route added later is covered too), and
    the documents route, which reads its own."""
    paths = [
        route.path.replace("{kb}", kb)
        for route in service.app.routes
        if isinstance(route, APIRoute) and route.body_field is not None
    ]
    assert {
        "/v1/generate",
        "/v1/chat/completions",
        "/v1/kbs/{kb}/search".replace("{kb}", kb),
    } <= set(paths)
    return [*paths, f"/v1/kbs/{kb}/documents"]


UNDECODABLE = [
    pytest.param(b'{"prompt": "caf\xe9"}', "not UTF-8: byte 0xe9 at offset 15", id="latin-1"),
    pytest.param(b"[" * 1000 + b"]" * 1000, "arrays or objects nested too deeply", id="deep"),
    pytest.param(
        b'{"seed": ' + b"7" * 5000 + b"}",
        f"an integer longer than {sys.get_int_max_str_digits()} digits",
        id="long-integer",
    ),
]


@pytest.mark.parametrize(("body", "reason"), UNDECODABLE)
async def test_an_undecodable_body_is_a_bad_request_naming_the_problem_on_every_route(
    in_process_module: InProcess, body: bytes, reason: str
) -> None:
    """FastAPI answered these with 400 `http_error` "There was an error parsing the body" on
    every route but the documents one (which parses its body itself): one answer everywhere."""
    client = in_process_module.client
    kb = await _kb(client)
    for path in _json_routes(in_process_module, kb):
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        status = 400 if path.startswith(OPENAI_PATHS) else 422
        assert r.status_code == status, (path, r.text)
        error = r.json()["error"]
        assert (error["code"], error["type"]) == ("invalid_request", "invalid_request_error")
        assert error["message"].startswith("the body is not valid JSON ("), (path, error)
        if not path.endswith("/documents"):  # (pydantic's parser words its reasons its own way)
            assert error["message"] == f"the body is not valid JSON ({reason})", (path, error)


async def test_a_20_digit_integer_is_refused_by_its_field(client: httpx.AsyncClient) -> None:
    """An integer past 64 bits decodes; its field's bound refuses it, by name."""
    body = b'{"query": "herons", "top_k": 10000000000000000000}'
    r = await client.post(
        f"/v1/kbs/{await _kb(client)}/search",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert _error(r, 422).startswith("top_k:")


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate, gzip"])
async def test_a_compressed_body_is_a_415_naming_its_coding_on_every_route(
    in_process_module: InProcess, coding: str
) -> None:
    """No route decodes a compressed body; the JSON routes called it unparsable (400), and the
    documents route "not valid JSON" (422)."""
    client = in_process_module.client
    kb = await _kb(client)
    body = gzip.compress(b'{"prompt": "hi", "query": "hi", "name": "x"}')
    for path in _json_routes(in_process_module, kb):
        headers = {"content-type": "application/json", "content-encoding": coding}
        r = await client.post(path, content=body, headers=headers)
        assert r.status_code == 415, (path, r.text)
        assert r.headers["accept-encoding"] == "identity"
        error = r.json()["error"]
        assert error["code"] == "unsupported_media_type"
        assert f"Content-Encoding {coding!r} is not supported" in error["message"], error
    # an upload too: stored as the compressed bytes otherwise
    r = await client.post(
        f"/v1/kbs/{kb}/documents",
        files={"file": ("notes.txt", gzip.compress(b"herons"), "text/plain")},
        headers={"content-encoding": "gzip"},
    )
    assert r.status_code == 415, r.text


async def test_an_identity_coding_is_no_coding(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/kbs",
        json={"name": f"id-{uuid.uuid4().hex[:6]}"},
        headers={"content-encoding": "identity"},
    )
    assert r.status_code == 201, r.text
