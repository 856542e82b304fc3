"""Knowledge bases, documents and search: request and response models."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

# Names appear in URLs next to ids, so they stay URL-safe.
KbName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
MetaKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
MetaScalar = str | int | float | bool
MetaValue = MetaScalar | list[MetaScalar]

# hybrid: dense (embedder) and BM25 (sparse) searches fused by reciprocal rank; dense or
# sparse: one of them alone.
SearchMode = Literal["hybrid", "dense", "sparse"]
MODE_DESCRIPTION = (
    "hybrid (default): the embedder's dense search and a BM25 keyword search (which segments "
    "Chinese) fused by reciprocal rank; dense or sparse: one of them alone"
)

MAX_FILTER_KEYS = 32
MAX_FILTER_VALUES = 256
_INT64 = (-(2**63), 2**63 - 1)  # Qdrant's payload integers


def _meta_scalar(value: object) -> MetaScalar:
    # By hand rather than a pydantic union: a union reports one error per member ("str: ...;
    # int: ...; list[union[...]]: ...") and a lax member would turn 1e30 into a float; here a
    # value keeps its JSON type (true stays a boolean, 2.0 a float) or gets one clear reason.
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise PydanticCustomError("meta_value", "integers must fit in 64 bits (signed)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):  # not JSON: stores and responses would choke on it
            raise PydanticCustomError("meta_value", "numbers must be finite (no NaN or infinity)")
        return value
    raise PydanticCustomError(
        "meta_value", "must be a string, a number, true or false, or a list of those"
    )


def _meta_value(value: object) -> MetaValue:
    if not isinstance(value, list):
        return _meta_scalar(value)
    if any(isinstance(v, list | dict) for v in value):
        raise PydanticCustomError(
            "meta_value", "a list may only hold strings, numbers, true and false"
        )
    return [_meta_scalar(v) for v in value]


def _filter_value(value: object) -> MetaValue:
    if isinstance(value, list) and not value:
        # "any of nothing" would match nothing: far more likely a client meant "no filter"
        raise PydanticCustomError(
            "filter_value", "an empty list matches nothing; leave the key out instead"
        )
    if isinstance(value, list) and len(value) > MAX_FILTER_VALUES:
        raise PydanticCustomError("filter_value", f"at most {MAX_FILTER_VALUES} values a key")
    return _meta_value(value)


def _value_schema(**list_bounds: int) -> WithJsonSchema:
    scalar = [{"type": t} for t in ("string", "integer", "number", "boolean")]
    array = {"type": "array", "items": {"anyOf": scalar}, **list_bounds}
    return WithJsonSchema({"anyOf": [*scalar, array]})


Metadata = dict[MetaKey, Annotated[MetaValue, PlainValidator(_meta_value), _value_schema()]]
# Every metadata value an upload accepts can be matched; an empty list cannot.
MetaFilter = dict[
    MetaKey,
    Annotated[
        MetaValue,
        PlainValidator(_filter_value),
        _value_schema(minItems=1, maxItems=MAX_FILTER_VALUES),
    ],
]


class KbCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

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
    model_config = ConfigDict(
        extra="forbid", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

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


# processing: a large upload being ingested in the background (not searchable yet); ready:
# stored whole and searchable; failed: its ingest stopped (``error`` says why), nothing stored.
DocumentStatus = Literal["processing", "ready", "failed"]


class IngestError(BaseModel):
    code: str
    message: str


class DocumentOut(BaseModel):
    id: str
    kb_id: str
    title: str
    source: str | None
    media_type: str
    content_hash: str
    metadata: dict[str, Any]
    chunk_count: int = Field(description="chunks of the document (processing: 0 until chunked)")
    created_at: datetime
    status: DocumentStatus = Field(
        "ready",
        description="processing (ingested in the background, not searchable yet), ready "
        "(searchable, whole), or failed (nothing was stored; see error)",
    )
    chunks_done: int = Field(0, description="chunks embedded so far, of chunk_count")
    error: IngestError | None = Field(None, description="why the ingest failed")


class IngestOut(DocumentOut):
    created: bool = Field(
        description="false when identical content was already stored (or is being ingested)"
    )
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


class ChunkDetail(ChunkOut):
    """A chunk with its document (what a citation URL points at)."""

    kb_id: str
    document: DocumentOut


class DocumentDetail(DocumentOut):
    text: str | None = Field(description="the document's text; null until it is ready")
    chunks: list[ChunkOut] | None = None


class DocumentPage(BaseModel):
    data: list[DocumentOut]
    total: int
    limit: int
    offset: int
    next_offset: int | None


class SearchRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

    query: str = Field(min_length=1, max_length=4000)
    top_k: int = Field(5, ge=1, le=100)
    filter: MetaFilter | None = Field(
        None,
        description="document metadata to match, every key: a value matches equal values "
        "(numbers by value, true/false only booleans), a list any of its values; a document "
        "whose metadata value is a list matches if any element does",
    )
    score_threshold: float | None = Field(
        None,
        ge=-1.0,
        le=1.0,
        allow_inf_nan=False,
        description="minimum cosine similarity of query and chunk under the embedder, in every "
        "mode (with an English-only embedder, leave it unset for other languages)",
    )
    mmr: bool = Field(False, description="diversify results (maximal marginal relevance)")
    mode: SearchMode = Field("hybrid", description=MODE_DESCRIPTION)

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is empty (only whitespace)")
        return value

    @field_validator("filter", mode="before")
    @classmethod
    def _few_keys(cls, value: object) -> object:
        if isinstance(value, dict) and len(value) > MAX_FILTER_KEYS:
            raise PydanticCustomError("filter_keys", f"at most {MAX_FILTER_KEYS} keys")
        return value


class SearchResult(BaseModel):
    chunk_id: str
    document_id: str
    title: str
    heading: str | None
    text: str
    start: int
    end: int
    score: float = Field(
        description="what ranked the result: cosine similarity (dense), BM25 (sparse), or the "
        "reciprocal-rank fusion of both (hybrid, comparable only within one response)"
    )


class SearchResponse(BaseModel):
    results: list[SearchResult]
    took_ms: float
