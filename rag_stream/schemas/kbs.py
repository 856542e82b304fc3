"""Knowledge bases, documents and search: request and response models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

# Names appear in URLs next to ids, so they stay URL-safe.
KbName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
MetaKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
MetaScalar = str | int | float | bool
MetaValue = MetaScalar | list[MetaScalar]
Metadata = dict[MetaKey, MetaValue]


class KbCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: KbName = Field(description="unique; letters, digits, '.', '_' and '-'")
    description: str | None = Field(None, max_length=4000)


class KbOut(BaseModel):
    id: str
    name: str
    description: str | None
    created_at: datetime
    document_count: int
    chunk_count: int


class KbList(BaseModel):
    data: list[KbOut]


class DocumentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=512)
    text: str = Field(min_length=1)
    metadata: Metadata = Field(default_factory=dict)
    source: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="where the text comes from; uploading the same source again replaces it",
    )
    # Markdown by default: plain prose reads the same, and "# headings" then name the chunks.
    media_type: Literal["text/plain", "text/markdown"] = "text/markdown"

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty (only whitespace)")
        return value


class DocumentOut(BaseModel):
    id: str
    kb_id: str
    title: str
    source: str | None
    media_type: str
    content_hash: str
    metadata: dict[str, Any]
    chunk_count: int
    created_at: datetime


class IngestOut(DocumentOut):
    created: bool = Field(description="false when identical content was already stored")
    replaced_document_id: str | None = Field(
        None, description="the previous version with the same source, now deleted"
    )


class ChunkOut(BaseModel):
    id: str
    ordinal: int
    start: int = Field(description="character offset of the chunk in the document text")
    end: int
    heading: str | None
    token_count: int
    text: str


class DocumentDetail(DocumentOut):
    text: str
    chunks: list[ChunkOut] | None = None


class DocumentPage(BaseModel):
    data: list[DocumentOut]
    total: int
    limit: int
    offset: int
    next_offset: int | None


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=4000)
    top_k: int = Field(5, ge=1, le=100)
    filter: Metadata | None = Field(
        None, description="document metadata to match; a list matches any of its values"
    )
    score_threshold: float | None = Field(None, ge=-1.0, le=1.0)
    mmr: bool = Field(False, description="diversify results (maximal marginal relevance)")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is empty (only whitespace)")
        return value


class SearchResult(BaseModel):
    chunk_id: str
    document_id: str
    title: str
    heading: str | None
    text: str
    start: int
    end: int
    score: float


class SearchResponse(BaseModel):
    results: list[SearchResult]
    took_ms: float
