"""Ingest many documents (CLI, sample KB) in waves: the chunks of several documents are
embedded together, as fast as one ``encode`` over all texts, while every document still
commits on its own (see ``rag_stream.ingest.writer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rag_stream.errors import InvalidRequest, NotFound
from rag_stream.ingest.documents import DocumentDraft, DocumentPreparer, PreparedDocument
from rag_stream.ingest.writer import DocumentWriter, IngestResult, Outcome

OnOutcome = Callable[[Any, Outcome], None]
# (chunks embedded, chunks in the wave) after each embedding step: progress within a wave,
# which for one large file is the whole ingest
OnChunks = Callable[[int, int], None]


class IngestBatch:
    """Collects prepared documents into waves of about ``wave_chunks`` chunks and writes each
    wave; ``on_outcome(tag, result or error)`` is called once per added document."""

    def __init__(
        self,
        preparer: DocumentPreparer,
        writer: DocumentWriter,
        kb_id: str,
        on_outcome: OnOutcome | None,
        wave_chunks: int,
        on_chunks: OnChunks | None = None,
    ) -> None:
        self._preparer = preparer
        self._writer = writer
        self._kb_id = kb_id
        self._on_outcome = on_outcome
        self._wave_chunks = wave_chunks
        self._on_chunks = on_chunks
        self._wave: list[tuple[Any, PreparedDocument]] = []
        self._chunks = 0

    async def __aenter__(self) -> IngestBatch:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.flush()

    async def add(self, draft: DocumentDraft, tag: Any = None) -> None:
        try:
            prepared = await self._preparer.prepare(self._kb_id, draft)
        except (InvalidRequest, NotFound) as exc:
            self._report(tag, exc)
            return
        if not isinstance(prepared, PreparedDocument):
            self._report(tag, IngestResult(prepared, created=False))
            return
        self._wave.append((tag, prepared))
        self._chunks += len(prepared.chunk_ids)
        if self._chunks >= self._wave_chunks:
            await self.flush()

    async def flush(self) -> None:
        wave, self._wave, self._chunks = self._wave, [], 0
        if not wave:
            return
        total = sum(len(prepared.chunk_ids) for _, prepared in wave)

        async def progress(done: int) -> None:
            if self._on_chunks is not None:
                self._on_chunks(done, total)

        outcomes = await self._writer.write([prepared for _, prepared in wave], progress)
        for (tag, _), outcome in zip(wave, outcomes, strict=True):
            self._report(tag, outcome)

    def _report(self, tag: Any, outcome: Outcome) -> None:
        if self._on_outcome is not None:
            self._on_outcome(tag, outcome)
