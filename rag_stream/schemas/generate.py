"""POST /v1/generate."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rag_stream.schemas.events import Timings, Usage


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    chat: bool = Field(False, description="wrap the prompt in the model's chat template")
    stream: bool = True


class GenerateResponse(BaseModel):
    stream_id: str
    model: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
