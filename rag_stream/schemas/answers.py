"""POST /v1/answers and GET /v1/conversations/{id}."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_stream.schemas.events import CitationBody, Timings, Usage
from rag_stream.schemas.generate import CoalesceOption, MaxTokens, Priority, Seed
from rag_stream.schemas.kbs import MODE_DESCRIPTION, SearchMode

# The configured limit (answers.max_top_k) is checked when the request is accepted; this bound
# only keeps absurd numbers out before that.
TOP_K_CEILING = 1000


class AnswerRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

    kb: str = Field(min_length=1, description="knowledge base name or id")
    question: str = Field(min_length=1)
    conversation_id: str | None = None
    top_k: int | None = Field(
        None,
        ge=0,
        le=TOP_K_CEILING,
        description="0: no retrieval (history only); at most the server's answers.max_top_k",
    )
    max_tokens: MaxTokens | None = None
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = None
    mmr: bool = False
    mode: SearchMode = Field("hybrid", description=MODE_DESCRIPTION)
    stream: bool = True
    coalesce: CoalesceOption = None
    priority: Priority = "interactive"

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty or only whitespace")
        return value


class AnswerResponse(BaseModel):
    stream_id: str
    conversation_id: str
    model: str
    answer: str
    citations: list[CitationBody]
    finish_reason: str
    usage: Usage
    timings: Timings
    cited: list[int]
    dropped_sources: int


class MessageOut(BaseModel):
    seq: int
    role: str
    content: str
    stream_id: str | None
    citations: dict[str, Any]
    usage: dict[str, Any]
    finish_reason: str | None
    created_at: datetime


class ConversationOut(BaseModel):
    id: str
    kb_id: str | None
    created_at: datetime
    messages: list[MessageOut]
