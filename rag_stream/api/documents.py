"""/v1/kbs/{kb}/documents: upload (JSON or a file), list, read and delete documents.

An upload with a short text is ingested inside its request (201, or 200 for content already
stored; a client that leaves first gets nothing stored); a longer one answers 202 at once and is
ingested in the background, its progress at ``GET .../documents/{id}`` (status ``processing``,
then ``ready`` or ``failed``), and ``DELETE`` on that id stops it. See
``rag_stream.ingest.service``."""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from rag_stream.api.deps import IngestorDep, SessionDep, SettingsDep, TenantDep
from rag_stream.api.openapi import errors
from rag_stream.api.query import QueryBool, QueryInt
from rag_stream.api.uploads import disconnected, metadata_field, read_body, read_upload
from rag_stream.errors import InvalidRequest, NotFound, UnsupportedMediaType
from rag_stream.ingest.background import Accepted
from rag_stream.ingest.documents import DocumentDraft, parse_upload
from rag_stream.ingest.parsing import parse_text
from rag_stream.ingest.service import CallerLeft
from rag_stream.schemas.kbs import (
    ChunkOut,
    DocumentCreate,
    DocumentDetail,
    DocumentOut,
    DocumentPage,
    IngestError,
    IngestOut,
    Metadata,
)
from rag_stream.settings import IngestSettings
from rag_stream.store import ingests
from rag_stream.store import repositories as repo
from rag_stream.store.models import Document, DocumentIngest

router = APIRouter(prefix="/v1/kbs/{kb}/documents", tags=["documents"])

_metadata = TypeAdapter(Metadata)
# The form's text fields follow the JSON body's rules (the columns have those limits too).
_form_title = TypeAdapter(Annotated[str, DocumentCreate.model_fields["title"]])
_form_source = TypeAdapter(Annotated[str, DocumentCreate.model_fields["source"]])
# SQL takes OFFSET as a 64-bit integer (SQLite fails on a wider one); no KB holds this many.
MAX_OFFSET = 2**31 - 1
_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": DocumentCreate.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "title": {"type": "string"},
                        "source": {"type": "string", "description": "defaults to the filename"},
                        "metadata": {"type": "string", "description": "a JSON object"},
                    },
                }
            },
        },
    }
}


# What a client left before its in-request ingest ended is answered with (nobody reads it;
# the access log shows it, as nginx's "client closed request").
CLIENT_CLOSED_REQUEST = 499


def document_out(doc: Document | DocumentIngest) -> dict[str, Any]:
    out = {
        "id": doc.id,
        "kb_id": doc.kb_id,
        "title": doc.title,
        "source": doc.source,
        "media_type": doc.media_type,
        "content_hash": doc.content_hash,
        "metadata": doc.meta,
        "created_at": doc.created_at,
    }
    if isinstance(doc, Document):
        return {**out, "chunk_count": doc.chunk_count, "chunks_done": doc.chunk_count}
    error = None
    if doc.error_code is not None:
        error = IngestError(code=doc.error_code, message=doc.error_message or "")
    return {
        **out,
        "chunk_count": doc.chunks_total,
        "chunks_done": doc.chunks_done,
        "status": doc.status,
        "error": error,
    }


def _form_field(rule: TypeAdapter[str], name: str, value: str | None) -> str | None:
    """A form field held to its rule; empty is absent (browsers send empty fields)."""
    if not value:
        return None
    try:
        return rule.validate_python(value)
    except ValidationError as exc:
        raise InvalidRequest(f"{name}: {exc.errors()[0]['msg']}") from None


async def _draft(request: Request, settings: IngestSettings) -> DocumentDraft:
    limit = settings.max_upload_bytes
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type == "application/json":
        raw = await read_body(request, limit)
        try:
            body = DocumentCreate.model_validate_json(raw)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        parsed = await anyio.to_thread.run_sync(
            parse_text, body.text, body.media_type, settings.max_text_chars
        )
        return DocumentDraft(body.title, parsed, body.source, body.metadata)
    if content_type == "multipart/form-data":
        upload = await read_upload(request, limit)
        try:
            meta = _metadata.validate_python(metadata_field(upload.fields.get("metadata")))
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        title = _form_field(_form_title, "title", upload.fields.get("title"))
        source = _form_field(_form_source, "source", upload.fields.get("source"))
        parsed = await parse_upload(upload.data, upload.filename, upload.content_type, settings)
        name = PurePath(upload.filename).name if upload.filename else None
        if source is None and name is not None:
            source = _form_field(_form_source, "source (the file name, by default)", name)
        return DocumentDraft(title or parsed.title or name or "untitled", parsed, source, meta)
    raise UnsupportedMediaType(
        f"send application/json or multipart/form-data, not {content_type or 'no content type'!r}"
    )


@router.post(
    "",
    status_code=201,
    response_model=IngestOut,
    openapi_extra=_UPLOAD_BODY,
    responses={
        200: {"model": IngestOut, "description": "identical content is already stored"},
        202: {
            "model": IngestOut,
            "description": "a long text, ingested in the background: GET the document's id "
            "for its progress",
        },
        **errors(409, 413, 415),  # a source changing concurrently, the size limit, the type
    },
)
async def upload_document(
    kb: str,
    request: Request,
    response: Response,
    settings: SettingsDep,
    ingestor: IngestorDep,
    tenant: TenantDep,
) -> IngestOut | Response:
    # an unknown kb (or another tenant's) is a 404 before the body is read
    found = await ingestor.resolve_kb(kb, tenant=tenant)
    draft = await _draft(request, settings.ingest)
    try:
        result = await ingestor.submit(
            found.id, draft, tenant=tenant, gone=lambda: disconnected(request)
        )
    except CallerLeft:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if isinstance(result, Accepted):
        response.status_code = 202
        response.headers["Location"] = f"{request.url.path}/{result.ingest.id}"
        return IngestOut(**document_out(result.ingest), created=result.created)
    if not result.created:
        response.status_code = 200
    return IngestOut(
        **document_out(result.document),
        created=result.created,
        replaced_document_id=result.replaced_id,
    )


@router.get("")
async def list_documents(
    kb: str,
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[QueryInt, Query(ge=1, le=200)] = 20,
    offset: Annotated[QueryInt, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> DocumentPage:
    found = await repo.resolve_kb(session, kb, tenant=tenant)
    docs, total = await repo.list_documents(session, found.id, limit, offset)
    return DocumentPage(
        data=[DocumentOut(**document_out(d)) for d in docs],
        total=total,
        limit=limit,
        offset=offset,
        next_offset=offset + len(docs) if offset + len(docs) < total else None,
    )


@router.get("/{doc}")
async def get_document(
    kb: str, doc: str, session: SessionDep, tenant: TenantDep, include_chunks: QueryBool = False
) -> DocumentDetail:
    found = await repo.resolve_kb(session, kb, tenant=tenant)
    try:
        document = await repo.get_document(session, found.id, doc)
    except NotFound:
        pending = await ingests.get(session, found.id, doc)
        if pending is None:
            # A background ingest ending between the two reads: the commit that writes the
            # document deletes its row, and each read sees what was committed when it ran
            # (SQLite's driver and PostgreSQL's read committed alike), so look once more.
            document = await repo.get_document(session, found.id, doc)
        else:
            await session.commit()  # (it may have been found abandoned, and marked failed)
            return DocumentDetail(**document_out(pending), text=None)
    chunks = None
    if include_chunks:
        chunks = [
            ChunkOut(
                id=c.id,
                ordinal=c.ordinal,
                start=c.start,
                end=c.end,
                heading=c.heading,
                token_count=c.token_count,
                text=c.text,
            )
            for c in await repo.chunks_of(session, document.id)
        ]
    return DocumentDetail(**document_out(document), text=document.text, chunks=chunks)


@router.delete("/{doc}", status_code=204)
async def delete_document(kb: str, doc: str, ingestor: IngestorDep, tenant: TenantDep) -> Response:
    await ingestor.delete_document(kb, doc, tenant=tenant)
    return Response(status_code=204)
