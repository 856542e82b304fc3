"""Where the client connects, with which key, how it retries a dropped stream, and the options
of the requests that take many."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import httpx

from rag_stream.schemas.generate import CoalesceOption, MaxTokens, Priority, Seed
from rag_stream.schemas.kbs import SearchMode

URL_ENV = "RAG_STREAM_URL"
API_KEY_ENV = "RAG_STREAM_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
# The read timeout is also how long a stream may stay silent before the client takes the
# connection for dead and resumes: the server sends a keep-alive every 15 s by default.
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


def base_url(url: str | None) -> str:
    return (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


@dataclass(frozen=True)
class RetryPolicy:
    """Resuming a dropped stream: up to ``max_retries`` attempts in a row without a new event,
    waiting ``backoff_s`` before the first and ``factor`` times longer before each next one (at
    most ``max_backoff_s``). An event received starts the count again."""

    max_retries: int = 6
    backoff_s: float = 0.25
    factor: float = 2.0
    max_backoff_s: float = 8.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt`` (1-based)."""
        return float(min(self.max_backoff_s, self.backoff_s * self.factor ** (attempt - 1)))


@dataclass(frozen=True)
class Reconnect:
    """What an ``on_reconnect`` callback is told before the client waits and reconnects."""

    stream_id: str | None  # None: the request that starts the stream did not get through
    last_event_id: int  # -1: no event yet
    attempt: int  # 1-based
    max_retries: int
    delay_s: float
    reason: str


OnReconnect = Callable[[Reconnect], None]


# Keyword options: the optional fields of the server's request models. mypy holds each name and
# type to the model's where calls.py builds the request (``model_construct(**options)``), and
# tests/unit/test_client_requests.py checks that none is missing. Their rules are the models',
# applied by the server: a bad value is a 422.


class AnswerOptions(TypedDict, total=False):
    """The options of ``AnswerRequest`` (POST /v1/answers)."""

    conversation_id: str
    top_k: int
    max_tokens: MaxTokens
    temperature: float
    top_p: float
    seed: Seed
    mmr: bool
    mode: SearchMode
    coalesce: CoalesceOption
    priority: Priority


class GenerateOptions(TypedDict, total=False):
    """The options of ``GenerateRequest`` (POST /v1/generate)."""

    max_tokens: MaxTokens
    temperature: float
    top_p: float
    seed: Seed
    chat: bool
    coalesce: CoalesceOption
    priority: Priority


class JobOptions(TypedDict, total=False):
    """The options of ``JobRequest`` (POST /v1/jobs): ``outline`` (the section headings) or
    ``sections`` (how many for the model to plan)."""

    outline: list[str]
    sections: int
    instructions: str
    section_tokens: int
    top_k: int
    mode: SearchMode
    temperature: float
    seed: Seed
