"""``AsyncClient``: rag-stream's HTTP API from async code (the twin of ``Client``)."""

from __future__ import annotations

from datetime import datetime
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import TypeVar, Unpack

import anyio
import httpx

from rag_stream.client import calls
from rag_stream.client.async_stream import AsyncEventStream
from rag_stream.client.errors import api_error
from rag_stream.client.options import (
    DEFAULT_TIMEOUT,
    AnswerOptions,
    GenerateOptions,
    OnReconnect,
    RetryPolicy,
    auth_headers,
    base_url,
)
from rag_stream.client.resume import Resumer
from rag_stream.schemas.answers import AnswerResponse, ConversationOut
from rag_stream.schemas.generate import GenerateResponse
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


class AsyncClient:
    """As ``Client``, with ``await`` (and ``async for`` over ``ask``, ``generate`` and
    ``follow``); close it with ``aclose()`` or ``async with``."""

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        on_reconnect: OnReconnect | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = base_url(url)
        self.retry = retry or RetryPolicy()
        self.on_reconnect = on_reconnect
        headers = {"User-Agent": "rag-stream-client", **auth_headers(api_key)}
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _send(self, call: calls.Call[T]) -> T:
        response = await self._http.request(
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
        self, start: calls.StreamStart | None, stream_id: str | None, after: int
    ) -> AsyncEventStream:
        resumer = Resumer(stream_id, after, self.retry, self.on_reconnect)
        return AsyncEventStream(self._http, start, resumer)

    # -- health --------------------------------------------------------------------------------

    async def healthz(self) -> bool:
        return await self._send(calls.healthz())

    async def readyz(self) -> calls.Readiness:
        return await self._send(calls.readyz())

    # -- knowledge bases and documents ---------------------------------------------------------

    async def create_kb(self, name: str, description: str | None = None) -> KbOut:
        return await self._send(calls.create_kb(name, description))

    async def list_kbs(self) -> list[KbOut]:
        return await self._send(calls.list_kbs())

    async def get_kb(self, kb: str) -> KbOut:
        return await self._send(calls.get_kb(kb))

    async def delete_kb(self, kb: str) -> None:
        await self._send(calls.delete_kb(kb))

    async def get_chunk(self, kb: str, chunk_id: str) -> ChunkDetail:
        return await self._send(calls.get_chunk(kb, chunk_id))

    async def add_document(
        self,
        kb: str,
        title: str,
        text: str,
        *,
        metadata: Metadata | None = None,
        source: str | None = None,
        media_type: str | None = None,
    ) -> IngestOut:
        return await self._send(calls.add_document(kb, title, text, metadata, source, media_type))

    async def upload_file(
        self,
        kb: str,
        file: FileInput,
        *,
        title: str | None = None,
        source: str | None = None,
        metadata: Metadata | None = None,
        content_type: str | None = None,
    ) -> IngestOut:
        """Upload a .txt, .md, .html or .pdf: a path, or ``(filename, content)``."""
        if isinstance(file, tuple):
            name, content = file
        else:
            path = Path(file)
            name, content = path.name, await anyio.Path(path).read_bytes()
        upload = calls.upload_file(kb, (name, content, content_type), title, source, metadata)
        return await self._send(upload)

    async def list_documents(self, kb: str, *, limit: int = 20, offset: int = 0) -> DocumentPage:
        return await self._send(calls.list_documents(kb, limit, offset))

    async def get_document(
        self, kb: str, doc: str, *, include_chunks: bool = False
    ) -> DocumentDetail:
        return await self._send(calls.get_document(kb, doc, include_chunks))

    async def delete_document(self, kb: str, doc: str) -> None:
        await self._send(calls.delete_document(kb, doc))

    async def search(
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
        return await self._send(calls.search(kb, query, top_k, filter, score_threshold, mmr, mode))

    # -- answers, generation, streams ----------------------------------------------------------

    def ask(self, kb: str, question: str, **options: Unpack[AnswerOptions]) -> AsyncEventStream:
        """Ask the knowledge base: ``stream``, ``citation``s, ``token``s, then ``done``."""
        return self._stream(calls.ask(kb, question, options), None, -1)

    async def answer(
        self, kb: str, question: str, **options: Unpack[AnswerOptions]
    ) -> AnswerResponse:
        """The whole answer at once (``stream: false``)."""
        return await self._send(calls.answer(kb, question, options))

    def generate(self, prompt: str, **options: Unpack[GenerateOptions]) -> AsyncEventStream:
        return self._stream(calls.generate(prompt, options), None, -1)

    async def generate_text(
        self, prompt: str, **options: Unpack[GenerateOptions]
    ) -> GenerateResponse:
        return await self._send(calls.generate_text(prompt, options))

    def follow(self, stream_id: str, *, after: int | None = None) -> AsyncEventStream:
        """A stream's events after event ``after`` (None: from its first event)."""
        return self._stream(None, stream_id, -1 if after is None else after)

    async def stream_status(self, stream_id: str) -> StreamStatus:
        return await self._send(calls.stream_status(stream_id))

    async def cancel(self, stream_id: str) -> CancelResponse:
        """Stop the stream on the server (waits for its ``done``, up to 10 s there)."""
        return await self._send(calls.cancel(stream_id))

    async def conversation(self, conversation_id: str) -> ConversationOut:
        return await self._send(calls.conversation(conversation_id))

    # -- usage and models ----------------------------------------------------------------------

    async def usage(self, start: datetime | None = None, end: datetime | None = None) -> UsageOut:
        """Requests and tokens of the caller's streams that ended in ``[start, end)``."""
        return await self._send(calls.usage(start, end))

    async def models(self) -> ModelList:
        return await self._send(calls.models())

    async def model(self, model_id: str) -> ModelCard:
        return await self._send(calls.model(model_id))
