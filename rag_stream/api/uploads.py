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
    try:
        form = await MultiPartParser(request.headers, stream, max_files=1, max_fields=16).parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"malformed multipart form: {exc.message}") from None
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


def metadata_field(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"metadata: not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise InvalidRequest("metadata: must be a JSON object")
    return value
