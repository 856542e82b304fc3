"""Every endpoint once, as a request and the typed result it answers with.

``Client`` and ``AsyncClient`` send the same ``Call``s, so the paths, bodies and result types
live here and nowhere else. A JSON body is the server's own request model (``AnswerRequest``,
``SearchRequest``, ...) built with ``model_construct``: mypy checks the field names and types
against the model, but nothing is validated here. The server checks every field and answers a
bad one with a 422 naming it (raised as ``InvalidRequest``), as it names an option the model
does not have, which is sent as given rather than dropped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from rag_stream.client.options import AnswerOptions, GenerateOptions, JobOptions
from rag_stream.schemas.answers import AnswerRequest, AnswerResponse, ConversationOut
from rag_stream.schemas.conversations import ConversationList
from rag_stream.schemas.generate import GenerateRequest, GenerateResponse
from rag_stream.schemas.jobs import JobList, JobOut, JobRequest, JobResult
from rag_stream.schemas.kbs import (
    ChunkDetail,
    DocumentCreate,
    DocumentDetail,
    DocumentPage,
    IngestOut,
    KbCreate,
    KbList,
    KbOut,
    Metadata,
    MetaFilter,
    SearchMode,
    SearchRequest,
    SearchResponse,
)
from rag_stream.schemas.openai import ModelCard, ModelList
from rag_stream.schemas.streams import CancelResponse, StreamStatus
from rag_stream.schemas.tenants import UsageOut

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
# httpx's form file: (filename, content, content type)
FileTuple = tuple[str, bytes, str | None]


class Readiness(BaseModel):
    """GET /readyz (200 when ready, 503 naming what is not)."""

    status: str
    checks: dict[str, str]
    failing: list[str] = []

    @property
    def ready(self) -> bool:
        return self.status == "ready"


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: object = None
    params: Mapping[str, str | int | bool] | None = None
    files: Mapping[str, FileTuple] | None = None
    data: Mapping[str, str] | None = None
    also_ok: frozenset[int] = field(default_factory=frozenset)  # error statuses read as results


@dataclass(frozen=True)
class StreamStart:
    """A request that starts a stream (its response is the stream's events), with the
    Idempotency-Key that lets it go again after a connection lost before its answer."""

    path: str
    body: dict[str, Any]
    key: str = field(default_factory=lambda: uuid.uuid4().hex)


def _seg(value: str) -> str:
    return quote(value, safe="")


def _model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: cls.model_validate_json(response.content)


def _nothing(_: httpx.Response) -> None:
    return None


def _page(limit: int, before: str | None) -> dict[str, str | int | bool]:
    return {"limit": limit, **({"before": before} if before is not None else {})}


def _given(**fields: object) -> dict[str, Any]:
    """The fields given a value (None: left to the server's default)."""
    return {k: v for k, v in fields.items() if v is not None}


def _body(request: BaseModel, options: Mapping[str, object] | None = None) -> dict[str, Any]:
    """The JSON of the fields ``request`` was built with, but those set to None. ``options``
    are keyword options as the caller passed them: one the model does not know is sent too,
    for the server to reject by name."""
    known = type(request).model_fields
    unknown = _given(**{k: v for k, v in (options or {}).items() if k not in known})
    given = {k for k in request.model_fields_set if getattr(request, k) is not None}
    # include: each field given whole (exclude_unset would also thin a nested model);
    # warnings=False: a value of another type than the field's (never validated) goes as given
    return {**request.model_dump(mode="json", include=given, warnings=False), **unknown}


# -- health ----------------------------------------------------------------------------------


def healthz() -> Call[bool]:
    return Call("GET", "/healthz", lambda r: r.json().get("status") == "ok")


def readyz() -> Call[Readiness]:
    return Call("GET", "/readyz", _model(Readiness), also_ok=frozenset({503}))


# -- knowledge bases and documents -----------------------------------------------------------


def create_kb(name: str, description: str | None) -> Call[KbOut]:
    body = _body(KbCreate.model_construct(name=name, description=description))
    return Call("POST", "/v1/kbs", _model(KbOut), json=body)


def list_kbs() -> Call[list[KbOut]]:
    return Call("GET", "/v1/kbs", lambda r: KbList.model_validate_json(r.content).data)


def get_kb(kb: str) -> Call[KbOut]:
    return Call("GET", f"/v1/kbs/{_seg(kb)}", _model(KbOut))


def delete_kb(kb: str) -> Call[None]:
    return Call("DELETE", f"/v1/kbs/{_seg(kb)}", _nothing)


def get_chunk(kb: str, chunk_id: str) -> Call[ChunkDetail]:
    return Call("GET", f"/v1/kbs/{_seg(kb)}/chunks/{_seg(chunk_id)}", _model(ChunkDetail))


def add_document(
    kb: str,
    title: str,
    text: str,
    metadata: Metadata | None,
    source: str | None,
    media_type: str | None,
) -> Call[IngestOut]:
    optional = _given(metadata=metadata, source=source, media_type=media_type)
    body = _body(DocumentCreate.model_construct(title=title, text=text, **optional))
    return Call("POST", f"/v1/kbs/{_seg(kb)}/documents", _model(IngestOut), json=body)


def upload_file(
    kb: str,
    file: FileTuple,
    title: str | None,
    source: str | None,
    metadata: Metadata | None,
) -> Call[IngestOut]:
    form = _given(title=title, source=source)
    if metadata is not None:
        form["metadata"] = json.dumps(metadata)
    return Call(
        "POST",
        f"/v1/kbs/{_seg(kb)}/documents",
        _model(IngestOut),
        files={"file": file},
        data=form,
    )


def list_documents(kb: str, limit: int, offset: int) -> Call[DocumentPage]:
    params = {"limit": limit, "offset": offset}
    return Call("GET", f"/v1/kbs/{_seg(kb)}/documents", _model(DocumentPage), params=params)


def get_document(kb: str, doc: str, include_chunks: bool) -> Call[DocumentDetail]:
    path = f"/v1/kbs/{_seg(kb)}/documents/{_seg(doc)}"
    params = {"include_chunks": include_chunks}
    return Call("GET", path, _model(DocumentDetail), params=params)


def delete_document(kb: str, doc: str) -> Call[None]:
    return Call("DELETE", f"/v1/kbs/{_seg(kb)}/documents/{_seg(doc)}", _nothing)


def search(
    kb: str,
    query: str,
    top_k: int | None,
    filter: MetaFilter | None,
    score_threshold: float | None,
    mmr: bool | None,
    mode: SearchMode | None,
) -> Call[SearchResponse]:
    optional = _given(
        top_k=top_k, filter=filter, score_threshold=score_threshold, mmr=mmr, mode=mode
    )
    body = _body(SearchRequest.model_construct(query=query, **optional))
    return Call("POST", f"/v1/kbs/{_seg(kb)}/search", _model(SearchResponse), json=body)


# -- answers, generation, streams ------------------------------------------------------------


def ask(kb: str, question: str, options: AnswerOptions) -> StreamStart:
    request = AnswerRequest.model_construct(kb=kb, question=question, **options)
    return StreamStart("/v1/answers", _body(request, options))


def answer(kb: str, question: str, options: AnswerOptions) -> Call[AnswerResponse]:
    body = {**ask(kb, question, options).body, "stream": False}
    return Call("POST", "/v1/answers", _model(AnswerResponse), json=body)


def generate(prompt: str, options: GenerateOptions) -> StreamStart:
    request = GenerateRequest.model_construct(prompt=prompt, **options)
    return StreamStart("/v1/generate", _body(request, options))


def generate_text(prompt: str, options: GenerateOptions) -> Call[GenerateResponse]:
    body = {**generate(prompt, options).body, "stream": False}
    return Call("POST", "/v1/generate", _model(GenerateResponse), json=body)


def stream_status(stream_id: str) -> Call[StreamStatus]:
    return Call("GET", f"/v1/streams/{_seg(stream_id)}", _model(StreamStatus))


def cancel(stream_id: str) -> Call[CancelResponse]:
    return Call("POST", f"/v1/streams/{_seg(stream_id)}/cancel", _model(CancelResponse))


def stream_events_path(stream_id: str) -> str:
    return f"/v1/streams/{_seg(stream_id)}/events"


def list_conversations(limit: int, before: str | None) -> Call[ConversationList]:
    return Call("GET", "/v1/conversations", _model(ConversationList), params=_page(limit, before))


def conversation(conversation_id: str) -> Call[ConversationOut]:
    return Call("GET", f"/v1/conversations/{_seg(conversation_id)}", _model(ConversationOut))


# -- long-document jobs ----------------------------------------------------------------------


def create_job(kb: str, title: str, options: JobOptions) -> Call[JobOut]:
    body = _body(JobRequest.model_construct(kb=kb, title=title, **options), options)
    return Call("POST", "/v1/jobs", _model(JobOut), json=body)


def list_jobs(limit: int, before: str | None) -> Call[JobList]:
    return Call("GET", "/v1/jobs", _model(JobList), params=_page(limit, before))


def _job(job_id: str) -> str:
    return f"/v1/jobs/{_seg(job_id)}"


def get_job(job_id: str) -> Call[JobOut]:
    return Call("GET", _job(job_id), _model(JobOut))


def job_result(job_id: str) -> Call[JobResult]:
    params = {"format": "json"}
    return Call("GET", f"{_job(job_id)}/result", _model(JobResult), params=params)


def job_markdown(job_id: str) -> Call[str]:
    return Call("GET", f"{_job(job_id)}/result", lambda r: r.text)


def cancel_job(job_id: str) -> Call[JobOut]:
    return Call("POST", f"{_job(job_id)}/cancel", _model(JobOut))


def delete_job(job_id: str) -> Call[None]:
    return Call("DELETE", _job(job_id), _nothing)


def job_events_path(job_id: str) -> str:
    return f"{_job(job_id)}/events"


# -- usage, models and metrics ---------------------------------------------------------------


def usage(start: datetime | None, end: datetime | None) -> Call[UsageOut]:
    params = {k: v.isoformat() for k, v in (("from", start), ("to", end)) if v is not None}
    return Call("GET", "/v1/usage", _model(UsageOut), params=params)


def models() -> Call[ModelList]:
    return Call("GET", "/v1/models", _model(ModelList))


def model(model_id: str) -> Call[ModelCard]:
    return Call("GET", f"/v1/models/{_seg(model_id)}", _model(ModelCard))


def metrics() -> Call[str]:
    return Call("GET", "/metrics", lambda r: r.text)
