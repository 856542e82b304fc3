"""The OpenAPI document describes what the service answers (api/openapi.py): every status a
route can answer with the one error body, server-sent events with their event schemas, bounds
exactly as the server checks them; and a 405 names the methods its path allows.

The app is built (``create_app``) but never started: the document and the routing need no
Redis, database or engine."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema_rs
import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from rag_stream.app import create_app
from rag_stream.schemas.generate import SEED_MAX, SEED_MIN
from rag_stream.settings import Settings

ERROR_BODY = {"$ref": "#/components/schemas/ErrorResponse"}


@cache
def _app() -> FastAPI:
    return create_app(Settings(profile="test"))


@cache
def _document() -> dict[str, Any]:
    # through JSON, as a client reads it (Python's json keeps integers exact)
    return json.loads(json.dumps(_app().openapi()))  # type: ignore[no-any-return]


def _responses(method: str, path: str) -> dict[str, Any]:
    return _document()["paths"][path][method]["responses"]  # type: ignore[no-any-return]


def _error_statuses(method: str, path: str) -> set[int]:
    return {
        int(status)
        for status, response in _responses(method, path).items()
        if response.get("content", {}).get("application/json", {}).get("schema") == ERROR_BODY
    }


def test_a_keyed_route_with_path_parameters_documents_its_errors() -> None:
    assert _error_statuses("get", "/v1/kbs/{kb}/chunks/{chunk_id}") == {
        400,  # an untrusted Host
        401,  # no valid key
        404,  # no such KB or chunk
        422,  # an invalid parameter
        429,  # the key's requests per minute
        503,  # the database is down
    }
    unauthorized = _responses("get", "/v1/kbs/{kb}/chunks/{chunk_id}")["401"]
    assert "WWW-Authenticate" in unauthorized["headers"]
    assert "Retry-After" in _responses("get", "/v1/kbs/{kb}")["429"]["headers"]


def test_routes_that_take_a_body_document_its_timeout_and_their_own_errors() -> None:
    # 409: the name is taken; 415: a Content-Encoding
    assert {403, 408, 409, 415, 422} <= _error_statuses("post", "/v1/kbs")
    assert {404, 408, 413, 429, 503} <= _error_statuses("post", "/v1/jobs")
    assert {404, 413} <= _error_statuses("post", "/v1/answers")


def test_openai_routes_document_400_where_others_document_422() -> None:
    chat = _error_statuses("post", "/v1/chat/completions")
    assert {400, 401, 404, 413, 429, 503} <= chat
    assert 422 not in chat
    assert 422 not in _error_statuses("get", "/v1/models/{model_id}")


def test_fastapis_validation_error_shape_is_gone_from_the_document() -> None:
    text = json.dumps(_document())
    assert "HTTPValidationError" not in text
    error = _document()["components"]["schemas"]["ErrorDetail"]
    assert set(error["required"]) == {"code", "message", "type", "param"}


def test_health_checks_document_their_own_bodies() -> None:
    assert _error_statuses("get", "/healthz") == {400}
    unavailable = _responses("get", "/readyz")["503"]["content"]["application/json"]["schema"]
    assert unavailable["properties"]["status"] == {"const": "unavailable"}
    assert set(_responses("get", "/metrics")["200"]["content"]) == {"text/plain"}


@pytest.mark.parametrize(
    ("method", "path", "json_too"),
    [
        ("post", "/v1/generate", True),
        ("post", "/v1/answers", True),
        ("post", "/v1/chat/completions", True),
        ("post", "/v1/ui/chat", False),
        ("get", "/v1/streams/{stream_id}/events", False),
        ("get", "/v1/jobs/{job_id}/events", False),
    ],
)
def test_stream_routes_document_their_events(method: str, path: str, json_too: bool) -> None:
    content = _responses(method, path)["200"]["content"]
    assert "itemSchema" in content["text/event-stream"]
    assert ("application/json" in content) == json_too


def _validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """``schema`` with the document's components beside it, where its ``$ref``s point."""
    root = {"components": _document()["components"], "allOf": [schema]}
    return jsonschema_rs.Draft202012Validator(root)


def _event_data_schema(path: str, method: str) -> dict[str, Any]:
    item = _responses(method, path)["200"]["content"]["text/event-stream"]["itemSchema"]
    return item["properties"]["data"]["contentSchema"]  # type: ignore[no-any-return]


def test_native_event_data_is_described_by_the_event_models() -> None:
    data = _validator(_event_data_schema("/v1/generate", "post"))
    token = {"id": 3, "type": "token", "index": 2, "text": "hi", "token_ids": [7]}
    assert data.is_valid(token)
    assert not data.is_valid({**token, "token_ids": "7"})
    done = {"id": 4, "type": "done", "finish_reason": "stop"}
    assert data.is_valid(done)
    assert not data.is_valid({**done, "finish_reason": "tired"})
    # an error the reader hit itself goes out without an id
    assert data.is_valid({"type": "error", "code": "event_log_unavailable", "message": "x"})


def test_the_seed_bound_in_the_document_is_the_one_the_server_checks() -> None:
    seed = _document()["components"]["schemas"]["GenerateRequest"]["properties"]["seed"]
    (integer,) = [s for s in seed["anyOf"] if s.get("type") == "integer"]
    assert integer["minimum"] == SEED_MIN and isinstance(integer["minimum"], int)
    assert integer["exclusiveMaximum"] == SEED_MAX + 1
    assert isinstance(integer["exclusiveMaximum"], int)
    assert "maximum" not in integer  # (2^63 - 1 as a float would be 2^63)


def test_outline_headings_must_not_be_blank_in_the_schema() -> None:
    job = _document()["components"]["schemas"]["JobRequest"]["properties"]
    (outline,) = [s for s in job["outline"]["anyOf"] if s.get("type") == "array"]
    headings = _validator(outline)
    assert headings.is_valid(["Herons", " Water "])
    assert not headings.is_valid(["Herons", ""])
    assert not headings.is_valid(["  \t"])


def test_a_user_message_needs_text_in_the_schema_as_on_the_server() -> None:
    messages = _document()["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    check = _validator(messages["messages"])
    assert check.is_valid([{"role": "user", "content": "Where?"}])
    assert check.is_valid(
        [{"role": "assistant", "content": None}, {"role": "user", "content": "?"}]
    )
    for empty in (None, "", []):
        assert not check.is_valid([{"role": "user", "content": empty}])
    assert not check.is_valid([{"role": "user"}])


def test_every_reference_in_the_document_resolves() -> None:
    schemas = _document()["components"]["schemas"]
    refs = {
        ref.removeprefix("#/components/schemas/")
        for ref in _refs(_document())
        if ref.startswith("#/components/schemas/")
    }
    assert refs - set(schemas) == set()


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        mapping = node.get("discriminator", {}).get("mapping", {})
        return found + list(mapping.values()) + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("TRACE", "/v1/kbs", "GET, POST"),  # two routes on one path: both methods
        ("TRACE", "/", "GET"),
        ("PUT", "/v1/kbs/docs", "DELETE, GET"),
        ("PATCH", "/v1/jobs/abc", "DELETE, GET"),
        ("BREW", "/v1/generate", "POST"),
    ],
)
def test_a_method_the_path_does_not_serve_is_a_405_naming_those_it_does(
    method: str, path: str, allow: str
) -> None:
    client = TestClient(_app(), base_url="http://127.0.0.1:8000")  # no lifespan: routing only
    r = client.request(method, path)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    assert r.json()["error"]["code"] == "method_not_allowed"
