"""Read request bodies under a size limit counted while reading (Content-Length is a hint)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from rag_stream.errors import InvalidRequest, PayloadTooLarge

# Room for the multipart boundaries and the small form fields next to the file.
_FORM_OVERHEAD = 64 * 1024
# What a client can do about the parser's terser reasons.
_HINTS = {
    "Maximum header size exceeded": "a part's header, its file name included, is limited to 4 KB",
}


@dataclass(frozen=True)
class Upload:
    data: bytes
    filename: str | None
    content_type: str | None
    fields: dict[str, str]


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"upload is larger than the limit of {limit} bytes")


async def _limited(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    total = 0
    async for piece in request.stream():
        total += len(piece)
        if total > limit:
            raise _too_large(limit)
        yield piece


async def read_body(request: Request, limit: int) -> bytes:
    return b"".join([piece async for piece in _limited(request, limit)])


async def read_upload(request: Request, limit: int) -> Upload:
    """The one file of a multipart form (field ``file``) plus its text fields."""
    stream = _limited(request, limit + _FORM_OVERHEAD)
    parser = MultiPartParser(request.headers, stream, max_files=1, max_fields=16)
    # Starlette spools a file over 1 MB to the system's temp dir, outside the data folder. It is
    # read whole into memory right after (the parser needs all of it), and the stream above
    # stops past the limit: kept in memory from the start, an upload is never written to disk.
    parser.spool_max_size = limit + _FORM_OVERHEAD
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"malformed multipart form: {_reason(exc)}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("multipart form needs a file in the field 'file'")
        data = await upload.read(limit + 1)
        if len(data) > limit:
            raise _too_large(limit)
        fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
        return Upload(data, upload.filename, upload.content_type, fields)
    finally:
        await form.close()


async def disconnected(request: Request) -> None:
    """Returns when the client has gone (``http.disconnect``); call it once the body is read
    (before, it would swallow the body's messages)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _reason(exc: MultiPartException) -> str:
    """Starlette's message; for a parse error (its "Invalid multipart data."), the parser's own
    reason, which says what was wrong (say, a file name of thousands of characters). Starlette
    raises that one from python-multipart's FormParserError, a ValueError."""
    cause = exc.__cause__
    if not isinstance(cause, ValueError) or not str(cause):
        return exc.message
    reason = str(cause)[:200]
    hint = _HINTS.get(reason)
    return f"{reason} ({hint})" if hint else reason


def metadata_field(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"metadata: not valid JSON: {exc.msg}") from None
    except RecursionError:  # what json raises for arrays or objects nested ~1,000 deep
        raise InvalidRequest("metadata: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidRequest("metadata: must be a JSON object")
    return value
