"""Tables. Every schema change comes with an Alembic revision in migrations/versions/."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from rag_stream.schemas.tenants import LOCAL_TENANT


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A moment in UTC, read back timezone-aware on every database.

    PostgreSQL keeps the offset (``timestamptz``); SQLite keeps only the wall-clock text and
    hands back a naive value, which the API would then serve without an offset. So values are
    converted to UTC on the way in and marked UTC on the way out. A naive value is taken to be
    UTC already (that is what SQLite stored).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else _as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else _as_utc(value)


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class NulFreeString(TypeDecorator[str]):
    """A string column every database can hold: PostgreSQL refuses U+0000 in text (the driver
    raises, and the request that carried it became a 500), SQLite keeps it. Bound values have
    it replaced by U+FFFD, on every database alike: stored text (a client's title, a model's
    output) keeps its length, and a lookup by a value that holds one finds nothing (a 404)
    instead of failing."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None or "\x00" not in value:
            return value
        return value.replace("\x00", "\ufffd")


class NulFreeText(NulFreeString):
    impl = Text
    cache_ok = True


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        datetime: UTCDateTime(),
    }


def _tenant_column() -> Mapped[str]:
    """The owning tenant (rows from before tenants belong to the open mode's one)."""
    return mapped_column(NulFreeString(64), default=LOCAL_TENANT, server_default=LOCAL_TENANT)


class ApiKey(Base):
    """An API key: only its SHA-256 is kept (a key is 256 random bits, so a fast hash is safe)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(NulFreeString(16), primary_key=True)
    tenant: Mapped[str] = mapped_column(NulFreeString(64), index=True)
    name: Mapped[str | None] = mapped_column(NulFreeString(128))
    key_hash: Mapped[str] = mapped_column(NulFreeString(64))
    prefix: Mapped[str] = mapped_column(NulFreeString(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class KnowledgeBase(Base):
    __tablename__ = "knowledge_bases"
    __table_args__ = (UniqueConstraint("tenant", "name", name="uq_knowledge_bases_tenant_name"),)

    id: Mapped[str] = mapped_column(NulFreeString(32), primary_key=True, default=new_id)
    tenant: Mapped[str] = _tenant_column()
    name: Mapped[str] = mapped_column(NulFreeString(128))
    description: Mapped[str | None] = mapped_column(NulFreeText)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    documents: Mapped[list[Document]] = relationship(
        back_populates="kb", cascade="all, delete-orphan", passive_deletes=True
    )


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (
        UniqueConstraint("kb_id", "content_hash", name="uq_documents_kb_hash"),
        UniqueConstraint("kb_id", "source", name="uq_documents_kb_source"),
    )

    id: Mapped[str] = mapped_column(NulFreeString(32), primary_key=True, default=new_id)
    kb_id: Mapped[str] = mapped_column(ForeignKey("knowledge_bases.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(NulFreeString(512))
    source: Mapped[str | None] = mapped_column(NulFreeString(1024))
    content_hash: Mapped[str] = mapped_column(NulFreeString(64))
    media_type: Mapped[str] = mapped_column(NulFreeString(128), default="text/plain")
    text: Mapped[str] = mapped_column(NulFreeText)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    kb: Mapped[KnowledgeBase] = relationship(back_populates="documents")
    chunks: Mapped[list[Chunk]] = relationship(
        back_populates="document", cascade="all, delete-orphan", passive_deletes=True
    )


class DocumentIngest(Base):
    """An upload being ingested in the background, or one whose ingest failed. The document
    row (with its chunks) is written only once the whole document is embedded, in the same
    transaction that deletes this row, so search never sees part of a document; until then
    ``GET .../documents/{id}`` reads this row (the document gets the same id)."""

    __tablename__ = "document_ingests"

    id: Mapped[str] = mapped_column(NulFreeString(32), primary_key=True, default=new_id)
    kb_id: Mapped[str] = mapped_column(
        ForeignKey("knowledge_bases.id", ondelete="CASCADE"), index=True
    )
    title: Mapped[str] = mapped_column(NulFreeString(512))
    source: Mapped[str | None] = mapped_column(NulFreeString(1024))
    content_hash: Mapped[str] = mapped_column(NulFreeString(64))
    media_type: Mapped[str] = mapped_column(NulFreeString(128))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    status: Mapped[str] = mapped_column(NulFreeString(16), default="processing")
    chunks_total: Mapped[int] = mapped_column(Integer, default=0)  # 0 until chunked
    chunks_done: Mapped[int] = mapped_column(Integer, default=0)
    error_code: Mapped[str | None] = mapped_column(NulFreeString(64))
    error_message: Mapped[str | None] = mapped_column(NulFreeText)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # renewed while a process works on it: a processing row left stale was abandoned
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (Index("ix_chunks_document_ordinal", "document_id", "ordinal"),)

    id: Mapped[str] = mapped_column(NulFreeString(32), primary_key=True, default=new_id)
    document_id: Mapped[str] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    kb_id: Mapped[str] = mapped_column(NulFreeString(32), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(NulFreeText)
    start: Mapped[int] = mapped_column(Integer)
    end: Mapped[int] = mapped_column(Integer)
    heading: Mapped[str | None] = mapped_column(NulFreeString(512))
    token_count: Mapped[int] = mapped_column(Integer)

    document: Mapped[Document] = relationship(back_populates="chunks")


class StreamRecord(Base):
    """A finished stream, kept after its Redis log expires."""

    __tablename__ = "streams"
    __table_args__ = (Index("ix_streams_tenant_created", "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(NulFreeString(64), primary_key=True)
    tenant: Mapped[str] = _tenant_column()
    kind: Mapped[str] = mapped_column(NulFreeString(16))
    model: Mapped[str] = mapped_column(NulFreeString(512))
    conversation_id: Mapped[str | None] = mapped_column(NulFreeString(32), index=True)
    finish_reason: Mapped[str] = mapped_column(NulFreeString(16))
    text: Mapped[str] = mapped_column(NulFreeText)
    usage: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # the usage again, as columns GET /v1/usage can sum
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Conversation(Base):
    __tablename__ = "conversations"
    # GET /v1/conversations: a tenant's, newest first
    __table_args__ = (Index("ix_conversations_tenant_created", "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(NulFreeString(32), primary_key=True, default=new_id)
    tenant: Mapped[str] = _tenant_column()
    kb_id: Mapped[str | None] = mapped_column(NulFreeString(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    messages: Mapped[list[Message]] = relationship(
        back_populates="conversation",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="Message.seq",
    )


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("conversation_id", "seq", name="uq_messages_seq"),)

    id: Mapped[str] = mapped_column(NulFreeString(32), primary_key=True, default=new_id)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(NulFreeString(16))
    content: Mapped[str] = mapped_column(NulFreeText)
    stream_id: Mapped[str | None] = mapped_column(NulFreeString(64), unique=True)
    citations: Mapped[dict[str, Any]] = mapped_column(default=dict)
    usage: Mapped[dict[str, Any]] = mapped_column(default=dict)
    finish_reason: Mapped[str | None] = mapped_column(NulFreeString(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    conversation: Mapped[Conversation] = relationship(back_populates="messages")


class Job(Base):
    """A long-document generation job; its events are the stream ``stream_id``."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_tenant_created", "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(NulFreeString(32), primary_key=True, default=new_id)
    tenant: Mapped[str] = _tenant_column()
    kb_id: Mapped[str] = mapped_column(NulFreeString(32))
    title: Mapped[str] = mapped_column(NulFreeText)
    instructions: Mapped[str | None] = mapped_column(NulFreeText)
    # the request as accepted (schemas/jobs.py JobSpec), then the outline once known
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(NulFreeString(16), default="queued")
    stream_id: Mapped[str | None] = mapped_column(NulFreeString(64), unique=True)
    sections_total: Mapped[int] = mapped_column(Integer, default=0)
    sections_done: Mapped[int] = mapped_column(Integer, default=0)
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    error_code: Mapped[str | None] = mapped_column(NulFreeString(64))
    error_message: Mapped[str | None] = mapped_column(NulFreeText)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class JobSection(Base):
    """One finished section of a job: its text and the sources it cites."""

    __tablename__ = "job_sections"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    heading: Mapped[str] = mapped_column(NulFreeText)
    text: Mapped[str] = mapped_column(NulFreeText)
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    finish_reason: Mapped[str] = mapped_column(NulFreeString(16))
    citations: Mapped[dict[str, Any]] = mapped_column(default=dict)  # schemas/jobs.py
    finished_at: Mapped[datetime] = mapped_column(default=utcnow)
