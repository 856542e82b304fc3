"""The requests the client sends are the server's own request models: every option a model has
is a keyword of the client, and each body, options and all, is one the model accepts as it was
given. Options left out (or None) are left to the server's defaults; an option the model does
not know is sent as given, for the server to reject by name."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from rag_stream.client import AsyncClient, Client
from rag_stream.client.options import AnswerOptions, GenerateOptions, JobOptions
from rag_stream.errors import InvalidRequest
from rag_stream.schemas.answers import AnswerRequest
from rag_stream.schemas.generate import Coalesce, GenerateRequest
from rag_stream.schemas.jobs import JobRequest
from rag_stream.schemas.kbs import DocumentCreate, KbCreate, SearchRequest

REJECTION = {"error": {"code": "invalid_request", "message": "no"}}

ANSWER_OPTIONS: AnswerOptions = {
    "conversation_id": "c" * 32,
    "top_k": 3,
    "max_tokens": 40,
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 7,
    "mmr": True,
    "mode": "dense",
    "coalesce": Coalesce(tokens=4, ms=20.0),
    "priority": "batch",
}
GENERATE_OPTIONS: GenerateOptions = {
    "max_tokens": 40,
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 7,
    "chat": True,
    "coalesce": "auto",
    "priority": "batch",
}
JOB_OPTIONS: JobOptions = {
    "outline": ["One", "Two"],
    "sections": 2,
    "instructions": "Be brief.",
    "section_tokens": 30,
    "top_k": 4,
    "mode": "sparse",
    "temperature": 0.2,
    "seed": 9,
}


class Recorder:
    """Answers every request with a 422 and keeps the JSON bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(422, json=REJECTION)

    def client(self) -> Client:
        return Client("http://rag.test", transport=httpx.MockTransport(self))


def _sent(call: Any) -> dict[str, Any]:
    """The body ``call(client)`` sent (the recorder rejects it: raised as the typed error)."""
    recorder = Recorder()
    with recorder.client() as client, pytest.raises(InvalidRequest):
        result = call(client)
        if not isinstance(result, BaseModel):
            list(result)  # a stream: sent when read
    [body] = recorder.bodies
    return body


def _accepted_as_sent(model: type[BaseModel], body: dict[str, Any]) -> None:
    request = model.model_validate(body)
    assert request.model_dump(mode="json", include=set(body)) == body


@pytest.mark.parametrize(
    ("options", "model", "positional"),
    [
        (AnswerOptions, AnswerRequest, {"kb", "question", "stream"}),
        (GenerateOptions, GenerateRequest, {"prompt", "stream"}),
        (JobOptions, JobRequest, {"kb", "title"}),
    ],
)
def test_every_option_of_the_servers_request_is_a_keyword_of_the_client(
    options: Any, model: type[BaseModel], positional: set[str]
) -> None:
    assert options.__optional_keys__ == model.model_fields.keys() - positional


def test_answers_and_generations_send_every_option_as_the_server_reads_it() -> None:
    coalesce = {"tokens": 4, "ms": 20.0}
    asked = _sent(lambda c: c.ask("docs", "Why?", **ANSWER_OPTIONS))
    assert asked == {"kb": "docs", "question": "Why?", **ANSWER_OPTIONS, "coalesce": coalesce}
    _accepted_as_sent(AnswerRequest, asked)
    answered = _sent(lambda c: c.answer("docs", "Why?", **ANSWER_OPTIONS))
    assert answered == {**asked, "stream": False}
    _accepted_as_sent(AnswerRequest, answered)

    generated = _sent(lambda c: c.generate("Once", **GENERATE_OPTIONS))
    assert generated == {"prompt": "Once", **GENERATE_OPTIONS}
    _accepted_as_sent(GenerateRequest, generated)
    assert _sent(lambda c: c.generate_text("Once")) == {"prompt": "Once", "stream": False}


def test_jobs_knowledge_bases_documents_and_searches_send_the_servers_fields() -> None:
    job = _sent(lambda c: c.create_job("docs", "Guide", **JOB_OPTIONS))
    assert job == {"kb": "docs", "title": "Guide", **JOB_OPTIONS}
    _accepted_as_sent(JobRequest, job)

    kb = _sent(lambda c: c.create_kb("docs", "the manual"))
    assert kb == {"name": "docs", "description": "the manual"}
    _accepted_as_sent(KbCreate, kb)

    document = _sent(
        lambda c: c.add_document(
            "docs",
            "T",
            "text",
            metadata={"lang": ["en", "fr"]},
            source="s.md",
            media_type="text/plain",
        )
    )
    assert document == {
        "title": "T",
        "text": "text",
        "metadata": {"lang": ["en", "fr"]},
        "source": "s.md",
        "media_type": "text/plain",
    }
    _accepted_as_sent(DocumentCreate, document)

    search = _sent(
        lambda c: c.search(
            "docs",
            "q",
            top_k=3,
            filter={"lang": "en"},
            score_threshold=0.2,
            mmr=True,
            mode="dense",
        )
    )
    assert search == {
        "query": "q",
        "top_k": 3,
        "filter": {"lang": "en"},
        "score_threshold": 0.2,
        "mmr": True,
        "mode": "dense",
    }
    _accepted_as_sent(SearchRequest, search)


def test_options_left_out_or_none_are_the_servers_to_choose() -> None:
    assert _sent(lambda c: c.ask("docs", "Why?")) == {"kb": "docs", "question": "Why?"}
    assert _sent(lambda c: c.ask("docs", "Why?", **{"top_k": None})) == {
        "kb": "docs",
        "question": "Why?",
    }
    assert _sent(lambda c: c.create_kb("docs")) == {"name": "docs"}
    assert _sent(lambda c: c.add_document("docs", "T", "text")) == {"title": "T", "text": "text"}
    assert _sent(lambda c: c.search("docs", "q")) == {"query": "q"}
    assert _sent(lambda c: c.create_job("docs", "Guide")) == {"kb": "docs", "title": "Guide"}


def test_an_option_the_server_does_not_know_is_sent_for_it_to_reject() -> None:
    unknown: dict[str, Any] = {"max_token": 5}  # a typo a type checker would have caught
    assert _sent(lambda c: c.ask("docs", "Why?", **unknown)) == {
        "kb": "docs",
        "question": "Why?",
        "max_token": 5,
    }
    assert _sent(lambda c: c.create_job("docs", "Guide", **unknown))["max_token"] == 5


async def test_the_async_client_sends_the_same_bodies() -> None:
    recorder = Recorder()
    transport = httpx.MockTransport(recorder)
    async with AsyncClient("http://rag.test", transport=transport) as client:
        with pytest.raises(InvalidRequest):
            [e async for e in client.ask("docs", "Why?", **ANSWER_OPTIONS)]
        with pytest.raises(InvalidRequest):
            await client.create_job("docs", "Guide", **JOB_OPTIONS)
    assert recorder.bodies == [
        _sent(lambda c: c.ask("docs", "Why?", **ANSWER_OPTIONS)),
        _sent(lambda c: c.create_job("docs", "Guide", **JOB_OPTIONS)),
    ]
