"""How errors become responses: one handler per kind of exception, each answering with the
JSON body of ``error_body`` (a domain error with its status; a validation error naming each field;
a body that cannot be decoded naming why, as a validation error; anything unexpected a 500 that
says to read the log, with the traceback logged)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag_stream.api.error_body import error_response
from rag_stream.errors import RagStreamError, TooManyRequests, Unauthorized
from rag_stream.schemas.openai import OPENAI_PATHS, UnsupportedParameter
from rag_stream.store.db import unavailable

logger = logging.getLogger(__name__)


def _refusal(err: Any) -> UnsupportedParameter | None:
    refused = (err.get("ctx") or {}).get("error")
    return refused if isinstance(refused, UnsupportedParameter) else None


def _problem(err: Any) -> tuple[str, str | None]:
    """One validation error as (message, the field at fault)."""
    if err.get("type") == "json_invalid":
        return f"the body is not valid JSON ({err.get('ctx', {}).get('error')})", None
    where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
    return f"{where or 'body'}: {err.get('msg', 'invalid')}", where or None


# What FastAPI answers (a 400, raised from the real error) when a JSON body fails to decode in
# a way other than bad syntax; bad syntax is a validation error ``json_invalid`` instead.
_UNPARSED = "There was an error parsing the body"


def _unparsed_body(exc: StarletteHTTPException) -> str | None:
    """Why FastAPI could not decode a request's JSON body, or None for any other HTTP error. The
    wording follows what a body refused by pydantic's own parser (documents) says."""
    if exc.status_code != 400 or exc.detail != _UNPARSED or exc.__cause__ is None:
        return None
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start : cause.start + 1].hex()
        why = f"not UTF-8: byte 0x{byte} at offset {cause.start}"
    elif isinstance(cause, RecursionError):
        why = "arrays or objects nested too deeply"
    elif isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        why = f"an integer longer than {sys.get_int_max_str_digits()} digits"
    else:
        return f"the body could not be read ({type(cause).__name__})"
    return f"the body is not valid JSON ({why})"


def _bad_input_status(request: Request) -> int:
    # OpenAI's API answers a bad request with 400; rag-stream's own routes with 422
    return 400 if request.url.path.startswith(OPENAI_PATHS) else 422


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RagStreamError)
    async def _domain(request: Request, exc: RagStreamError) -> JSONResponse:
        if exc.status_code >= 500 and exc.status_code != 503:
            logger.error("request failed: %s", exc.message)
        headers = None
        if isinstance(exc, TooManyRequests):
            headers = {"Retry-After": str(exc.retry_after_s)}
        elif isinstance(exc, Unauthorized):
            headers = {"WWW-Authenticate": "Bearer"}
        status = exc.status_code
        if status == 422 and request.url.path.startswith(OPENAI_PATHS):
            status = 400  # OpenAI's status for a bad request, as for the body's validation
        return error_response(status, exc.code, exc.message, exc.param, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        refused = [r for r in map(_refusal, errors) if r is not None]
        # a field refused by name says more than the other branches of a union around it
        found: list[tuple[str, str | None]] = [(r.message, r.param) for r in refused]
        found = found or [_problem(e) for e in errors]
        status = _bad_input_status(request)
        message = "; ".join(m for m, _ in found)
        return error_response(status, "invalid_request", message, found[0][1] if found else None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if (problem := _unparsed_body(exc)) is not None:
            # the same answer as a body with bad syntax: it is a bad request, named
            return error_response(_bad_input_status(request), "invalid_request", problem)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        if (db := unavailable(exc)) is not None:
            logger.warning("request failed: %s", exc)
            return error_response(db.status_code, db.code, db.message)
        logger.exception("unhandled error", exc_info=exc)
        return error_response(500, "internal_error", "internal error; see the server log")
