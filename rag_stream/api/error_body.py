"""The one JSON error body every route and middleware answers with.

``{"error": {"code", "message", "type", "param"}}``: rag-stream's ``code`` and ``message``,
with OpenAI's ``type`` (from the status) and ``param`` (the field at fault, if one is), so an
OpenAI client reads every error too.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from rag_stream.schemas.openai import error_type


def error_response(
    status: int,
    code: str,
    message: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"code": code, "message": message, "type": error_type(status), "param": param}
    return JSONResponse({"error": body}, status_code=status, headers=headers)
