# Generated from async_client.py by scripts/gen_sync_client.py: do not edit. Change
# async_client.py and run `.venv/bin/python scripts/gen_sync_client.py`.
"""rag-stream's HTTP API, a method an endpoint: ``AsyncClient`` (async_client.py, written by
hand) and ``Client`` (sync_client.py, generated from it by scripts/gen_sync_client.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import TypeVar, Unpack

import httpx

from rag_stream.client import calls
from rag_stream.client.errors import api_error
from rag_stream.client.flavours import read_bytes, sleep
from rag_stream.client.options import (
    DEFAULT_TIMEOUT,
    AnswerOptions,
    GenerateOptions,
    JobOptions,
    OnReconnect,
    RetryPolicy,
    auth_headers,
    base_url,
)
from rag_stream.client.resume import Resumer
from rag_stream.client.sync_stream import EventStream
from rag_stream.errors import RagStreamError, from_code
from rag_stream.schemas.answers import AnswerResponse, ConversationOut
from rag_stream.schemas.conversations import ConversationList
from rag_stream.schemas.generate import GenerateResponse
from rag_stream.schemas.jobs import JobList, JobOut, JobResult
from rag_stream.schemas.kbs import (
    ChunkDetail,
    DocumentDetail,
    DocumentPage,
    IngestOut,
    KbOut,
    Metadata,
    MetaFilter,
    SearchMode,
    SearchResponse,
)
from rag_stream.schemas.openai import ModelCard, ModelList
from rag_stream.schemas.streams import CancelResponse, StreamStatus
from rag_stream.schemas.tenants import UsageOut

T = TypeVar("T")
FileInput = str | PathLike[str] | tuple[str, bytes]
# called with the document each time a wait for its ingest reads it (status, chunks_done of
# chunk_count): to draw a progress bar, say
OnProgress = Callable[[DocumentDetail], None]


class Client:
    """``url``: default ``RAG_STREAM_URL``, then http://127.0.0.1:8000; ``api_key``: default
    ``RAG_STREAM_API_KEY`` (sent as a Bearer token). Error answers raise rag-stream's typed
    errors (``client.errors``). ``ask``, ``generate``, ``follow`` and ``follow_job`` resume a
    dropped stream by themselves under ``retry``, calling ``on_reconnect`` before each new
    connection. ``AsyncClient`` is the same with ``await`` (``async for`` over the streams) and
    is closed with ``aclose()`` or ``async with``."""

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        on_reconnect: OnReconnect | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = base_url(url)
        self.retry = retry or RetryPolicy()
        self.on_reconnect = on_reconnect
        headers = {"User-Agent": "rag-stream-client", **auth_headers(api_key)}
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, call: calls.Call[T]) -> T:
        response = self._http.request(
            call.method,
            call.path,
            json=call.json,
            params=call.params,
            files=call.files,
            data=call.data,
        )
        if response.is_error and response.status_code not in call.also_ok:
            raise api_error(response)
        return call.parse(response)

    def _stream(
        self,
        start: calls.StreamStart | None,
        stream_id: str | None,
        after: int,
        events_path: str | None = None,
    ) -> EventStream:
        resumer = Resumer(stream_id, after, self.retry, self.on_reconnect, events_path)
        return EventStream(self._http, start, resumer)

    # -- health --------------------------------------------------------------------------------

    def healthz(self) -> bool:
        return self._send(calls.healthz())

    def readyz(self) -> calls.Readiness:
        return self._send(calls.readyz())

    # -- knowledge bases and documents ---------------------------------------------------------

    def create_kb(self, name: str, description: str | None = None) -> KbOut:
        return self._send(calls.create_kb(name, description))

    def list_kbs(self) -> list[KbOut]:
        return self._send(calls.list_kbs())

    def get_kb(self, kb: str) -> KbOut:
        return self._send(calls.get_kb(kb))

    def delete_kb(self, kb: str) -> None:
        self._send(calls.delete_kb(kb))

    def get_chunk(self, kb: str, chunk_id: str) -> ChunkDetail:
        return self._send(calls.get_chunk(kb, chunk_id))

    def add_document(
        self,
        kb: str,
        title: str,
        text: str,
        *,
        metadata: Metadata | None = None,
        source: str | None = None,
        media_type: str | None = None,
        wait: bool = True,
        on_progress: OnProgress | None = None,
    ) -> IngestOut:
        """Add a text. A long one is ingested in the background (the server answers 202):
        with ``wait`` this returns once it is ready (``on_progress`` sees each step; a failure
        raises its error), without it at once, ``status`` ``processing``."""
        call = calls.add_document(kb, title, text, metadata, source, media_type)
        return self._settled(kb, self._send(call), wait, on_progress)

    def upload_file(
        self,
        kb: str,
        file: FileInput,
        *,
        title: str | None = None,
        source: str | None = None,
        metadata: Metadata | None = None,
        content_type: str | None = None,
        wait: bool = True,
        on_progress: OnProgress | None = None,
    ) -> IngestOut:
        """Upload a .txt, .md, .html or .pdf: a path, or ``(filename, content)``. A long one
        is ingested in the background, and waited for as ``add_document`` says."""
        if isinstance(file, tuple):
            name, content = file
        else:
            path = Path(file)
            name, content = path.name, read_bytes(path)
        upload = calls.upload_file(kb, (name, content, content_type), title, source, metadata)
        return self._settled(kb, self._send(upload), wait, on_progress)

    def wait_document(
        self,
        kb: str,
        doc: str,
        *,
        on_progress: OnProgress | None = None,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> DocumentDetail:
        """Read the document every ``poll_s`` until its ingest has ended: the document once
        ``ready``; its error raised once ``failed`` (``TimeoutError`` after ``timeout_s``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            document = self.get_document(kb, doc)
            if on_progress is not None:
                on_progress(document)
            if document.status == "ready":
                return document
            if document.status == "failed":
                raise _failure(document)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"document {doc} is still being ingested after {timeout_s} s")
            sleep(poll_s)

    def _settled(
        self, kb: str, accepted: IngestOut, wait: bool, on_progress: OnProgress | None
    ) -> IngestOut:
        if not wait or accepted.status != "processing":
            return accepted
        done = self.wait_document(kb, accepted.id, on_progress=on_progress)
        return IngestOut(**done.model_dump(exclude={"text", "chunks"}), created=accepted.created)

    def list_documents(self, kb: str, *, limit: int = 20, offset: int = 0) -> DocumentPage:
        return self._send(calls.list_documents(kb, limit, offset))

    def get_document(self, kb: str, doc: str, *, include_chunks: bool = False) -> DocumentDetail:
        return self._send(calls.get_document(kb, doc, include_chunks))

    def delete_document(self, kb: str, doc: str) -> None:
        self._send(calls.delete_document(kb, doc))

    def search(
        self,
        kb: str,
        query: str,
        *,
        top_k: int | None = None,
        filter: MetaFilter | None = None,
        score_threshold: float | None = None,
        mmr: bool | None = None,
        mode: SearchMode | None = None,
    ) -> SearchResponse:
        return self._send(calls.search(kb, query, top_k, filter, score_threshold, mmr, mode))

    # -- answers, generation, streams ----------------------------------------------------------

    def ask(self, kb: str, question: str, **options: Unpack[AnswerOptions]) -> EventStream:
        """Ask the knowledge base: ``stream``, ``citation``s, ``token``s, then ``done``."""
        return self._stream(calls.ask(kb, question, options), None, -1)

    def answer(self, kb: str, question: str, **options: Unpack[AnswerOptions]) -> AnswerResponse:
        """The whole answer at once (``stream: false``)."""
        return self._send(calls.answer(kb, question, options))

    def generate(self, prompt: str, **options: Unpack[GenerateOptions]) -> EventStream:
        return self._stream(calls.generate(prompt, options), None, -1)

    def generate_text(self, prompt: str, **options: Unpack[GenerateOptions]) -> GenerateResponse:
        return self._send(calls.generate_text(prompt, options))

    def follow(self, stream_id: str, *, after: int | None = None) -> EventStream:
        """A stream's events after event ``after`` (None: from its first event)."""
        return self._stream(None, stream_id, -1 if after is None else after)

    def stream_status(self, stream_id: str) -> StreamStatus:
        return self._send(calls.stream_status(stream_id))

    def cancel(self, stream_id: str) -> CancelResponse:
        """Stop the stream on the server (waits for its ``done``, up to 10 s there)."""
        return self._send(calls.cancel(stream_id))

    def list_conversations(self, *, limit: int = 20, before: str | None = None) -> ConversationList:
        """The caller's conversations, newest first; ``before=page.next_before`` pages on."""
        return self._send(calls.list_conversations(limit, before))

    def conversation(self, conversation_id: str) -> ConversationOut:
        return self._send(calls.conversation(conversation_id))

    # -- long-document jobs --------------------------------------------------------------------

    def create_job(self, kb: str, title: str, **options: Unpack[JobOptions]) -> JobOut:
        """Start writing a document in the background (an ``outline`` of headings, or
        ``sections`` for the model to plan); ``follow_job`` shows it being written."""
        return self._send(calls.create_job(kb, title, options))

    def list_jobs(self, *, limit: int = 20, before: str | None = None) -> JobList:
        """The caller's jobs, newest first; ``before=page.next_before`` pages on."""
        return self._send(calls.list_jobs(limit, before))

    def get_job(self, job_id: str) -> JobOut:
        """Status and progress."""
        return self._send(calls.get_job(job_id))

    def follow_job(self, job_id: str, *, after: int | None = None) -> EventStream:
        """The job's events after event ``after`` (None: from its first): ``stream``, ``job``,
        ``outline``, then per section ``section``, ``citation``s, ``token``s (with their
        ``section``) and ``section_done``; ``done`` or ``error`` last. Resumed as ``follow``."""
        path = calls.job_events_path(job_id)
        return self._stream(None, None, -1 if after is None else after, path)

    def job_result(self, job_id: str) -> JobResult:
        """The document so far: its sections and numbered sources (``complete`` once every
        section is written)."""
        return self._send(calls.job_result(job_id))

    def job_markdown(self, job_id: str) -> str:
        """The document so far as Markdown, ending with its Sources list."""
        return self._send(calls.job_markdown(job_id))

    def cancel_job(self, job_id: str) -> JobOut:
        """Stop the job; the sections written so far stay (a no-op once it has ended)."""
        return self._send(calls.cancel_job(job_id))

    def delete_job(self, job_id: str) -> None:
        """Delete the job and its sections (cancelled first if it still runs)."""
        self._send(calls.delete_job(job_id))

    # -- usage, models and metrics -------------------------------------------------------------

    def usage(self, start: datetime | None = None, end: datetime | None = None) -> UsageOut:
        """Requests and tokens of the caller's streams that ended in ``[start, end)``."""
        return self._send(calls.usage(start, end))

    def models(self) -> ModelList:
        return self._send(calls.models())

    def model(self, model_id: str) -> ModelCard:
        return self._send(calls.model(model_id))

    def metrics(self) -> str:
        """``/metrics``: the Prometheus text format (parse it with ``prometheus_client``)."""
        return self._send(calls.metrics())


def _failure(document: DocumentDetail) -> RagStreamError:
    """A failed document's error as the exception of its code."""
    code, message = "internal_error", "the ingest failed"
    if document.error is not None:
        code, message = document.error.code, document.error.message
    exc = from_code(code, f"document {document.id}: {message}")
    exc.code = code
    return exc
