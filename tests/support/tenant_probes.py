"""The cross-tenant table: for every route that takes an API key, one probe in which other
tenants reach for what alpha owns. A route added to the app needs an entry here
(tests/integration/test_security.py checks ``CROSS_TENANT`` against the app's routes; the probes
run there, and test_tenants.py presents bad keys on every route listed here).

The world the probes run in (``build_world``): alpha has a KB with a document, an answer (so a
conversation), a chat stream, a generate stream and a finished job; beta has a KB of the same
name with a document of its own; gamma owns nothing at all. Each probe has beta and gamma reach
by alpha's ids, by alpha's names, and by alpha's ids inside beta's own containers (beta's KB with
alpha's document, chunk or conversation), and expects the 404 an unknown id gets (never a 403
that would confirm it exists), nothing of alpha's in any answer, and alpha's things as they were.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.waiting import eventually_sync

ALPHA_WORD = "Zorblatquux"  # only in alpha's documents: never in another tenant's answers
JOB = {"title": "T", "outline": ["A"], "section_tokens": 4, "top_k": 1}


def ok(r: httpx.Response, status: int = 200) -> Any:
    """The JSON body of a response that must have ``status``."""
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()


def wait_job(client: httpx.Client, job_id: str) -> Any:
    """The job once it has ended (polled, a minute at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = ok(client.get(f"/v1/jobs/{job_id}"))
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end")


# --- what alpha owns, and beta's look-alikes ---------------------------------------------------


@dataclass
class World:
    alpha: httpx.Client
    beta: httpx.Client
    gamma: httpx.Client  # owns nothing at all
    kb: str  # alpha's KB name; beta has a KB of the same name
    kb_id: str
    beta_kb_id: str
    doc_id: str
    chunk_id: str
    beta_doc_ids: set[str]
    conversation_id: str
    answer_stream: str
    chat_stream: str
    generate_stream: str
    job_id: str
    job_stream: str
    alpha_ids: set[str] = field(default_factory=set)  # every id above of alpha's

    @property
    def alpha_streams(self) -> list[str]:
        return [self.answer_stream, self.chat_stream, self.generate_stream, self.job_stream]


def build_world(alpha: httpx.Client, beta: httpx.Client, gamma: httpx.Client) -> World:
    """Make what the probes reach for, through the API, with each tenant's client."""
    kb = f"shared-{uuid.uuid4().hex[:6]}"
    kb_id = str(ok(alpha.post("/v1/kbs", json={"name": kb}), 201)["id"])
    beta_kb_id = str(ok(beta.post("/v1/kbs", json={"name": kb}), 201)["id"])
    doc = ok(
        alpha.post(
            f"/v1/kbs/{kb}/documents",
            json={
                "title": "Herons",
                "text": f"Herons nest in the {ALPHA_WORD} delta every spring.",
                "metadata": {"team": "alpha"},
            },
        ),
        201,
    )
    doc_id = str(doc["id"])
    detail = ok(alpha.get(f"/v1/kbs/{kb}/documents/{doc_id}", params={"include_chunks": True}))
    chunk_id = str(detail["chunks"][0]["id"])
    beta_doc = ok(
        beta.post(
            f"/v1/kbs/{kb}/documents",
            json={"title": "Pelicans", "text": "Pelicans nest on the delta's islands."},
        ),
        201,
    )
    question = {"kb": kb, "question": f"Where do herons nest? {ALPHA_WORD}", "max_tokens": 8}
    answer = ok(alpha.post("/v1/answers", json={**question, "stream": False}))
    chat = {
        "model": f"kb:{kb}",
        "messages": [{"role": "user", "content": f"Herons? {ALPHA_WORD}"}],
        "max_tokens": 8,
        "stream": True,
    }
    with alpha.stream("POST", "/v1/chat/completions", json=chat) as r:
        assert r.status_code == 200, r.read()
        chat_stream = r.headers["X-Stream-Id"]
        r.read()
    generated = ok(
        alpha.post("/v1/generate", json={"prompt": "Hi", "max_tokens": 4, "stream": False})
    )
    job_body = {**JOB, "kb": kb, "title": "Herons", "outline": ["Nests"]}
    job = ok(alpha.post("/v1/jobs", json=job_body), 202)
    assert wait_job(alpha, str(job["id"]))["status"] == "completed"
    w = World(
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        kb=kb,
        kb_id=kb_id,
        beta_kb_id=beta_kb_id,
        doc_id=doc_id,
        chunk_id=chunk_id,
        beta_doc_ids={str(beta_doc["id"])},
        conversation_id=str(answer["conversation_id"]),
        answer_stream=str(answer["stream_id"]),
        chat_stream=chat_stream,
        generate_stream=str(generated["stream_id"]),
        job_id=str(job["id"]),
        job_stream=str(job["stream_id"]),
    )
    w.alpha_ids = {kb_id, doc_id, chunk_id, w.conversation_id, w.job_id, *w.alpha_streams}
    return w


def _not_found(w: World, r: httpx.Response) -> None:
    """The answer an unknown id gets, and nothing of alpha's in it."""
    assert r.status_code == 404, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.json()["error"]["code"] in ("not_found", "model_not_found")
    assert ALPHA_WORD not in r.text


def _nothing_of_alphas(w: World, r: httpx.Response) -> None:
    assert r.status_code < 300, r.text
    leaked = {i for i in w.alpha_ids if i in r.text}
    assert not leaked and ALPHA_WORD not in r.text, (leaked, r.text[:500])


def _alpha_intact(w: World) -> None:
    kb = ok(w.alpha.get(f"/v1/kbs/{w.kb_id}"))
    assert kb["document_count"] == 1, kb
    ok(w.alpha.get(f"/v1/kbs/{w.kb_id}/documents/{w.doc_id}"))
    ok(w.alpha.get(f"/v1/kbs/{w.kb_id}/chunks/{w.chunk_id}"))


def _start_long(client: httpx.Client) -> str:
    """A generation still running while the probe acts on it (4,000 tokens, 20 s on the paced
    stub engine)."""
    body = {"prompt": "Count.", "max_tokens": 4000, "coalesce": {"tokens": 32, "ms": 500}}
    with client.stream("POST", "/v1/generate", json=body) as r:
        assert r.status_code == 200, r.read()
        sid = r.headers["X-Stream-Id"]
    assert ok(client.get(f"/v1/streams/{sid}"))["status"] == "running"
    return sid


def _young_alpha_job(w: World) -> str:
    """A job alpha has just started (it may still be queued or running), beside the finished
    one: another tenant's reach must fail whatever state a job is in."""
    deadline = time.monotonic() + 60
    while True:  # the previous probes' jobs may hold the batch places for a moment
        r = w.alpha.post("/v1/jobs", json={**JOB, "kb": w.kb})
        if r.status_code != 429 or time.monotonic() > deadline:
            return str(ok(r, 202)["id"])
        time.sleep(0.2)


# --- one probe per route ----------------------------------------------------------------------


def kbs_list(w: World) -> None:
    for client in (w.beta, w.gamma):
        _nothing_of_alphas(w, client.get("/v1/kbs"))
    mine = ok(w.beta.get("/v1/kbs"))["data"]
    assert [k["id"] for k in mine if k["name"] == w.kb] == [w.beta_kb_id]
    assert w.kb not in [k["name"] for k in ok(w.gamma.get("/v1/kbs"))["data"]]
    assert w.kb_id in [k["id"] for k in ok(w.alpha.get("/v1/kbs"))["data"]]


def kbs_create(w: World) -> None:
    # a name alpha uses is free for gamma: no 409 that would tell it alpha has one
    r = w.gamma.post("/v1/kbs", json={"name": w.kb})
    _nothing_of_alphas(w, r)
    assert r.status_code == 201 and r.json()["document_count"] == 0
    assert w.gamma.delete(f"/v1/kbs/{r.json()['id']}").status_code == 204
    # names are unique per tenant: alpha's own second KB of that name is refused
    assert w.alpha.post("/v1/kbs", json={"name": w.kb}).status_code == 409
    _alpha_intact(w)


def kbs_get(w: World) -> None:
    _not_found(w, w.beta.get(f"/v1/kbs/{w.kb_id}"))
    _not_found(w, w.gamma.get(f"/v1/kbs/{w.kb}"))
    assert ok(w.beta.get(f"/v1/kbs/{w.kb}"))["id"] == w.beta_kb_id  # its own, by the name


def kbs_delete(w: World) -> None:
    _not_found(w, w.beta.delete(f"/v1/kbs/{w.kb_id}"))
    _not_found(w, w.gamma.delete(f"/v1/kbs/{w.kb}"))
    _alpha_intact(w)


def chunk_get(w: World) -> None:
    for kb in (w.kb_id, w.beta_kb_id, w.kb):  # alpha's KB; beta's own, by id and by name
        _not_found(w, w.beta.get(f"/v1/kbs/{kb}/chunks/{w.chunk_id}"))
    _not_found(w, w.gamma.get(f"/v1/kbs/{w.kb}/chunks/{w.chunk_id}"))
    _alpha_intact(w)  # alpha still reads it


def documents_upload(w: World) -> None:
    doc = {"title": "Planted", "text": f"planted {uuid.uuid4().hex}"}
    _not_found(w, w.beta.post(f"/v1/kbs/{w.kb_id}/documents", json=doc))
    _not_found(w, w.gamma.post(f"/v1/kbs/{w.kb}/documents", json=doc))
    upload = {"file": ("planted.txt", doc["text"].encode(), "text/plain")}
    _not_found(w, w.beta.post(f"/v1/kbs/{w.kb_id}/documents", files=upload))
    # beta's upload under the shared name lands in beta's own KB
    r = w.beta.post(f"/v1/kbs/{w.kb}/documents", json=doc)
    assert ok(r, 201)["kb_id"] == w.beta_kb_id
    w.beta_doc_ids.add(str(r.json()["id"]))
    _alpha_intact(w)


def documents_list(w: World) -> None:
    _not_found(w, w.beta.get(f"/v1/kbs/{w.kb_id}/documents"))
    _not_found(w, w.gamma.get(f"/v1/kbs/{w.kb}/documents"))
    _nothing_of_alphas(w, w.beta.get(f"/v1/kbs/{w.kb}/documents"))


def document_get(w: World) -> None:
    for kb in (w.kb_id, w.beta_kb_id, w.kb):
        _not_found(w, w.beta.get(f"/v1/kbs/{kb}/documents/{w.doc_id}?include_chunks=true"))


def document_delete(w: World) -> None:
    for kb in (w.kb_id, w.beta_kb_id, w.kb):
        _not_found(w, w.beta.delete(f"/v1/kbs/{kb}/documents/{w.doc_id}"))
    _alpha_intact(w)


def search(w: World) -> None:
    query = {"query": f"herons nest {ALPHA_WORD}", "top_k": 20}
    _not_found(w, w.beta.post(f"/v1/kbs/{w.kb_id}/search", json=query))
    _not_found(w, w.gamma.post(f"/v1/kbs/{w.kb}/search", json=query))
    for mode in ("hybrid", "dense", "sparse"):  # beta's own KB: only beta's documents
        r = w.beta.post(f"/v1/kbs/{w.kb}/search", json={**query, "mode": mode})
        _nothing_of_alphas(w, r)
        assert {h["document_id"] for h in r.json()["results"]} <= w.beta_doc_ids


def answers(w: World) -> None:
    body = {"question": f"Where do herons nest? {ALPHA_WORD}", "stream": False, "max_tokens": 4}
    _not_found(w, w.beta.post("/v1/answers", json={**body, "kb": w.kb_id}))
    _not_found(w, w.gamma.post("/v1/answers", json={**body, "kb": w.kb}))
    # alpha's conversation continued on beta's own KB
    follow_up = {**body, "kb": w.beta_kb_id, "conversation_id": w.conversation_id}
    _not_found(w, w.beta.post("/v1/answers", json=follow_up))
    r = w.beta.post("/v1/answers", json={**body, "kb": w.kb, "question": "Where do herons nest?"})
    _nothing_of_alphas(w, r)
    assert {c["document_id"] for c in r.json()["citations"]} <= w.beta_doc_ids


def generate(w: World) -> None:
    # the stream a request starts is its caller's alone
    r = ok(w.beta.post("/v1/generate", json={"prompt": "Hi", "max_tokens": 2, "stream": False}))
    _not_found(w, w.alpha.get(f"/v1/streams/{r['stream_id']}"))
    ok(w.beta.get(f"/v1/streams/{r['stream_id']}"))
    _not_found(w, w.beta.get(f"/v1/streams/{w.generate_stream}"))


def stream_events(w: World) -> None:
    for sid in w.alpha_streams:
        _not_found(w, w.beta.get(f"/v1/streams/{sid}/events"))
        for cursor in ("0", "1"):
            resume = {"Last-Event-ID": cursor}
            _not_found(w, w.beta.get(f"/v1/streams/{sid}/events", headers=resume))
        _not_found(w, w.gamma.get(f"/v1/streams/{sid}/events", params={"last_event_id": 0}))


def stream_status(w: World) -> None:
    for sid in w.alpha_streams:
        _not_found(w, w.beta.get(f"/v1/streams/{sid}"))


def stream_cancel(w: World) -> None:
    running = _start_long(w.alpha)
    for sid in [running, *w.alpha_streams]:
        _not_found(w, w.beta.post(f"/v1/streams/{sid}/cancel"))
    status = ok(w.alpha.get(f"/v1/streams/{running}"))
    assert status["status"] == "running" and status["cancel_requested"] is False, status
    assert ok(w.alpha.post(f"/v1/streams/{running}/cancel"))["cancelled"] is True


def conversation(w: World) -> None:
    _not_found(w, w.beta.get(f"/v1/conversations/{w.conversation_id}"))
    ok(w.alpha.get(f"/v1/conversations/{w.conversation_id}"))


def conversations_list(w: World) -> None:
    _nothing_of_alphas(w, w.beta.get("/v1/conversations"))
    assert w.conversation_id in [c["id"] for c in ok(w.alpha.get("/v1/conversations"))["data"]]
    # alpha's conversation is no cursor for beta: the answer an unknown id gets
    theirs = w.beta.get("/v1/conversations", params={"before": w.conversation_id})
    unknown = w.beta.get("/v1/conversations", params={"before": uuid.uuid4().hex})
    assert theirs.status_code == unknown.status_code == 422, theirs.text
    assert ALPHA_WORD not in theirs.text


def chat_completions(w: World) -> None:
    body = {"messages": [{"role": "user", "content": f"Herons? {ALPHA_WORD}"}], "max_tokens": 4}
    r = w.gamma.post("/v1/chat/completions", json={**body, "model": f"kb:{w.kb}"})
    _not_found(w, r)
    assert r.json()["error"]["param"] == "model"
    _not_found(w, w.beta.post("/v1/chat/completions", json={**body, "model": f"kb:{w.kb_id}"}))
    # kb:<the shared name> is beta's own KB for beta: its sources are beta's
    plain = {"messages": [{"role": "user", "content": "Herons?"}], "max_tokens": 4}
    r = w.beta.post("/v1/chat/completions", json={**plain, "model": f"kb:{w.kb}"})
    _nothing_of_alphas(w, r)
    assert {s["document_id"] for s in r.json()["search_results"]} <= w.beta_doc_ids


def _ui_chat(chat_id: str, model: str, max_tokens: int) -> dict[str, Any]:
    text = f"Herons? {ALPHA_WORD}"
    return {
        "id": chat_id,
        "messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": text}]}],
        "model": model,
        "max_tokens": max_tokens,
    }


def ui_chat(w: World) -> None:
    for client, model in ((w.gamma, f"kb:{w.kb}"), (w.beta, f"kb:{w.kb_id}")):
        _not_found(w, client.post("/v1/ui/chat", json=_ui_chat("c", model, 4)))
    # kb:<the shared name> is beta's own KB for beta: its sources are beta's
    r = w.beta.post("/v1/ui/chat", json=_ui_chat("c", f"kb:{w.kb}", 4))
    _nothing_of_alphas(w, r)
    assert '"source-url"' in r.text and r.text.count('"documentId"') == len(w.beta_doc_ids)


def ui_chat_resume(w: World) -> None:
    """A chat's id is the client's own name: another tenant's chat of the same id is not it."""
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    model = ok(w.alpha.get("/v1/models"))["data"][0]["id"]  # the engine's: a long stream
    with w.alpha.stream("POST", "/v1/ui/chat", json=_ui_chat(chat_id, model, 4000)) as r:
        assert r.status_code == 200, r.read()
        running = r.headers["X-Stream-Id"]
    assert ok(w.alpha.get(f"/v1/streams/{running}"))["status"] == "running"
    for client in (w.beta, w.gamma):  # what a chat with nothing running gets
        r = client.get(f"/v1/ui/chat/{chat_id}/stream")
        assert r.status_code == 204 and r.content == b"", r.text
    # beta's own chat of that id is beta's; alpha's stays alpha's
    r = w.beta.post("/v1/ui/chat", json=_ui_chat(chat_id, model, 4))
    assert r.status_code == 200 and r.headers["X-Stream-Id"] != running
    with w.alpha.stream("GET", f"/v1/ui/chat/{chat_id}/stream") as r:
        assert r.status_code == 200 and r.headers["X-Stream-Id"] == running
    assert ok(w.alpha.post(f"/v1/streams/{running}/cancel"))["cancelled"] is True


def models_list(w: World) -> None:
    ids = [m["id"] for m in ok(w.gamma.get("/v1/models"))["data"]]
    assert ids and f"kb:{w.kb}" not in ids
    _nothing_of_alphas(w, w.beta.get("/v1/models"))
    assert f"kb:{w.kb}" in [m["id"] for m in ok(w.alpha.get("/v1/models"))["data"]]


def model_get(w: World) -> None:
    _not_found(w, w.gamma.get(f"/v1/models/kb:{w.kb}"))
    _not_found(w, w.beta.get(f"/v1/models/kb:{w.kb_id}"))


def usage(w: World) -> None:
    theirs, none = ok(w.alpha.get("/v1/usage")), ok(w.gamma.get("/v1/usage"))
    assert theirs["tenant"] == "alpha" and none["tenant"] == "gamma"
    assert theirs["total"]["requests"] >= 4
    assert theirs["by_kind"]["answer"]["requests"] >= 1
    assert none["by_kind"] == {} and set(none["total"].values()) == {0}, none
    mine = ok(w.beta.get("/v1/usage"))
    assert mine["tenant"] == "beta" and "job" not in mine["by_kind"]  # only alpha ran a job

    def answers_of(client: httpx.Client) -> int:
        return int(ok(client.get("/v1/usage"))["by_kind"].get("answer", {}).get("requests", 0))

    # one more answer of alpha's: counted for alpha, and not for beta
    alpha_before, beta_before = answers_of(w.alpha), answers_of(w.beta)
    question = {"kb": w.kb, "question": "Where do herons nest?", "stream": False, "max_tokens": 4}
    ok(w.alpha.post("/v1/answers", json=question))
    eventually_sync(lambda: answers_of(w.alpha) == alpha_before + 1, "alpha's answer counted")
    assert answers_of(w.beta) == beta_before


def jobs_create(w: World) -> None:
    _not_found(w, w.beta.post("/v1/jobs", json={**JOB, "kb": w.kb_id}))
    _not_found(w, w.gamma.post("/v1/jobs", json={**JOB, "kb": w.kb}))


def jobs_list(w: World) -> None:
    young = _young_alpha_job(w)
    _nothing_of_alphas(w, w.beta.get("/v1/jobs"))
    assert young not in [j["id"] for j in ok(w.beta.get("/v1/jobs"))["data"]]
    assert {young, w.job_id} <= {j["id"] for j in ok(w.alpha.get("/v1/jobs"))["data"]}
    # another tenant's job is no cursor either (the same answer as an unknown id)
    assert w.beta.get("/v1/jobs", params={"before": w.job_id}).status_code == 422


def jobs_get(w: World) -> None:
    for job in (w.job_id, _young_alpha_job(w)):
        _not_found(w, w.beta.get(f"/v1/jobs/{job}"))
        ok(w.alpha.get(f"/v1/jobs/{job}"))


def jobs_events(w: World) -> None:
    for job in (w.job_id, _young_alpha_job(w)):
        _not_found(w, w.beta.get(f"/v1/jobs/{job}/events"))
        _not_found(w, w.beta.get(f"/v1/jobs/{job}/events", headers={"Last-Event-ID": "1"}))


def jobs_result(w: World) -> None:
    for job in (w.job_id, _young_alpha_job(w)):
        _not_found(w, w.beta.get(f"/v1/jobs/{job}/result"))
        _not_found(w, w.beta.get(f"/v1/jobs/{job}/result", params={"format": "json"}))


def jobs_cancel(w: World) -> None:
    young = _young_alpha_job(w)
    for job in (w.job_id, young):
        _not_found(w, w.beta.post(f"/v1/jobs/{job}/cancel"))
    assert ok(w.alpha.get(f"/v1/jobs/{w.job_id}"))["status"] == "completed"
    assert wait_job(w.alpha, young)["status"] == "completed"  # not cancelled by beta


def jobs_delete(w: World) -> None:
    young = _young_alpha_job(w)
    for job in (w.job_id, young):
        _not_found(w, w.beta.delete(f"/v1/jobs/{job}"))
        ok(w.alpha.get(f"/v1/jobs/{job}"))
    assert w.alpha.get(f"/v1/jobs/{w.job_id}/result").status_code == 200


CROSS_TENANT: dict[tuple[str, str], Callable[[World], None]] = {
    ("GET", "/v1/kbs"): kbs_list,
    ("POST", "/v1/kbs"): kbs_create,
    ("GET", "/v1/kbs/{kb}"): kbs_get,
    ("DELETE", "/v1/kbs/{kb}"): kbs_delete,
    ("GET", "/v1/kbs/{kb}/chunks/{chunk_id}"): chunk_get,
    ("POST", "/v1/kbs/{kb}/documents"): documents_upload,
    ("GET", "/v1/kbs/{kb}/documents"): documents_list,
    ("GET", "/v1/kbs/{kb}/documents/{doc}"): document_get,
    ("DELETE", "/v1/kbs/{kb}/documents/{doc}"): document_delete,
    ("POST", "/v1/kbs/{kb}/search"): search,
    ("POST", "/v1/answers"): answers,
    ("POST", "/v1/generate"): generate,
    ("GET", "/v1/streams/{stream_id}/events"): stream_events,
    ("GET", "/v1/streams/{stream_id}"): stream_status,
    ("POST", "/v1/streams/{stream_id}/cancel"): stream_cancel,
    ("GET", "/v1/conversations/{conversation_id}"): conversation,
    ("GET", "/v1/conversations"): conversations_list,
    ("POST", "/v1/chat/completions"): chat_completions,
    ("GET", "/v1/models"): models_list,
    ("POST", "/v1/ui/chat"): ui_chat,
    ("GET", "/v1/ui/chat/{chat_id}/stream"): ui_chat_resume,
    ("GET", "/v1/models/{model_id}"): model_get,
    ("GET", "/v1/usage"): usage,
    ("POST", "/v1/jobs"): jobs_create,
    ("GET", "/v1/jobs"): jobs_list,
    ("GET", "/v1/jobs/{job_id}"): jobs_get,
    ("GET", "/v1/jobs/{job_id}/events"): jobs_events,
    ("GET", "/v1/jobs/{job_id}/result"): jobs_result,
    ("POST", "/v1/jobs/{job_id}/cancel"): jobs_cancel,
    ("DELETE", "/v1/jobs/{job_id}"): jobs_delete,
}
# Routes that serve no tenant's data and take no key: probes, metrics (its own setting), the
# API description and the chat page's files.
PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("GET", "/"),
    ("GET", "/static/{path}"),
}
