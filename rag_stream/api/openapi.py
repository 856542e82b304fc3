"""The OpenAPI document says what the service answers, not only its 200s.

FastAPI documents each route's success and a 422 in its own ``{"detail": [...]}`` shape. What
the service really sends besides is decided by what a route depends on, so ``install_openapi``
adds it to every operation from the route itself, once, when the document is first built:

- every operation: 400 (the ``Host`` header names no host this server answers to:
  api/browser_guard.py); a POST, PUT, PATCH or DELETE also 403 (a page from a foreign origin);
- a route that takes the API key (its operation declares ``security``): 401, with
  ``WWW-Authenticate``; counted per key and minute (``get_caller``): 429, with ``Retry-After``;
- a route that uses the service's resources: 503 (the database, Redis, the vector store or the
  engine is down or still starting);
- a path parameter: 404 (no such id, or another tenant's);
- any parameter or body: 422, naming the field; on OpenAI's routes a bad request is a 400
  instead, as OpenAI answers (``OPENAI_PATHS``);
- a request body: 408 (the body stalled or took too long: api/timeouts.py) and 415 (a
  ``Content-Encoding``: api/content_coding.py).

Everything errs with the one body of api/error_body.py (``ErrorResponse`` below). What only some
routes answer (409 for a name taken, 413 for a prompt or upload beyond the limits, 415 for an
upload's media type, 404 for a KB or model named in the body) is declared beside the route with
``responses=errors(...)``; a route's own declaration of a status always wins. Server-sent
events are described by schemas/event_stream.py; their event models arrive in ``$defs``, which
move here into the components. Integer bounds stay integers (FastAPI's document model holds
them as floats, which turns 2^63 - 1 into 2^63).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security.base import SecurityBase
from pydantic import BaseModel

from rag_stream.api.deps import get_caller, get_resources
from rag_stream.schemas.openai import OPENAI_PATHS

_COMPONENTS = "#/components/schemas/"
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ErrorDetail(BaseModel):
    code: str
    message: str
    type: str  # OpenAI's error type, from the status
    param: str | None  # the request field at fault, if one is


class ErrorResponse(BaseModel):
    """Every error's body, on every route (OpenAI's error object, with rag-stream's ``code``)."""

    error: ErrorDetail


_WHY: dict[int, str] = {
    400: "bad request: an untrusted Host header (and, on OpenAI's routes, invalid input)",
    401: "no valid API key",
    403: "a request from a page on an origin the server does not trust",
    404: "not found (or another tenant's)",
    408: "the request body stalled (limits.body_read_timeout_s)",
    409: "conflict: the name or content exists already",
    413: "too large for the configured limits",
    415: "an unsupported media type or Content-Encoding",
    422: "invalid input; the message and param name the field",
    429: "too many requests (see Retry-After)",
    503: "a dependency is down, or the engine is still starting",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "Bearer"}},
    429: {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}},
}


def _error(status: int) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": _COMPONENTS + "ErrorResponse"}}}
    response: dict[str, Any] = {"description": _WHY[status], "content": content}
    if status in _HEADERS:
        response["headers"] = _HEADERS[status]
    return response


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for the statuses only this route answers (409, 413, 415, or a 404 for a
    name in the body), with the error body."""
    # (the content spelled out: FastAPI files a "model" under the route's own media type)
    return {status: _error(status) for status in statuses}


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any] | SecurityBase]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def _statuses(route: APIRoute, method: str, operation: dict[str, Any]) -> list[int]:
    """What this route may answer besides what it declares (the module's docstring)."""
    calls = set(_calls(route.dependant))
    found = [400]
    if method in _UNSAFE:
        found.append(403)
    if operation.get("security"):
        found.append(401)
    if get_caller in calls:
        found.append(429)
    if get_resources in calls:
        found.append(503)
    if route.dependant.path_params:
        found.append(404)
    dependant = route.dependant
    has_body = route.body_field is not None or "requestBody" in operation
    inputs = dependant.path_params or dependant.query_params or dependant.header_params or has_body
    if inputs and not route.path.startswith(OPENAI_PATHS):
        found.append(422)
    if has_body:
        found += [408, 415]
    return found


def _int_bounds(node: Any) -> None:
    """Integer bounds back to integers (see the module's docstring)."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                bound = node.get(key)
                if isinstance(bound, float) and bound.is_integer():
                    node[key] = int(bound)
        for value in node.values():
            _int_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _int_bounds(value)


def _hoist_defs(node: Any, components: dict[str, Any]) -> None:
    """Move ``$defs`` found in the document into its components (they reference them there)."""
    if isinstance(node, dict):
        for name, schema in node.pop("$defs", {}).items():
            _hoist_defs(schema, components)
            if components.setdefault(name, schema) != schema:
                raise ValueError(f"two different schemas named {name!r} in the OpenAPI document")
        for value in node.values():
            _hoist_defs(value, components)
    elif isinstance(node, list):
        for value in node:
            _hoist_defs(value, components)


def complete(document: dict[str, Any], routes: list[Any]) -> dict[str, Any]:
    """``document`` (FastAPI's, for ``routes``) with every status each operation may answer."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    _hoist_defs(document["paths"], components)
    error_body = ErrorResponse.model_json_schema(ref_template=_COMPONENTS + "{model}")
    components.update(error_body.pop("$defs"), ErrorResponse=error_body)
    for route in routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        for method in route.methods:
            operation = document["paths"][route.path_format][method.lower()]
            responses = operation["responses"]
            if "422" in responses and "HTTPValidationError" in str(responses["422"]):
                del responses["422"]  # FastAPI's shape, not what the service sends
            for status in _statuses(route, method, operation):
                responses.setdefault(str(status), _error(status))
            operation["responses"] = dict(sorted(responses.items()))
    for unused in ("HTTPValidationError", "ValidationError"):
        if unused not in str(document["paths"]):
            components.pop(unused, None)
    _int_bounds(document)
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve ``complete``'s document at the app's OpenAPI URL (built once)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(build(), app.routes)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
