"""The client's typed errors, defaults (URL, key, retries) and the ask command's lines."""

from __future__ import annotations

import httpx
import pytest

from rag_stream.ask_cli import figures_line, source_line
from rag_stream.client import Client, RetryPolicy
from rag_stream.errors import InvalidRequest, NotFound, RagStreamError, TooManyRequests
from rag_stream.schemas.events import Citation, Done, Timings, Usage


def _answering(
    response: httpx.Response,
    seen: list[httpx.Request] | None = None,
    url: str | None = "http://rag.test",
) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return response

    return Client(url, transport=httpx.MockTransport(handler))


def _error(status: int, code: str, message: str, **extra: object) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message, **extra}})


def test_an_error_answer_becomes_the_servers_exception_with_its_status() -> None:
    with (
        _answering(_error(404, "not_found", "no knowledge base 'x'")) as client,
        pytest.raises(NotFound) as caught,
    ):
        client.get_kb("x")
    assert (caught.value.status_code, caught.value.code) == (404, "not_found")
    assert caught.value.message == "no knowledge base 'x'"


def test_a_422_keeps_the_field_at_fault() -> None:
    body = _error(422, "invalid_request", "top_k: too big", param="top_k")
    with _answering(body) as client, pytest.raises(InvalidRequest) as caught:
        client.search("kb", "q", top_k=1000)
    assert caught.value.param == "top_k" and caught.value.status_code == 422


def test_a_code_this_version_does_not_know_is_kept_on_the_root_error() -> None:
    with (
        _answering(_error(400, "untrusted_host", "host not served")) as client,
        pytest.raises(RagStreamError) as caught,
    ):
        client.list_kbs()
    assert type(caught.value) is RagStreamError
    assert (caught.value.status_code, caught.value.code) == (400, "untrusted_host")


def test_too_many_requests_says_when_to_come_back() -> None:
    body = _error(429, "too_many_requests", "busy")
    body.headers["Retry-After"] = "7"
    with _answering(body) as client, pytest.raises(TooManyRequests) as caught:
        client.generate_text("p")
    assert caught.value.retry_after_s == 7


def test_an_answer_that_is_not_rag_streams_is_still_an_error() -> None:
    page = httpx.Response(502, text="<html>Bad Gateway</html>")
    with _answering(page) as client, pytest.raises(RagStreamError) as caught:
        client.models()
    assert (caught.value.status_code, caught.value.code) == (502, "http_502")
    assert "Bad Gateway" in caught.value.message


def test_an_unready_server_is_a_result_not_an_error() -> None:
    body = {"status": "unavailable", "checks": {"engine": "loading"}, "failing": ["engine"]}
    with _answering(httpx.Response(503, json=body)) as client:
        ready = client.readyz()
    assert not ready.ready and ready.failing == ["engine"]


def test_url_and_key_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_STREAM_URL", "http://far.example:9000/")
    monkeypatch.setenv("RAG_STREAM_API_KEY", "rsk-secret")
    seen: list[httpx.Request] = []
    with _answering(httpx.Response(200, json={"status": "ok"}), seen, None) as client:
        assert client.url == "http://far.example:9000"
        assert client.healthz()
    assert str(seen[0].url) == "http://far.example:9000/healthz"
    assert seen[0].headers["authorization"] == "Bearer rsk-secret"


def test_without_environment_the_local_server_and_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAG_STREAM_URL", raising=False)
    monkeypatch.delenv("RAG_STREAM_API_KEY", raising=False)
    seen: list[httpx.Request] = []
    with _answering(httpx.Response(200, json={"status": "ok"}), seen, None) as client:
        client.healthz()
    assert str(seen[0].url) == "http://127.0.0.1:8000/healthz"
    assert "authorization" not in seen[0].headers


def test_backoff_grows_by_the_factor_up_to_its_ceiling() -> None:
    policy = RetryPolicy(backoff_s=0.5, factor=2, max_backoff_s=3)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_source_line_is_numbered_and_cannot_drive_the_terminal() -> None:
    citation = Citation(
        id=1,
        n=2,
        chunk_id="c",
        document_id="d",
        title="Rivers\x1b[2J",
        heading="Delta",
        snippet="Herons   live\nhere.\x07",
        offsets=(0, 10),
        score=0.5,
    )
    assert source_line(citation) == "[2] Rivers[2J › Delta\n    Herons live here."


def test_the_figures_line_reads_ttft_and_rate_from_done() -> None:
    done = Done(
        id=9,
        finish_reason="stop",
        usage=Usage(prompt_tokens=50, completion_tokens=41, cached_tokens=0),
        timings=Timings(ttft_ms=123.4, tpot_ms=40.0),
        cited=[1, 3],
    )
    line = figures_line(done)
    assert line.startswith("TTFT 123 ms · 25.0 tokens/s · 41 tokens")
    assert line.endswith("stop · cited [1], [3]")
