"""OpenAI's Chat Completions and Models wire format, as rag-stream speaks it.

Requests are checked strictly: a field OpenAI defines but rag-stream does not implement is
accepted only at its neutral value (``frequency_penalty: 0``, ``logprobs: false``, ...), so a
client that sends its defaults works unchanged and one that asks for more is told what is
missing; a field OpenAI does not define is refused. rag-stream's own extras are ``top_k``,
``mmr``, ``mode`` and ``coalesce``. The first problem found becomes OpenAI's error object, with
``param`` naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator
from pydantic.config import JsonDict

from rag_stream.schemas.answers import TOP_K_CEILING
from rag_stream.schemas.events import CitationBody
from rag_stream.schemas.generate import CoalesceOption, MaxTokens, Priority, Seed
from rag_stream.schemas.kbs import SearchMode

KB_MODEL_PREFIX = "kb:"
# The header a chat client sends to get its sources in the shape it shows (see ChatWire).
SOURCES_HEADER = "X-Rag-Stream-Sources"
SourceShape = Literal["search_results", "open-webui"]
# Where errors take OpenAI's statuses too (400 for a bad request, not 422).
OPENAI_PATHS = ("/v1/chat/", "/v1/models")

# OpenAI fields rag-stream does not implement, with the values that mean "not used".
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    "store": (False,),
    "metadata": ({},),
    "service_tier": ("auto", "default"),
    "prediction": (),
    "audio": (),
    "web_search_options": (),
    "reasoning_effort": (),
    "verbosity": (),
    "prompt_cache_key": (),
    "safety_identifier": (),
}


class UnsupportedParameter(ValueError):
    """A request field rag-stream refuses; ``param`` names it (OpenAI's ``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str = ""

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type != "text":
            raise UnsupportedParameter(
                "messages", f"only text content is supported, not {self.type[:40]!r} parts"
            )
        return self


def _user_needs_text(schema: JsonDict) -> None:
    """A user message's ``content`` is required and not empty, in the schema as in OpenAI's: a
    branch per role, over the message's own properties (the check itself is
    ChatCompletionRequest's, whose 400 names the message by its index)."""
    text_part: JsonDict = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string", "minLength": 1}},
    }
    text: JsonDict = {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": text_part, "minItems": 1},
        ]
    }
    others: list[JsonValue] = ["system", "developer", "assistant"]
    schema["anyOf"] = [
        {"properties": {"role": {"const": "user"}, "content": text}, "required": ["content"]},
        {"properties": {"role": {"enum": others}}},
    ]


class ChatMessage(BaseModel):
    # (other fields, name, refusal, ...: not used)
    model_config = ConfigDict(extra="ignore", json_schema_extra=_user_needs_text)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = Field(
        None, description="the text, or text parts; a user message must have some"
    )

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")  # description, parameters, strict: not used

    name: str = Field(min_length=1, max_length=64)


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDefinition


# The model answers in text and never calls a tool, so a request may offer tools (chat front
# ends such as Open WebUI offer their built-in ones with every message) but not require a call.
_TOOL_CHOICES_ANSWERED = (None, "none", "auto")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class ChatCompletionRequest(BaseModel):
    # OpenAI's other fields pass through to the check below; anything else is refused there.
    model_config = ConfigDict(
        extra="allow", strict=True
    )  # JSON types as they are: no "7" for 7, no 0 for false

    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    # vLLM's extra, which its benchmark client sends: generate exactly max_tokens
    ignore_eos: bool = False
    # offered tools are accepted and never called (see _TOOL_CHOICES_ANSWERED)
    tools: list[ToolDefinition] | None = Field(None, max_length=128)
    tool_choice: str | dict[str, object] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[FunctionDefinition] | None = Field(None, max_length=128)  # (deprecated)
    function_call: str | dict[str, object] | None = None  # (deprecated form of tool_choice)
    # rag-stream's extras
    top_k: int | None = Field(None, ge=0, le=TOP_K_CEILING)
    mmr: bool = False
    mode: SearchMode = "hybrid"  # retrieval for a kb: model (schemas/kbs.py)
    coalesce: CoalesceOption = None
    priority: Priority = "interactive"

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        for name, value in (self.model_extra or {}).items():
            if name not in _NEUTRAL:
                raise UnsupportedParameter(name, f"Unrecognized request argument supplied: {name}")
            if value is not None and value not in _NEUTRAL[name]:
                raise UnsupportedParameter(
                    name, f"{name} is not supported by this server (only its default is accepted)"
                )
        for name, choice in (
            ("tool_choice", self.tool_choice),
            ("function_call", self.function_call),
        ):
            if choice not in _TOOL_CHOICES_ANSWERED:
                raise UnsupportedParameter(
                    name,
                    f"{name} must be 'auto' or 'none': this server answers in text and calls no "
                    "tools, so it cannot honour a required or named tool call",
                )
        if self.n != 1:
            raise UnsupportedParameter("n", f"n must be 1 (one choice per request), got {self.n}")
        if self.stream_options is not None and not self.stream:
            raise UnsupportedParameter(
                "stream_options", "stream_options is only allowed when stream is true"
            )
        for stop in self.stops:
            if not stop:
                raise UnsupportedParameter("stop", "stop sequences must not be empty")
        if len(self.stops) > 4:
            raise UnsupportedParameter("stop", "at most 4 stop sequences")
        if not any(m.role == "user" for m in self.messages):
            raise UnsupportedParameter("messages", "messages must contain a user message")
        for i, message in enumerate(self.messages):
            # OpenAI refuses these too; an empty question would reach the model as nothing
            if message.role == "user" and not message.text:
                given = "null" if message.content is None else "empty"
                raise UnsupportedParameter(
                    f"messages[{i}].content",
                    f"messages[{i}].content: a user message must have text, not {given} content",
                )
        if self.messages[-1].role != "user":
            raise UnsupportedParameter(
                "messages", "the last message must be the user's (the question to answer)"
            )
        return self

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


# -- what goes through the log: how a stream's events are rendered -----------------------------


class ChatWire(BaseModel):
    """Stored with a chat-completions stream, so a resume renders it in the same format (and
    the same citation URLs) wherever it is served."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["openai.chat"] = "openai.chat"
    model: str  # as the client named it ("kb:docs" or the engine's model)
    kb: str | None  # the KB name behind a kb: model
    chunk_url_base: str  # citation URLs: <base>/v1/kbs/<kb>/chunks/<chunk_id>
    include_usage: bool = False
    # how the sources go out before the answer: ``search_results`` (every client), or one
    # Open WebUI ``source`` event chunk per source, which its page shows as numbered chips
    sources: SourceShape = "search_results"


# -- responses -----------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class UrlCitation(BaseModel):
    url: str
    title: str
    start_index: int
    end_index: int


class Annotation(BaseModel):
    type: Literal["url_citation"] = "url_citation"
    url_citation: UrlCitation


class SearchResult(CitationBody):
    """A source, as Perplexity-style clients read it (``title``, ``url``, ``snippet``), with
    rag-stream's own fields (``n``, ``chunk_id``, ``document_id``, ``heading``, ...)."""

    url: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    annotations: list[Annotation] = []


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str
    stop_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    search_results: list[SearchResult] = []
    citations: list[str] = []
    stream_id: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "rag-stream"
    root: str
    kb: Annotated[str | None, Field(description="the knowledge base a kb: model answers from")]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"
