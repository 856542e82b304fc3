"""POST /v1/generate, and the sampling fields every generating request shares."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from rag_stream.schemas.events import Timings, Usage

# vLLM serializes the request (msgspec) and seeds a torch generator with it: both take a signed
# 64-bit integer, and a wider one fails inside the engine as a 500 or an `error` event. This is
# the range vLLM's own OpenAI server accepts.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1
# Far above any context window: the configured limit (limits.max_tokens) is checked when the
# request is accepted, with its own message; this bound keeps absurd numbers out before that.
MAX_TOKENS_CEILING = 1_000_000


def _seed_bound(schema: JsonDict) -> None:
    """The upper bound as ``exclusiveMaximum`` 2^63 in the schema: FastAPI's document holds
    bounds as floats on the way (api/openapi.py turns them back into integers), and 2^63 - 1
    would become 2^63, while 2^63 is a float exactly."""
    del schema["maximum"]
    schema["exclusiveMaximum"] = SEED_MAX + 1


Seed = Annotated[
    int,
    Field(
        ge=SEED_MIN,
        le=SEED_MAX,
        description="a signed 64-bit integer",
        json_schema_extra=_seed_bound,
    ),
]
MaxTokens = Annotated[
    int,
    Field(ge=1, le=MAX_TOKENS_CEILING, description="at most the server's limits.max_tokens"),
]


class Coalesce(BaseModel):
    """Up to ``tokens`` tokens per ``token`` event, sent when that many are ready or ``ms``
    milliseconds after the first of them, whichever comes first (0 ms: at once)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    tokens: int = Field(1, ge=1, le=64)
    ms: float = Field(0.0, ge=0.0, le=1000.0)


Priority = Annotated[
    Literal["interactive", "batch"],
    Field(
        description="interactive requests get generation slots before batch ones when the "
        "server is busy"
    ),
]

CoalesceOption = Annotated[
    Coalesce | Literal["auto"] | None,
    Field(
        description="tokens per `token` event: {tokens, ms}; `auto` coalesces on slow "
        "connections (measured round-trip time above the server's streaming.coalesce_rtt_ms); "
        "absent: the server's defaults (streaming.coalesce_tokens / coalesce_ms)"
    ),
]


class GenerateRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

    prompt: str = Field(min_length=1)
    max_tokens: MaxTokens | None = None
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = None
    chat: bool = Field(False, description="wrap the prompt in the model's chat template")
    stream: bool = True
    coalesce: CoalesceOption = None
    priority: Priority = "interactive"


class GenerateResponse(BaseModel):
    stream_id: str
    model: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
