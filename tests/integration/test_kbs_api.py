"""The knowledge-base HTTP API on a real server process (SQLite, Qdrant local, real embedder)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from rag_stream.ingest.parsing import SUPPORTED_SUFFIXES
from tests.conftest import REDIS_URL, ServerFactory
from tests.support.pdfs import blank_pdf, make_pdf
from tests.support.server import ROOT, ServerProcess

UPLOAD_LIMIT = 64 * 1024
NOTES = (
    "# Field notes\n\nThe heron waits motionless in shallow water before it strikes.\n\n"
    "## Owls\n\nBarn owls hunt by sound alone; their facial disc funnels it to the ears.\n"
)


@pytest.fixture(scope="module")
def kb_server(server_factory: ServerFactory) -> Iterator[ServerProcess]:
    server = server_factory(  # the KB API needs no engine: the stub starts in seconds
        stub_delay_s=0,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_INGEST__SAMPLE_KB="true",
        RAG_STREAM_INGEST__MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT),
        RAG_STREAM_INGEST__CHUNK_TOKENS="64",
        RAG_STREAM_INGEST__CHUNK_OVERLAP="8",
    )
    yield server
    server.stop()


@pytest.fixture
def client(kb_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=kb_server.url, timeout=120) as c:
        yield c


@pytest.fixture
def kb(client: httpx.Client) -> str:
    r = client.post("/v1/kbs", json={"name": f"kb-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    return str(r.json()["name"])


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


def upload(
    client: httpx.Client, kb: str, name: str, data: bytes, ctype: str = "", **fields: str
) -> httpx.Response:
    return client.post(
        f"/v1/kbs/{kb}/documents", files={"file": (name, data, ctype or None)}, data=fields
    )


def test_kb_lifecycle(client: httpx.Client) -> None:
    name = f"lib-{uuid.uuid4().hex[:8]}"
    created = client.post("/v1/kbs", json={"name": name, "description": "birds"})
    assert created.status_code == 201
    kb = created.json()
    assert kb["name"] == name and kb["document_count"] == 0
    assert error_of(client.post("/v1/kbs", json={"name": name}), 409)["code"] == "conflict"
    assert client.get(f"/v1/kbs/{name}").json()["id"] == kb["id"]
    assert client.get(f"/v1/kbs/{kb['id']}").json()["name"] == name  # ids are stable refs too
    assert name in [k["name"] for k in client.get("/v1/kbs").json()["data"]]
    doc = client.post(f"/v1/kbs/{name}/documents", json={"title": "n", "text": NOTES}).json()
    assert client.get(f"/v1/kbs/{name}").json()["document_count"] == 1
    assert client.delete(f"/v1/kbs/{name}").status_code == 204
    assert error_of(client.get(f"/v1/kbs/{name}"), 404)["code"] == "not_found"
    error_of(client.get(f"/v1/kbs/{kb['id']}/documents/{doc['id']}"), 404)
    error_of(client.post(f"/v1/kbs/{name}/search", json={"query": "owls"}), 404)
    error_of(client.post("/v1/kbs", json={"name": "has space"}), 422)


def test_json_document_round_trip_with_citable_chunks(client: httpx.Client, kb: str) -> None:
    body = {"title": "Field notes", "text": NOTES, "media_type": "text/markdown",
            "metadata": {"lang": "en"}, "source": "notes.md"}  # fmt: skip
    r = client.post(f"/v1/kbs/{kb}/documents", json=body)
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["created"] is True and doc["metadata"] == {"lang": "en"}
    again = client.post(f"/v1/kbs/{kb}/documents", json=body)
    assert again.status_code == 200 and again.json()["id"] == doc["id"]
    assert again.json()["created"] is False
    detail = client.get(f"/v1/kbs/{kb}/documents/{doc['id']}", params={"include_chunks": True})
    full = detail.json()
    assert full["text"] == NOTES
    assert [c["heading"] for c in full["chunks"]] == ["Field notes", "Owls"]
    for chunk in full["chunks"]:
        assert full["text"][chunk["start"] : chunk["end"]] == chunk["text"]

    found = client.post(
        f"/v1/kbs/{kb}/search", json={"query": "how do owls hunt", "top_k": 1}
    ).json()["results"]
    hit = found[0]
    assert set(hit) == {"chunk_id", "document_id", "title", "heading", "text", "start", "end",
                        "score"}  # fmt: skip
    assert hit["document_id"] == doc["id"] and hit["heading"] == "Owls"
    assert hit["title"] == "Field notes" and "Barn owls" in hit["text"]
    assert NOTES[hit["start"] : hit["end"]] == hit["text"]
    filtered = client.post(f"/v1/kbs/{kb}/search", json={"query": "owls", "filter": {"lang": "de"}})
    assert filtered.json()["results"] == []

    assert client.delete(f"/v1/kbs/{kb}/documents/{doc['id']}").status_code == 204
    error_of(client.get(f"/v1/kbs/{kb}/documents/{doc['id']}"), 404)
    error_of(client.delete(f"/v1/kbs/{kb}/documents/{doc['id']}"), 404)
    assert client.post(f"/v1/kbs/{kb}/search", json={"query": "owls"}).json()["results"] == []


@pytest.mark.parametrize(
    ("name", "data", "heading"),
    [
        ("owls.txt", b"Barn owls hunt by sound alone in total darkness.", None),
        ("owls.md", b"# Owls\n\nBarn owls hunt by sound alone in total darkness.", "Owls"),
        ("owls.html", b"<h2>Owls</h2><p>Barn owls hunt by <i>sound</i> alone.</p>", "Owls"),
        ("owls.pdf", make_pdf("Barn owls hunt by sound alone in total darkness."), "page 1"),
    ],
)
def test_file_uploads_of_each_supported_type(
    client: httpx.Client, kb: str, name: str, data: bytes, heading: str | None
) -> None:
    r = upload(client, kb, name, data, metadata='{"kind": "bird"}')
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["source"] == name and doc["metadata"] == {"kind": "bird"}
    hits = client.post(
        f"/v1/kbs/{kb}/search", json={"query": "owl hunting by sound", "filter": {"kind": "bird"}}
    ).json()["results"]
    assert hits[0]["document_id"] == doc["id"] and hits[0]["heading"] == heading
    assert "owls hunt by" in hits[0]["text"]


def test_reupload_of_the_same_file_replaces_it(client: httpx.Client, kb: str) -> None:
    first = upload(client, kb, "guide.md", b"# Guide\n\nVersion one says turn left.").json()
    second = upload(client, kb, "guide.md", b"# Guide\n\nVersion two says turn right.").json()
    assert second["created"] and second["replaced_document_id"] == first["id"]
    listing = client.get(f"/v1/kbs/{kb}/documents").json()
    assert [d["id"] for d in listing["data"]] == [second["id"]]
    error_of(client.get(f"/v1/kbs/{kb}/documents/{first['id']}"), 404)
    hits = client.post(f"/v1/kbs/{kb}/search", json={"query": "which way to turn"}).json()
    assert [h["document_id"] for h in hits["results"]] == [second["id"]]


def test_documents_are_paginated(client: httpx.Client, kb: str) -> None:
    ids = [
        client.post(
            f"/v1/kbs/{kb}/documents", json={"title": f"d{i}", "text": f"Note number {i}."}
        ).json()["id"]
        for i in range(5)
    ]
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = client.get(f"/v1/kbs/{kb}/documents", params={"limit": 2, "offset": offset})
        body = page.json()
        assert body["total"] == 5 and len(body["data"]) <= 2
        seen += [d["id"] for d in body["data"]]
        offset = body["next_offset"]
    assert seen == ids
    error_of(client.get(f"/v1/kbs/{kb}/documents", params={"limit": 0}), 422)


def test_bad_input_is_refused_with_the_reason(client: httpx.Client, kb: str) -> None:
    docs = f"/v1/kbs/{kb}/documents"
    assert "text" in error_of(client.post(docs, json={"title": "t", "text": ""}), 422)["message"]
    assert (
        "empty" in error_of(client.post(docs, json={"title": "t", "text": "  \n"}), 422)["message"]
    )
    assert error_of(upload(client, kb, "empty.txt", b"  \n\n "), 422)["message"].endswith(
        "contains no text"
    )
    assert error_of(upload(client, kb, "a.docx", b"PK\x03\x04"), 415)["code"] == (
        "unsupported_media_type"
    )
    error_of(upload(client, kb, "pic", b"\x89PNG", "image/png"), 415)
    error_of(client.post(docs, content=b"hello", headers={"content-type": "text/csv"}), 415)
    bad_utf8 = error_of(upload(client, kb, "latin1.txt", "café crème".encode("latin-1")), 422)
    assert "not valid UTF-8" in bad_utf8["message"] and "0xe9" in bad_utf8["message"]
    no_text = error_of(upload(client, kb, "scan.pdf", blank_pdf()), 422)
    assert "PDF has no extractable text" in no_text["message"]
    error_of(upload(client, kb, "x.txt", b"ok", metadata="[1, 2]"), 422)
    error_of(client.post("/v1/kbs/no-such-kb/documents", json={"title": "t", "text": "x"}), 404)
    error_of(client.get(f"/v1/kbs/{kb}/documents/{'0' * 32}"), 404)
    error_of(client.post(f"/v1/kbs/{kb}/search", json={"query": "  "}), 422)
    assert client.get(f"/v1/kbs/{kb}").json()["document_count"] == 0


def test_uploads_over_the_size_limit_are_refused(client: httpx.Client, kb: str) -> None:
    big = b"word " * (UPLOAD_LIMIT // 5 + 100)
    assert error_of(upload(client, kb, "big.txt", big), 413)["code"] == "payload_too_large"
    big_json = {"title": "t", "text": big.decode()}
    error_of(client.post(f"/v1/kbs/{kb}/documents", json=big_json), 413)

    # A chunked body has no Content-Length: the limit is counted while reading.
    def chunks() -> Any:
        yield b'{"title": "t", "text": "'
        for _ in range(UPLOAD_LIMIT // 1024 + 2):
            yield b"a" * 1024
        yield b'"}'

    streamed = client.post(
        f"/v1/kbs/{kb}/documents", content=chunks(), headers={"content-type": "application/json"}
    )
    error_of(streamed, 413)
    ok = upload(client, kb, "small.txt", b"word " * 100)
    assert ok.status_code == 201
    assert client.get(f"/v1/kbs/{kb}").json()["document_count"] == 1


def test_concurrent_uploads_of_the_same_document_make_one(client: httpx.Client, kb: str) -> None:
    data = ("Swifts sleep on the wing. " * 40).encode()

    def send(_: int) -> httpx.Response:
        return upload(client, kb, "swifts.txt", data)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(send, range(6)))
    assert all(r.status_code in (200, 201) for r in responses), [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.json()["created"] for r in responses) == 1
    listing = client.get(f"/v1/kbs/{kb}/documents").json()
    assert listing["total"] == 1


def test_the_sample_kb_holds_the_project_docs(client: httpx.Client) -> None:
    expected = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "docs").rglob("*")
        if p.suffix in SUPPORTED_SUFFIXES
    }
    assert "docs/protocol.md" in expected
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        r = client.get("/v1/kbs/docs")
        if r.status_code == 200 and r.json()["document_count"] >= len(expected):
            break
        time.sleep(1)
    docs = client.get("/v1/kbs/docs/documents", params={"limit": 200}).json()["data"]
    assert {d["source"] for d in docs} == expected
    hits = client.post(
        "/v1/kbs/docs/search",
        json={"query": "server-sent events stream protocol", "mode": "dense"},  # cosine scores
    ).json()["results"]
    assert hits and hits[0]["score"] > 0.3
