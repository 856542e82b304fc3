"""The Vercel AI SDK (the `ai` package from npm, pinned in tests/node/package.json) under Node
against /v1/ui/chat on a real server: SmolLM2 (float32, greedy) on vLLM, the real Redis and
PostgreSQL, a knowledge base of a few documents.

tests/node/ui_chat.mjs drives the package's own DefaultChatTransport (sendMessages,
reconnectToStream), readUIMessageStream and Chat machinery (AbstractChat, which `useChat`
wraps), and prints one JSON line per scenario; the tests compare what the package made of the
stream with what the native routes answer for the same question. The server is
tests/e2e/test_chat_page.py's (it requires keys, so every request carries one), started a
module ahead: no engine start of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.server import ROOT, ServerProcess
from tests.support.session_servers import KeyedServer

pytestmark = [pytest.mark.engine, pytest.mark.smollm2]

NODE_DIR = ROOT / "tests" / "node"
PROGRAM = NODE_DIR / "ui_chat.mjs"
SET_UP = "run `npm ci` in tests/node (`make install` does it)"

DOCS = [
    (
        "Lighthouses",
        "# Lighthouses\n\nThe Skerry lighthouse was built in 1872 on a granite reef. Its lamp "
        "burned whale oil until 1905.\n\n## Keepers\n\nThree keepers lived at Skerry in "
        "rotation, four weeks on the rock and two weeks ashore.",
    ),
    (
        "Rivers",
        "# Rivers\n\nThe Zorblat river flows through the town of Quimby before reaching the sea."
        "\n\nIts delta is home to many herons, which nest there every spring.",
    ),
]
QUESTION = "Who lived at the Skerry lighthouse, and how long did they stay?"
# Long enough to be still running after the resume scenario's first deltas and a status call
# (SmolLM2 makes ~20-30 tokens a second here), short enough to keep the module fast.
MAX_TOKENS = 48
# The stop scenario's limit: it must end cancelled far below it.
STOP_MAX_TOKENS = 400


@dataclass
class Site:
    server: ServerProcess
    kb: str
    key: str
    node: str

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.key}"}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=300)

    def run(self, scenario: str, model: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
        """One scenario of ui_chat.mjs: its JSON result line."""
        args = [self.node, str(PROGRAM), scenario, "--base", self.server.url]
        args += ["--model", model, "--question", QUESTION, "--max-tokens", str(max_tokens)]
        env = {**os.environ, "RAG_STREAM_KEY": self.key}  # not on the command line
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=180)
        lines = out.stdout.strip().splitlines()
        assert out.returncode == 0 and lines, f"{out.stdout[-6000:]}\n{out.stderr[-3000:]}"
        result: dict[str, Any] = json.loads(lines[-1])
        return result


def node_for_the_ai_package() -> str:
    """Node 20 or later and the pinned `ai` package installed, or the test fails saying what
    to set up (never skipped: CI must run these)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"`node` (20 or later) is not on PATH: install Node.js, then {SET_UP}")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        pytest.fail(f"Node {version} is too old for tests/node (20 or later)")
    pinned = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]["ai"]
    installed = NODE_DIR / "node_modules" / "ai" / "package.json"
    if not installed.exists():
        pytest.fail(f"the `ai` package is not installed in tests/node/node_modules: {SET_UP}")
    if (found := json.loads(installed.read_text())["version"]) != pinned:
        pytest.fail(f"tests/node has ai {found}, package.json pins {pinned}: {SET_UP}")
    return node


@pytest.fixture(scope="module")
def site(chat_page_server_start: KeyedServer) -> Site:
    node = node_for_the_ai_package()  # before waiting for the engine: fail fast
    server = chat_page_server_start.server
    server.wait_ready()
    key = chat_page_server_start.make_key()
    site = Site(server, f"ai-sdk-{uuid.uuid4().hex[:8]}", key, node)
    with site.http() as http:
        http.post("/v1/kbs", json={"name": site.kb}).raise_for_status()
        for title, text in DOCS:
            r = http.post(f"/v1/kbs/{site.kb}/documents", json={"title": title, "text": text})
            r.raise_for_status()
    return site


@pytest.fixture(scope="module")
def reference(site: Site) -> dict[str, Any]:
    """The question asked on /v1/answers, greedy, nothing cut: what every kb: run must give."""
    body = {"kb": site.kb, "question": QUESTION, "max_tokens": MAX_TOKENS, "temperature": 0}
    with site.http() as http:
        r = http.post("/v1/answers", json={**body, "stream": False})
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


def stream_status(site: Site, stream_id: str) -> dict[str, Any]:
    with site.http() as http:
        r = http.get(f"/v1/streams/{stream_id}")
    r.raise_for_status()
    status: dict[str, Any] = r.json()
    return status


def assert_a_ui_stream_response(response: dict[str, Any]) -> None:
    """A UI message stream (v1) by its headers, read to its closing [DONE]."""
    assert response["status"] == 200, response
    assert response["contentType"].startswith("text/event-stream"), response
    assert response["uiMessageStream"] == "v1", response
    assert response["streamId"], response
    assert response["lastData"] == "[DONE]", response


def assert_a_whole_ui_stream(response: dict[str, Any], run: dict[str, Any]) -> None:
    """The response was a UI message stream the package read without a complaint, from its
    start chunk to its finish and the closing [DONE]."""
    assert_a_ui_stream_response(response)
    assert run["errors"] == [], run["errors"]
    assert run["types"][0] == "start" and run["types"][-1] == "finish", run["types"]
    assert run["streamId"], run["chunks"][0]


def assert_sources_first(run: dict[str, Any], citations: list[dict[str, Any]]) -> None:
    """One source-url per native citation, in its order and numbered as its [n], all before
    the first text delta; the final message keeps them ahead of its text."""
    assert citations, "the native answer cited nothing: the KB or the question is wrong"
    assert -1 < run["lastSourceIndex"] < run["firstTextDeltaIndex"], run["types"]
    urls = [c for c in run["chunks"] if c["type"] == "source-url"]
    assert [u["sourceId"] for u in urls] == [str(c["n"]) for c in citations], urls
    assert [u["title"] for u in urls] == [c["title"] for c in citations], urls
    for url, citation in zip(urls, citations, strict=True):
        assert url["url"].endswith(f"/chunks/{citation['chunk_id']}"), (url, citation)
    # source-document parts, where sent, describe those same sources
    documents = [c for c in run["chunks"] if c["type"] == "source-document"]
    titles = {u["sourceId"]: u["title"] for u in urls}
    assert all(titles.get(d["sourceId"]) == d["title"] for d in documents), documents
    parts = [p["type"] for p in run["message"]["parts"]]
    assert parts[-1] == "text" and all(p.startswith("source-") for p in parts[:-1]), parts
    assert parts.count("source-url") == len(citations), parts


def test_sources_arrive_before_the_text_and_the_text_is_the_native_answer(
    site: Site, reference: dict[str, Any]
) -> None:
    run = site.run("sources-first", f"kb:{site.kb}")

    assert_a_whole_ui_stream(run["responses"][0], run)
    assert run["responses"][0]["streamId"] == run["streamId"]
    assert_sources_first(run, reference["citations"])
    assert run["text"] == reference["answer"]
    assert run["message"]["parts"][-1]["state"] == "done"
    assert run["finishReason"] == reference["finish_reason"]
    metadata = run["message"]["metadata"]  # the start part's, merged with the finish part's
    assert metadata["streamId"] == run["streamId"], metadata
    assert metadata["usage"]["completionTokens"] == reference["usage"]["completion_tokens"]
    status = stream_status(site, run["streamId"])
    assert (status["status"], status["finish_reason"]) == ("done", reference["finish_reason"])


def test_an_answer_cut_mid_stream_resumes_with_reconnect_to_stream(
    site: Site, reference: dict[str, Any]
) -> None:
    """The request is aborted after the first deltas (the stream still running, no finish
    seen); then reconnectToStream({chatId}) and a Chat made afresh (a reloaded page's
    resumeStream()) each replay it whole: the text an uncut answer has."""
    run = site.run("resume", f"kb:{site.kb}")

    cut, first, resumed, chat = run["cut"], run["first"], run["resumed"], run["chat"]
    assert cut is not None, first["types"]
    assert not cut["sawFinish"] and cut["streamStatus"] == "running", cut
    assert cut["text"] and reference["answer"].startswith(cut["text"]), cut
    assert resumed is not None, "reconnectToStream found nothing running"
    reconnects = [r for r in run["responses"] if r["method"] == "GET"]
    assert [r["status"] for r in reconnects] == [200, 200, 204], reconnects
    for reconnect in reconnects:
        assert reconnect["url"].endswith(f"/v1/ui/chat/{run['chatId']}/stream"), reconnect
    assert_a_ui_stream_response(reconnects[1])  # (one of the two is the Chat's)
    assert_a_whole_ui_stream(reconnects[0], resumed)
    assert resumed["streamId"] == first["streamId"]
    assert_sources_first(resumed, reference["citations"])
    assert resumed["text"] == reference["answer"]
    assert resumed["message"]["id"] == first["message"]["id"]  # the same message, replayed

    assert (chat["status"], chat["error"]) == ("ready", None), chat
    assert chat["finished"] == {
        "isAbort": False,
        "isDisconnect": False,
        "isError": False,
        "finishReason": reference["finish_reason"],
    }
    question, answer = chat["messages"]  # the replay became the one assistant message
    assert question["role"] == "user" and answer["role"] == "assistant", chat["messages"]
    assert answer["id"] == first["message"]["id"]
    assert [p for p in answer["parts"] if p["type"] == "source-url"] == [
        p for p in resumed["message"]["parts"] if p["type"] == "source-url"
    ]
    assert chat["text"] == reference["answer"]
    # once the answer has ended there is nothing to reconnect to: 204, which the package
    # turns into null
    assert run["reconnectAfterEnd"] == "null"


def test_stop_through_the_cancel_route_ends_the_stream_cancelled(
    site: Site, reference: dict[str, Any]
) -> None:
    run = site.run("stop", f"kb:{site.kb}", max_tokens=STOP_MAX_TOKENS)

    cancel = run["cancel"]
    assert cancel is not None, run["types"]
    assert cancel["response"]["status"] == 200, cancel
    assert cancel["response"]["body"]["cancelled"] is True, cancel
    assert_a_whole_ui_stream(run["responses"][0], run)
    status = stream_status(site, run["streamId"])
    assert (status["status"], status["finish_reason"]) == ("done", "cancelled"), status
    # the package's own word for a stream stopped on the server: an abort part
    assert run["types"][-3:] == ["text-end", "abort", "finish"], run["types"]
    assert run["finishMetadata"]["finishReason"] == "cancelled", run["finishMetadata"]
    # ended at the cancel, well before its limit
    assert run["types"].count("text-delta") < STOP_MAX_TOKENS // 4, run["types"]
    assert run["finishMetadata"]["usage"]["completionTokens"] < STOP_MAX_TOKENS // 4
    # the answer so far is the greedy answer's beginning, and the message kept it
    shorter, longer = sorted((run["text"], reference["answer"]), key=len)
    assert run["text"] and longer.startswith(shorter), (run["text"], reference["answer"])
    assert run["message"]["parts"][-1] == {"type": "text", "text": run["text"], "state": "done"}


def test_the_plain_model_answers_as_chat_completions_do(site: Site) -> None:
    with site.http() as http:
        models = [m["id"] for m in http.get("/v1/models").json()["data"]]
        plain = next(m for m in models if not m.startswith("kb:"))
        body = {
            "model": plain,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
        }
        r = http.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    expected = r.json()["choices"][0]["message"]["content"]

    run = site.run("sources-first", plain)

    assert_a_whole_ui_stream(run["responses"][0], run)
    assert run["lastSourceIndex"] == -1, run["types"]  # no retrieval, no sources
    assert run["text"] == expected
    assert [p["type"] for p in run["message"]["parts"]] == ["text"]
