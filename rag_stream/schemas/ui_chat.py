"""The Vercel AI SDK's UI message stream (protocol v1), as ``POST /v1/ui/chat`` speaks it.

The request is what the AI SDK's ``DefaultChatTransport`` sends (``id``, ``messages`` of UI
parts, ``trigger``, ``messageId``) plus ``model`` (an id from ``GET /v1/models``) and the
extras the other answer routes take. Of a message's parts only text is read: an assistant
turn's sources, steps and reasoning are its display, not its words; a file in a user turn is
refused (no route here reads files in a question). The response's parts are the ``UI*``
models below, one JSON object per SSE ``data:`` line, ending ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rag_stream.schemas.answers import TOP_K_CEILING
from rag_stream.schemas.generate import CoalesceOption, MaxTokens, Priority, Seed
from rag_stream.schemas.kbs import MODE_DESCRIPTION, SearchMode

UI_STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
CHAT_ID_MAX = 200


class UIPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # each part type has fields of its own

    type: str = Field(min_length=1, max_length=100)
    text: str = ""


class UIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # createdAt and the like: not used

    id: str = ""
    role: Literal["system", "user", "assistant"]
    parts: list[UIPart] = Field(max_length=1000)
    metadata: Any = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if p.type == "text")


class UIChatRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

    id: str = Field(
        min_length=1,
        max_length=CHAT_ID_MAX,
        description="the chat's id: GET /v1/ui/chat/{id}/stream resumes its latest answer",
    )
    messages: list[UIMessage] = Field(min_length=1, max_length=1000)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = Field(
        None,
        max_length=CHAT_ID_MAX,
        description="the assistant message's id, if the client chose it",
    )
    model: str = Field(
        min_length=1, description="the engine's model, or kb:<name> to answer from that KB"
    )
    # rag-stream's extras, as on /v1/answers
    top_k: int | None = Field(None, ge=0, le=TOP_K_CEILING)
    max_tokens: MaxTokens | None = None
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = None
    ignore_eos: bool = False
    mmr: bool = False
    mode: SearchMode = Field("hybrid", description=MODE_DESCRIPTION)
    coalesce: CoalesceOption = None
    priority: Priority = "interactive"

    @model_validator(mode="after")
    def _answerable(self) -> UIChatRequest:
        for message in self.messages:
            if message.role == "user" and any(p.type == "file" for p in message.parts):
                raise ValueError("messages: file parts are not supported (text only)")
        last = self.messages[-1]
        if last.role != "user" or not last.text.strip():
            raise ValueError("messages: the last message must be the user's, with text")
        return self

    @property
    def stops(self) -> list[str]:
        return []


class UIWire(BaseModel):
    """Stored with a UI chat stream, so a resume renders the same parts wherever it is served."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["ai-sdk.ui"] = "ai-sdk.ui"
    model: str
    kb: str | None
    chunk_url_base: str  # source URLs: <base>/v1/kbs/<kb>/chunks/<chunk_id>
    message_id: str | None = None  # None: msg-<stream id>


# -- the parts, in the order a stream sends them ----------------------------------------------


class UIStart(BaseModel):
    type: Literal["start"] = "start"
    messageId: str
    messageMetadata: dict[str, Any]


class UISourceUrl(BaseModel):
    type: Literal["source-url"] = "source-url"
    sourceId: str
    url: str
    title: str
    providerMetadata: dict[str, dict[str, Any]]


class UIFinish(BaseModel):
    type: Literal["finish"] = "finish"
    finishReason: Literal["stop", "length", "other", "error"]
    messageMetadata: dict[str, Any]


class UIAbort(BaseModel):
    type: Literal["abort"] = "abort"
    reason: str


class UIError(BaseModel):
    type: Literal["error"] = "error"
    errorText: str
